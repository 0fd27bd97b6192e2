"""The known-target campaign on the H200 through the device tool (issue 27), one call at a time.

  known_target_device.py start BUDGET_S [--build-args "known_target.py args"] [known_target_run.py args]
      build /tmp/site (SGLang payload) and /tmp/snk (Snakemake), copy this tree to /tmp/repo, build the
      full-shape model at /tmp/kt-model (~20 s, 2.7 GB on disk), start known_target_run.py --mode sglang
      detached (its own session: it outlives the call), wait, collect
  known_target_device.py wait BUDGET_S
      wait for its ``target:`` line (or a traceback), collect
Collect: run log, designed.json, measured JSON, Snakemake log, the run's logs/ (server logs, tgz) to $OUT.
Payload staging is live.sh's (``bash bench/gpu/live.sh stage`` per part; README: "Known-answer target").
DRY=1 rehearses the same sequence here against regen's simulated server in chain mode (tiny model).
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DRY = os.environ.get("DRY") == "1"
TMP = Path(os.environ.get("KT_TMP", "/tmp"))
LOG = TMP / "kt.log"
WORK = TMP / "kt-work"
MODEL = TMP / "kt-model"
PY = os.environ.get("PY", sys.executable)


def sh(cmd: str) -> int:
    print("+", cmd, flush=True)
    return subprocess.run(cmd, shell=True, cwd=REPO).returncode


def env() -> dict[str, str]:
    paths = [str(TMP / "repo")] if DRY else [str(TMP / "site"), str(TMP / "snk"), str(TMP / "repo")]
    return {
        **os.environ,
        "PYTHONPATH": ":".join(paths),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "PYTHONUNBUFFERED": "1",
        # the MTP draft worker imports deep_gemm (not in the payload): a stand-in, JIT off (notes/gpu-mtp.md)
        "SGLANG_ENABLE_JIT_DEEPGEMM": "0",
    }


def setup() -> None:
    if sh("bash bench/gpu/stage.sh") or sh("bash bench/gpu/setup.sh"):
        raise SystemExit("payload setup failed")
    parts = sorted(glob.glob("/tmp/whl/snk.tar.xz.a?"))
    if len(parts) == 2 and not (TMP / "snk").is_dir():
        (TMP / "snk").mkdir()
        data = b"".join(Path(p).read_bytes() for p in parts)
        import io

        with tarfile.open(fileobj=io.BytesIO(data), mode="r:xz") as tar:
            tar.extractall(TMP / "snk")
    stand_in = TMP / "site" / "deep_gemm"
    if not stand_in.exists():
        stand_in.mkdir(parents=True)
        (stand_in / "__init__.py").write_text(
            "# stand-in: SGLang's DSA backend imports deep_gemm at capture\n"
        )
    # SGLang 0.5.17 builds flashinfer's sampling kernels on the first top-k/top-p request (~110 s on a fresh
    # machine): build them on the CPU now, while the model is written and the server starts (live.sh)
    prewarm = (
        "import time; t = time.time()\n"
        "from flashinfer.jit.sampling import gen_sampling_module\n"
        "spec = gen_sampling_module(); spec.build(verbose=False)\n"
        "print('flashinfer sampling module built in', round(time.time() - t, 1), 's')"
    )
    with open(TMP / "fi-prewarm.log", "w") as fh:
        subprocess.Popen(
            [PY, "-c", prewarm],
            env={**env(), "CUDA_VISIBLE_DEVICES": "", "FLASHINFER_CUDA_ARCH_LIST": "9.0"},
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def start(budget: float, args: list[str]) -> None:
    build_args: list[str] = []
    if "--build-args" in args:  # the chain's knobs for known_target.py, as one string
        i = args.index("--build-args")
        build_args = args[i + 1].split()
        args = args[:i] + args[i + 2 :]
    if not DRY:
        setup()
    shutil.rmtree(TMP / "repo", ignore_errors=True)
    shutil.copytree(
        REPO, TMP / "repo", ignore=shutil.ignore_patterns(".git", ".gpu", ".gpurun", ".venv*", ".snk")
    )
    if not (MODEL / "chain.json").exists():
        tiny = ["--tiny"] if DRY else []
        builder = [PY, str(TMP / "repo/bench/gpu/known_target.py"), str(MODEL), *tiny, *build_args]
        if subprocess.run(builder, env=env()).returncode:
            raise SystemExit("model build failed")
    mode = "simulated" if DRY else "sglang"
    cmd = [PY, "bench/gpu/known_target_run.py", "--model", str(MODEL), "--work", str(WORK), "--mode", mode]
    with open(LOG, "w") as fh:
        subprocess.Popen(
            [*cmd, *args],
            cwd=TMP / "repo",
            env=env(),
            stdout=fh,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )


def wait(t0: float, budget: float) -> None:
    while time.time() - t0 < budget:
        text = LOG.read_text() if LOG.exists() else ""
        if "\ntarget: " in text or "Traceback" in text or ("workflow rc=" in text and "rc=0" not in text):
            break
        time.sleep(5)
    text = LOG.read_text() if LOG.exists() else "(no log)"
    print("\n".join(text.splitlines()[-40:]))


def collect() -> None:
    out = Path(os.environ.get("OUT", TMP / "kt-collected"))
    out.mkdir(parents=True, exist_ok=True)
    measured = (WORK / "known_target_measured.json", WORK / "known_target_measured.md")
    for f in (LOG, MODEL / "designed.json", *measured, WORK / "snakemake.log"):
        if f.exists():
            shutil.copy(f, out / f.name)
    for f in (TMP / "fi-prewarm.log", WORK / "config.yaml"):
        if f.exists():
            shutil.copy(f, out / f.name)
    logs = WORK / "run" / "logs"
    if logs.is_dir():
        with tarfile.open(out / "runlogs.tgz", "w:gz") as tar:
            tar.add(logs, arcname="logs")
    for f in (WORK / "run" / "results" / "reaudit" / "summary.json", WORK / "run" / "results" / "READY.json"):
        if f.exists():
            shutil.copy(f, out / f"{f.parent.name}-{f.name}")
    print("collected:", sorted(p.name for p in out.iterdir()))


def main(argv: list[str]) -> int:
    t0 = time.time()
    mode, budget = argv[0], float(argv[1])
    if mode == "start":
        start(budget, argv[2:])
    elif mode != "wait":
        raise SystemExit(f"unknown mode {mode!r}: start | wait")
    wait(t0, budget)
    collect()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
