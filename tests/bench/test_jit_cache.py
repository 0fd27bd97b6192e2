"""bench/gpu/jit_cache.sh: SGLang's one-time builds saved at the end of a GPU run and restored at the next
machine's first call, where the caches' own code looks for them (run here with a stand-in HOME)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
from pathlib import Path

from bench.gpu.harness import REPO

SCRIPT = REPO / "bench" / "gpu" / "jit_cache.sh"


def run(mode: str, *args: str, home: Path, cwd: Path, limit: int | None = None) -> str:
    env = dict(os.environ, HOME=str(home))
    if limit is not None:
        env["JIT_CACHE_LIMIT"] = str(limit)
    argv = ["bash", str(SCRIPT), mode, *args]
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_saved_cache_comes_back_where_it_was_on_the_next_machine(tmp_path: Path) -> None:
    home = tmp_path / "home"
    kernel = home / ".cache" / "flashinfer" / "90" / "sampling.so"
    triton = home / ".triton" / "cache" / "abc" / "fused_moe.cubin"
    for path, data in ((kernel, b"\x7fELF sampling"), (triton, b"cubin")):
        path.parent.mkdir(parents=True)
        path.write_bytes(data)
    out = tmp_path / "out"
    said = run("save", str(out), home=home, cwd=tmp_path)
    assert "saved" in said and (out / "jit-cache.tgz").exists()
    assert ".cache/flashinfer" in (out / "jit-cache-du.txt").read_text()
    with tarfile.open(out / "jit-cache.tgz") as tar:  # absolute paths, less the leading /
        assert str(kernel).lstrip("/") in tar.getnames()
    shutil.rmtree(home)  # the next machine: bare; the archive carried as .gpu/jit/
    repo = tmp_path / "repo"
    (repo / ".gpu" / "jit").mkdir(parents=True)
    shutil.copy(out / "jit-cache.tgz", repo / ".gpu" / "jit" / "jit-cache.tgz")
    assert "restored" in run("restore", home=home, cwd=repo)
    assert kernel.read_bytes() == b"\x7fELF sampling" and triton.read_bytes() == b"cubin"


def test_a_cache_over_what_a_returned_file_may_take_is_listed_not_returned(tmp_path: Path) -> None:
    home = tmp_path / "home"
    big = home / ".cache" / "flashinfer" / "big.so"
    big.parent.mkdir(parents=True)
    big.write_bytes(os.urandom(64 * 1024))
    out = tmp_path / "out"
    said = run("save", str(out), home=home, cwd=tmp_path, limit=16 * 1024)
    assert "not returned" in said and not (out / "jit-cache.tgz").exists()
    assert "flashinfer" in (out / "jit-cache-du.txt").read_text()


def test_without_a_carried_cache_restore_does_nothing(tmp_path: Path) -> None:
    assert run("restore", home=tmp_path / "home", cwd=tmp_path) == ""
