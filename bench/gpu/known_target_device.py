"""The known-target campaign on the H200 through the device tool (issue 27), one call at a time.

  known_target_device.py start BUDGET_S [--build-args "known_target.py args"] [--baselines default,seed]
                               [--default-concurrency 48] [--seed-concurrency 64] [known_target_run.py args]
      build /tmp/site (SGLang payload) and /tmp/snk (Snakemake), copy this tree to /tmp/repo, build the
      full-shape model at /tmp/kt-model (~20 s, 2.7 GB on disk), start the campaign's sequence detached
      (its own session: it outlives the call), wait up to BUDGET_S, collect
  known_target_device.py wait BUDGET_S
      wait until the sequence is done (or BUDGET_S), print its tail and results so far, collect
The sequence, each step's results written as it ends (regen first: the headline exists even if the
budget runs out): 1. known_target_run.py (regen's whole workflow, Snakemake start to end);
2. known_target_baselines.py --which default (SGLang's defaults, a plain client at concurrency 48);
3. --which seed (the original run's hand-tuned flags, MTP on, concurrency 64); 4. known_target_run.py
--measure-only with the baselines' wall times: the ``target:`` line; then ``campaign: done``.
Collect to $OUT (7 files, flat): kt.log, designed.json, known_target_measured.{json,md},
baseline-{default,seed}.json, kt-logs.tgz (Snakemake log, config, re-audit summary, READY, the run's
logs/ with its server log, the baselines' server logs, the sampling-kernel prewarm log).
Payload staging is live.sh's (``bash bench/gpu/live.sh stage`` per part; README: "Known-answer target").
DRY=1 rehearses the same sequence here against regen's simulated server in chain mode (tiny model).
"""

from __future__ import annotations

import argparse
import glob
import json
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
PID = TMP / "kt.pid"
PY = os.environ.get("PY", sys.executable)
DONE = "campaign: done"
#: lines of the log that wait() always shows, wherever they are
KEY_LINES = ("=== step", "workflow rc=", "regen phases:", "baseline: ", "target: ", DONE)
TGZ_MEMBER_CAP = 6 * 2**20  # a bigger log travels as its last 6 MiB (the device returns files <= 16 MiB)


#: the sequence's Popen when this process started it (its pid is a zombie here until polled)
STARTED: list[subprocess.Popen[bytes]] = []


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
        builder = [PY, "-m", "bench.gpu.known_target", str(MODEL), *tiny, *build_args]  # on env()'s path
        if subprocess.run(builder, env=env()).returncode:
            raise SystemExit("model build failed")
    shutil.rmtree(WORK, ignore_errors=True)  # results of an earlier sequence must not pass for this one's
    with open(LOG, "w") as fh:
        proc = subprocess.Popen(
            [PY, "-m", "bench.gpu.known_target_device", "sequence", *args],
            cwd=TMP / "repo",
            env=env(),
            stdout=fh,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    PID.write_text(str(proc.pid))
    STARTED.append(proc)


def sequence_alive() -> bool:
    if STARTED:
        return STARTED[0].poll() is None
    try:
        os.kill(int(PID.read_text()), 0)
        return True
    except (OSError, ValueError):
        return False


def step(title: str, cmd: list[str]) -> int:
    """One step of the sequence, its output into this process's log; its rc (the sequence goes on)."""
    print(f"=== step {title} ({time.strftime('%H:%M:%S')}): {' '.join(cmd)}", flush=True)
    t = time.time()
    rc = subprocess.run(cmd, stdin=subprocess.DEVNULL).returncode
    print(f"=== step {title}: rc={rc} in {time.time() - t:.0f} s", flush=True)
    return rc


def sequence(args: list[str]) -> None:
    """regen's workflow, then each baseline, then the target line with the baselines' wall times."""
    p = argparse.ArgumentParser(prog="known_target_device.py sequence")
    p.add_argument("--baselines", default="default,seed")
    p.add_argument("--default-concurrency", type=int, default=48)
    p.add_argument("--seed-concurrency", type=int, default=64)
    p.add_argument("--skip-regen", action="store_true", help="baselines only (no workflow, no target line)")
    own, run_args = p.parse_known_args(args)
    shared = argparse.ArgumentParser(add_help=False)  # what the baselines share with the regen run
    shared.add_argument("--n", default="2000")
    shared.add_argument("--max-tokens", default="4096")
    shared.add_argument("--tools-fraction", default="0.3")
    shared.add_argument("--sim-token-rate", default="20000")
    same, _ = shared.parse_known_args(run_args)
    mode = "simulated" if DRY else "sglang"
    run = [PY, "-m", "bench.gpu.known_target_run", "--model", str(MODEL), "--work", str(WORK), "--mode", mode]
    if not own.skip_regen:
        step("regen", [*run, *run_args])
    walls: dict[str, float] = {}
    for which in [w for w in own.baselines.split(",") if w]:
        concurrency = {"default": own.default_concurrency, "seed": own.seed_concurrency}.get(which)
        cmd = [PY, "-m", "bench.gpu.known_target_baselines", "--model", str(MODEL), "--work", str(WORK)]
        cmd += ["--which", which, "--n", same.n, "--max-tokens", same.max_tokens]
        cmd += ["--tools-fraction", same.tools_fraction]
        cmd += ["--concurrency", str(concurrency)] if concurrency else []
        cmd += ["--stop-first", str(WORK / "run")]
        cmd += ["--dry-cpu", "--sim-token-rate", same.sim_token_rate] if DRY else []
        step(f"baseline {which}", cmd)
        result = WORK / f"baseline-{which}.json"
        if result.exists() and "wall_s" in (done := json.loads(result.read_text())):
            walls[which] = done["wall_s"]
    fill = [f"--{w}-wall-s={walls[w]}" for w in ("default", "seed") if w in walls]
    if not own.skip_regen:
        step("target", [*run, *run_args, "--measure-only", *fill])
    print(DONE, flush=True)


def wait(t0: float, budget: float) -> None:
    time.sleep(2)
    while time.time() - t0 < budget:
        text = LOG.read_text() if LOG.exists() else ""
        if DONE in text or not sequence_alive():
            break
        time.sleep(5)
    text = LOG.read_text() if LOG.exists() else "(no log)"
    lines = text.splitlines()
    print("\n".join(lines[-40:]))
    print("--- key lines so far ---")
    print("\n".join(line for line in lines if line.startswith(KEY_LINES)))
    state = "done" if DONE in text else ("running" if sequence_alive() else "ended without 'campaign: done'")
    print(f"--- sequence {state}; {time.time() - t0:.0f} s in this call ---")


def add_capped(tar: tarfile.TarFile, path: Path, arcname: str) -> None:
    """``path`` into ``tar``; a file over TGZ_MEMBER_CAP as its last TGZ_MEMBER_CAP bytes (``.tail``)."""
    import io

    if path.is_dir():
        for f in sorted(path.rglob("*")):
            if f.is_file():
                add_capped(tar, f, f"{arcname}/{f.relative_to(path)}")
        return
    size = path.stat().st_size
    if size <= TGZ_MEMBER_CAP:
        tar.add(path, arcname=arcname)
        return
    with open(path, "rb") as fh:
        fh.seek(size - TGZ_MEMBER_CAP)
        data = fh.read()
    info = tarfile.TarInfo(f"{arcname}.tail")
    info.size = len(data)
    info.mtime = int(path.stat().st_mtime)
    tar.addfile(info, io.BytesIO(data))


def collect() -> None:
    """At most 8 flat files to $OUT: the results, and every log bundled in kt-logs.tgz."""
    out = Path(os.environ.get("OUT", TMP / "kt-collected"))
    out.mkdir(parents=True, exist_ok=True)
    flat = [
        LOG,
        MODEL / "designed.json",
        WORK / "known_target_measured.json",
        WORK / "known_target_measured.md",
    ]
    flat += sorted(WORK.glob("baseline-*.json"))
    for f in flat:
        if f.exists():
            shutil.copy(f, out / f.name)
    run = WORK / "run"
    bundle = [
        (WORK / "snakemake.log", "snakemake.log"),
        (WORK / "config.yaml", "config.yaml"),
        (TMP / "fi-prewarm.log", "fi-prewarm.log"),
        (run / "results" / "reaudit" / "summary.json", "reaudit-summary.json"),
        (run / "results" / "READY.json", "READY.json"),
        (run / "logs", "run-logs"),
        *((d / "logs", f"{d.name}-logs") for d in sorted(WORK.glob("baseline-*")) if d.is_dir()),
    ]
    with tarfile.open(out / "kt-logs.tgz", "w:gz") as tar:
        for path, arcname in bundle:
            if path.exists():
                add_capped(tar, path, arcname)
    sizes = {p.name: p.stat().st_size for p in sorted(out.iterdir())}
    print("collected:", ", ".join(f"{k} ({v / 2**20:.2f} MiB)" for k, v in sizes.items()))
    if len(sizes) > 8 or max(sizes.values(), default=0) > 16 * 2**20:
        print("WARNING: more than 8 files or one over 16 MiB in $OUT: the device tool leaves some out")


def main(argv: list[str]) -> int:
    t0 = time.time()
    mode = argv[0]
    if mode == "sequence":  # the detached campaign itself (start runs it)
        sequence(argv[1:])
        return 0
    budget = float(argv[1])
    if mode == "start":
        start(budget, argv[2:])
    elif mode != "wait":
        raise SystemExit(f"unknown mode {mode!r}: start | wait | sequence")
    wait(t0, budget)
    collect()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
