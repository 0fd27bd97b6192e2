"""Snakemake (and boto3) for the GPU host: the pure-Python distributions that neither the host image
nor the SGLang payload has, taken from this venv (compiled extensions left out: SQLAlchemy and
immutables fall back to pure Python; greenlet is only for SQLAlchemy's asyncio), as
``OUT/a/snk.tar.xz.aa`` + ``OUT/b/snk.tar.xz.ab`` (two parts, to travel beside payload parts p01 and
p02). Run with the venv's python from the repo root.
"""

from __future__ import annotations

import importlib.metadata as md
import io
import re
import sys
import tarfile
from pathlib import Path

# on the GPU image (KINDS.md's list) or in the SGLang payload (pack.sh): not carried
PRESENT = {
    *("aiohttp", "attrs", "certifi", "charset-normalizer", "click", "idna", "jinja2", "markupsafe", "numpy"),
    *("packaging", "pandas", "psutil", "pyarrow", "pyyaml", "requests", "tabulate", "urllib3", "wrapt"),
    *("python-dateutil", "six", "typing-extensions", "annotated-types", "jsonschema"),
    *("jsonschema-specifications", "referencing", "rpds-py", "pydantic", "pydantic-core"),
    *("typing-inspection", "orjson", "tokenizers", "greenlet", "matplotlib"),
}


KEEP_AWS = {"s3", "sts"}


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def closure(roots: list[str]) -> list[md.Distribution]:
    seen: set[str] = set()
    out = []
    todo = list(roots)
    while todo:
        name = todo.pop()
        if norm(name) in seen:
            continue
        seen.add(norm(name))
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            continue
        if norm(name) not in PRESENT:
            out.append(dist)
        for req in dist.requires or []:
            if "extra ==" not in req:
                todo.append(re.split(r"[ ;<>=!\[~(]", req)[0])
    return out


def main(out_dir: str) -> int:
    dists = closure(
        ["snakemake", "fastjsonschema", "boto3"]
    )  # boto3: regen.generate.generation's S3 journal sink
    buf = io.BytesIO()
    n = 0
    with tarfile.open(fileobj=buf, mode="w:xz", preset=6) as tar:
        for dist in dists:
            for f in dist.files or []:
                path = Path(str(dist.locate_file(f)))
                s = str(f)
                skip = s.startswith(("..", "pulp/solverdir/")) or "__pycache__" in s  # CBC: greedy scheduler
                # botocore's service models: S3 (regen.storage) and STS only
                parts = s.split("/")
                skip = skip or (
                    parts[:2] == ["botocore", "data"] and len(parts) > 3 and parts[2] not in KEEP_AWS
                )
                if skip or s.endswith((".so", ".pyc")) or not path.is_file():
                    continue
                tar.add(path, arcname=s)
                n += 1
    data = buf.getvalue()
    half = len(data) // 2 + 1
    for sub, suffix, chunk in (("a", "aa", data[:half]), ("b", "ab", data[half:])):
        d = Path(out_dir, sub)
        d.mkdir(parents=True, exist_ok=True)
        (d / f"snk.tar.xz.{suffix}").write_bytes(chunk)
    names = ", ".join(f"{d.metadata['Name']} {d.version}" for d in dists)
    print(f"{n} files, {len(data) / 1e6:.1f} MB xz from {len(dists)} distributions: {names}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else ".snk"))
