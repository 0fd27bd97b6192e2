"""The known-target campaign on a GPU host through the device tool (issues 27 and 37), one call at a time.

  python -m bench.gpu.known_target device start BUDGET_S [--build-args "model args"] [sequence args]
      stage the payload (/tmp/site, /tmp/snk), copy this tree to /tmp/repo, build the model at
      /tmp/kt-model, start the sequence detached (it outlives the call), wait up to BUDGET_S, collect
  python -m bench.gpu.known_target device wait BUDGET_S
      wait until the sequence is done (or BUDGET_S), print its tail and key lines, collect
The sequence (:func:`sequence`, its flags :func:`sequence_args`): a device-time estimate (:data:`PRIOR`),
an optional warm-up server, the runs of ``--order`` (``regen``: the run step with its sweep; any other
name the baselines step's ``--which``), the ``target:`` line, where_time_went over every run, then
``campaign: done``. Collect: at most 8 flat files to $OUT (:func:`collect`). DRY=1 rehearses it on the
CPU against regen's simulated server in chain mode. Commands, payload staging and measured budgets:
bench/gpu/README.md, "Known-answer target".
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
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
DRY = os.environ.get("DRY") == "1"
TMP = Path(os.environ.get("KT_TMP", "/tmp"))
LOG = TMP / "kt.log"
WORK = TMP / "kt-work"
MODEL = TMP / "kt-model"
PID = TMP / "kt.pid"
PY = os.environ.get("PY", sys.executable)
STEP = [PY, "-m", "bench.gpu.known_target"]  # + a step of the campaign
DONE = "campaign: done"
WHERE = "where_time_went.md"  # every run's time split (where_time_went.py --work), beside the results
#: lines of the log that wait() always shows, wherever they are
KEY_LINES = (
    "budget estimate:",
    "=== step",
    "sweep rc=",
    "workflow rc=",
    "regen phases:",
    "baseline: ",
    "target: ",
    "where: ",
    DONE,
)
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
        # bytecode now, as a pip install of Snakemake has it: otherwise the regen run's first Snakemake
        # compiles it inside its measured wall, a cost no user's install has (no baseline imports Snakemake)
        sh(f"{PY} -m compileall -q -j 0 {TMP / 'snk'} > /dev/null")
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
    if "--build-args" in args:  # the chain's knobs for the model step, as one string
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
        builder = [*STEP, "model", str(MODEL), *tiny, *build_args]  # on env()'s path
        if subprocess.run(builder, env=env()).returncode:
            raise SystemExit("model build failed")
    shutil.rmtree(WORK, ignore_errors=True)  # results of an earlier sequence must not pass for this one's
    with open(LOG, "w") as fh:
        proc = subprocess.Popen(
            [*STEP, "device", "sequence", *args],
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


@dataclass(frozen=True, slots=True)
class PriorRun:
    """One run's device seconds as measured on the H200 on 2026-12-01 and 2026-12-02 (1,000 prompts, design
    20 / 0.8 / 2048: measurements/known-target-2026-12-0{1,2}.*, where_time_went.py): a fixed part, and a
    generation part that grows with the prompts. An estimate for the budget, not a measurement."""

    start_s: float  # launch to ready (regen's and the later baselines': warm, after the warm-up server)
    other_s: float  # outside the server (regen's stages), ready to first request, the stop and GPU-free wait
    generation_s_per_1000: float

    def seconds(self, prompts: int) -> float:
        return self.start_s + self.other_s + self.generation_s_per_1000 * prompts / 1000


PRIOR = {
    "warmup": PriorRun(266.0, 13.0, 0.0),  # a fresh machine's cold start (the warm-up's, 2026-12-02)
    "default": PriorRun(127.0, 6.0, 357.0),  # 2026-12-02's start and generation
    "seed": PriorRun(131.0, 6.0, 211.0),  # 2026-12-01's (on 2026-12-02 it was ready in 146 s, then cut)
    # its warm start with SGLang's prefill graphs (where_time_went's 106 s); its stages around the server
    # as measured on 2026-12-02 at 800 prompts (before 24 s, after 16 s) and the stop and GPU-free wait
    "regen": PriorRun(106.0, 24.0 + 16.0 + 10.0, 197.5),
    "plan": PriorRun(150.0, 6.0, 197.5),
    "plan-noprefill": PriorRun(120.0, 6.0, 197.5),
}
#: what regen's stages import (``--sweep-first`` imports them before the prepare that regen's wall counts)
WARM_IMPORTS = "import pandas, pyarrow.parquet, tokenizers, jinja2, snakemake.api, regen.cli"
#: a sweep candidate past its server start: SGLang's warm-up, the pilot's ramp, the stop and GPU-free wait
SWEEP_OVERHEAD_S = 30.0
#: the pilot's drain after its window, a share of --seconds (regen.tune.pilot.DEFAULT_DRAIN_FRACTION; this
#: script runs before the payload's packages are importable)
SWEEP_DRAIN_FRACTION = 0.25


def sweep_device_s(sweep_args: str, first: bool = False) -> float:
    """Device seconds of ``regen tune --sweep SWEEP_ARGS``: each candidate (``--candidates``, and the given
    flags unless ``--no-given``: ``regen.tune.tune.candidates_from_recommendation``; MTP candidates not
    counted, the campaign passes ``--no-mtp``) a warm server start, ``--seconds`` and its drain
    (``--drain-seconds``) and :data:`SWEEP_OVERHEAD_S`; ``first``: its first server is the fresh
    machine's (a cold start)."""
    p = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    p.add_argument("--seconds", type=float, default=20.0)  # regen tune --sweep's own defaults
    p.add_argument("--candidates", type=int, default=2)
    p.add_argument("--no-given", action="store_true")
    p.add_argument("--drain-seconds", type=float, default=None)
    got = p.parse_known_args(sweep_args.split())[0]
    servers = got.candidates + (0 if got.no_given else 1)
    cold = PRIOR["warmup"].start_s - PRIOR["regen"].start_s if first else 0.0
    drain = got.seconds * SWEEP_DRAIN_FRACTION if got.drain_seconds is None else got.drain_seconds
    return cold + servers * (PRIOR["regen"].start_s + got.seconds + drain + SWEEP_OVERHEAD_S)


def budget_estimate(order: list[str], prompts: int, warmup: bool, sweep_s: float | None) -> dict:
    """Device seconds of the sequence by :data:`PRIOR` (plus ``sweep_s`` when regen runs a sweep)."""
    runs = (["warmup"] if warmup else []) + order
    each = {name: PRIOR[name].seconds(prompts) for name in runs}
    if sweep_s is not None and "regen" in order:
        each["sweep"] = sweep_s
    total = sum(each.values())
    per_prompt = sum(PRIOR[name].generation_s_per_1000 for name in runs) / 1000
    rounded = {k: round(v) for k, v in each.items()}
    return {"each_s": rounded, "total_s": round(total), "per_prompt_s": per_prompt}


def prompts_within(estimate: dict, prompts: int, budget_s: float) -> int:
    """The most prompts whose estimate fits ``budget_s`` (0 when the fixed parts alone do not)."""
    fixed = estimate["total_s"] - estimate["per_prompt_s"] * prompts
    return max(0, int((budget_s - fixed) / estimate["per_prompt_s"])) if estimate["per_prompt_s"] else prompts


def sequence_args(args: list[str]) -> tuple[argparse.Namespace, argparse.Namespace, list[str]]:
    """The sequence's own flags, the flags its runs share (``--n``, ...), and what goes on to
    known_target/run.py (all but the sequence's own). No abbreviations: ``--n`` is not ``--no-sweep``."""
    from bench.gpu.known_target.run import SWEEP_ARGS  # on the payload's path (not start's bare python)

    p = argparse.ArgumentParser(prog="python -m bench.gpu.known_target device sequence", allow_abbrev=False)
    p.add_argument("--order", default="default,regen,seed", help="regen and the baselines' --which")
    p.add_argument("--warmup", action="store_true", help="SGLang's defaults first, not counted")
    p.add_argument("--warmup-prompts", type=int, default=8)
    p.add_argument("--no-sweep", action="store_true", help="regen's run without regen tune --sweep before it")
    p.add_argument("--sweep-first", action="store_true", help="regen's sweep first: the warm-up")
    p.add_argument("--device-budget-s", type=float, default=22 * 60, help="for the estimate printed first")
    p.add_argument("--default-concurrency", type=int, default=48)
    p.add_argument("--seed-concurrency", type=int, default=64)
    own, run_args = p.parse_known_args(args)
    shared = argparse.ArgumentParser(add_help=False, allow_abbrev=False)  # the baselines share with regen
    shared.add_argument("--n", default="2000")
    shared.add_argument("--max-tokens", default="4096")
    shared.add_argument("--tools-fraction", default="0.3")
    shared.add_argument("--sim-token-rate", default="20000")
    shared.add_argument("--sweep-args", default=SWEEP_ARGS)  # run.py's
    same, _ = shared.parse_known_args(run_args)
    return own, same, run_args


def sequence(args: list[str]) -> None:
    """An optional warm-up server, the runs in ``--order`` (regen's workflow with its sweep first, and the
    baselines), then the target line with the baselines' wall times and every run's time split."""
    own, same, run_args = sequence_args(args)
    order = [w for w in own.order.split(",") if w]
    unknown = [w for w in order if w not in PRIOR or w == "warmup"]
    if unknown:
        raise SystemExit(f"--order: unknown run(s) {unknown}: one of {sorted(set(PRIOR) - {'warmup'})}")
    sweep = not own.no_sweep
    first = sweep and own.sweep_first and "regen" in order
    sweep_s = sweep_device_s(same.sweep_args, first) if sweep else None
    est = budget_estimate(order, int(same.n), own.warmup, sweep_s)
    fits = prompts_within(est, int(same.n), own.device_budget_s)
    print(
        f"budget estimate: {est['total_s']} s of device time for {same.n} prompts "
        f"({', '.join(f'{k} {v}' for k, v in est['each_s'].items())}; 2026-12-01's H200 walls, warm starts); "
        f"{own.device_budget_s:.0f} s fits --n {fits}",
        flush=True,
    )
    mode = "simulated" if DRY else "sglang"
    run = [*STEP, "run", "--model", str(MODEL), "--work", str(WORK), "--mode", mode]
    run_args = [*run_args, *(["--sweep"] if sweep else [])]
    baseline = [*STEP, "baselines", "--model", str(MODEL), "--work", str(WORK)]
    baseline += ["--max-tokens", same.max_tokens, "--tools-fraction", same.tools_fraction]
    baseline += ["--stop-first", str(WORK / "run")]  # a server regen's run left is stopped first
    baseline += ["--dry-cpu", "--sim-token-rate", same.sim_token_rate] if DRY else []
    if first:
        # the first Python of regen's stages would be the machine's: its imports read from a cold disk, in
        # the prepare that regen's wall counts (the warm-up server warmed them before)
        step("warm imports", [PY, "-c", WARM_IMPORTS])
        step("sweep (the warm-up)", [*run, *run_args, "--sweep-only"])
    if own.warmup:
        # short answers: the warm-up is for the start's caches (page cache, JIT kernels), not the decode
        step("warmup", [*baseline, "--which", "warmup", "--n", str(own.warmup_prompts), "--max-tokens", "64"])
    walls: dict[str, float] = {}
    for which in order:
        if which == "regen":
            step("regen", [*run, *run_args, *(["--after-sweep"] if first else [])])
            continue
        concurrency = {"default": own.default_concurrency, "seed": own.seed_concurrency}.get(which)
        cmd = [*baseline, "--which", which, "--n", same.n]
        cmd += ["--concurrency", str(concurrency)] if concurrency else []
        step(f"baseline {which}", cmd)
        result = WORK / f"baseline-{which}.json"
        if result.exists() and "wall_s" in (done := json.loads(result.read_text())):
            walls[which] = done["wall_s"]
    fill = [f"--{w}-wall-s={walls[w]}" for w in ("default", "seed") if w in walls]
    if "regen" in order:
        step("target", [*run, *run_args, "--measure-only", *fill])
    where = [PY, "-m", "bench.gpu.where_time_went", "--work", str(WORK), "--out", str(WORK / WHERE)]
    step("where time went", where)
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
    flat += [f for f in sorted(WORK.glob("baseline-*.json")) if f.name != "baseline-warmup.json"]
    flat += [WORK / WHERE]
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
        (WORK / "snakemake-prepare.log", "snakemake-prepare.log"),
        (WORK / "sweep.log", "sweep.log"),
        (run / "results" / "plan" / "pilot.json", "pilot.json"),
        (WORK / "baseline-warmup.json", "baseline-warmup.json"),
        (run / "logs", "run-logs"),
        # the sweep's candidates (regen.layout.RunLayout.sweep_dir): their server logs' decode lines are what
        # the projection's step line was fitted to
        *((d / "logs", f"sweep-{d.name}-logs") for d in sorted((run / "work" / "sweep").glob("cand*"))),
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
