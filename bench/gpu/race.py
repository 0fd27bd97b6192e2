"""The race users run (issue 57): regen end to end against SGLang's defaults offered the whole load.

Every arm gets the same fixed work: ``--requests`` one-turn prompts of ``--prompt-tokens`` words (one token
each with the WordLevel tokenizer :func:`race_model` writes beside a real config), answers with a per-request
length drawn log-normal (``--median``/``--mean``, cap ``--cap``, fixed seed: request i has the same length
in every arm), ``ignore_eos``, the same sampling (temperature 0.6, top-p 0.95, top-k 20). Wall time runs from
the launch of the arm's engine or server to its last answer.

Arms:

- ``offline``: SGLang's defaults given everything at once through its own offline engine
  (``sglang.Engine(...).generate(prompts)``), in its own process; no regen code in that arm.
- ``default-c256``, ``default-c<regen's>``, ``default-all``: one server started with SGLang's defaults
  (``launch_server``, nothing but the model and ``--load-format dummy``), a closed-loop client on
  ``/v1/chat/completions`` at 256 in flight, at regen's client concurrency, and with every request at once;
  each offer runs the whole workload, the radix cache flushed between them (the prompts repeat), and each
  arm's wall is the server's start plus its own generation.
- ``regen``: regen end to end: ``regen tune`` plans the server from the workload's audit summary, regen's
  ``acquire_server`` starts it, regen's client (``generate_shard``) sends the samples (each request's length
  set by ``bench.length_proxy`` in front of the server, the only thing between them).

``--completions N`` gives each prompt N answers (issue 57 item 4): the chat arms ask with OpenAI's ``n``, the
offline engine gets each prompt N times in a row, regen runs ``generate.sampling.n: N`` (its planner keeps the
radix cache on for it). Every row carries what the server's own ``Prefill batch`` lines say it computed and
read from the radix cache (``prefill``: ``#new-token``, ``#cached-token``); regen's also what its client read
from the answers' ``cached_tokens`` (``client_prefill``) and whether its plan kept the cache (``radix_kept``).

The ratio is regen's output tok/s (over its wall) against the best of the other arms. Each arm's server
log is kept (``logs/``) with its decode lines; the line also says how many 10-line windows of each were
steady (``bench.gpu.serverlog.steady_windows``), and the bound the servers allow (:class:`WallBound`:
``bound_ratio``, and ``bar=1.15`` where it allows 1.15x the best peer, else ``bar=bound``).

``--dry-cpu`` runs the server arms against regen's simulated server (the offline arm needs SGLang: ``na``).
Last line: ``race: model=... requests=... output_tokens=... <arm>_wall_s=... <arm>_tps=... best_peer=...
ratio=... generation_ratio=... bound_wall_s=... bound_ratio=... bar=...`` (``generation_ratio``: the
best peer's generation over regen's, their starts left out).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import AsyncIterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import aiohttp

from bench.gpu import serverlog
from bench.gpu.dense import Workload, wait_ready
from bench.gpu.harness import (
    BASE_ARGS,
    BOTH_ARMS_FLAGS,
    Timer,
    bar_of,
    bench_server_cfg,
    count_output_tokens,
    generate_dict,
    gpu_memory_mib,
)
from bench.gpu.planner_truth import (
    MODELS,
    Server,
    free_port,
    regen_tune,
    sglang_argv,
    simulated_argv,
    wait_gpu_free,
)
from bench.harness import add_campaign_args, add_smoke, log, parse_args, publish, result_line, write_json
from regen.types import Message, Sample

#: the sampling every arm sends (regen's client sends the config's; ``harness.generate_dict``)
SAMPLING = {"temperature": 0.6, "top_p": 0.95, "top_k": 20}
CHAT_PATH = "/v1/chat/completions"
#: SGLang's flag that turns its radix cache off (regen's plan for unique prompts)
RADIX_OFF = "--disable-radix-cache"
#: words ``t0 .. t<WORDS-1>`` are the tokenizer's ordinary ids; the ids above are the config's specials
FIRST_SPECIAL = 128000


@dataclass(frozen=True, slots=True)
class RaceWork:
    """The fixed workload: prompts and per-request answer lengths, the same for every arm."""

    requests: int
    prompt_tokens: int
    median: float
    mean: float
    cap: int
    #: answers per prompt (``--completions``): regen's ``generate.sampling.n``, the chat arms' ``n``, the
    #: offline engine's prompt given that many times in a row; each of a prompt's answers has its length
    completions: int = 1

    @property
    def lengths(self) -> Workload:
        return Workload(
            vocab=FIRST_SPECIAL,
            prompt_tokens=self.prompt_tokens,
            median=self.median,
            mean=self.mean,
            cap=self.cap,
        )

    def prompt(self, i: int) -> str:
        return " ".join(f"t{t}" for t in self.lengths.prompt_ids(i))

    def max_tokens(self, i: int) -> int:
        return self.lengths.max_new_tokens(i)

    def samples(self) -> list[Sample]:
        return [
            Sample(
                id=f"race-{i:06d}",
                messages=(Message("user", self.prompt(i)), Message("assistant", "t1")),
                source={"file": "race", "row": i, "format": "messages"},
            )
            for i in range(self.requests)
        ]

    def planned_output_tokens(self) -> int:
        return self.completions * sum(self.max_tokens(i) for i in range(self.requests))


# ------------------------------------------------------------------------------------ the model


def race_model(model: str, out: Path) -> Path:
    """``model``'s real config with a WordLevel tokenizer: word ``t<i>`` is id i, the ids from
    :data:`FIRST_SPECIAL` are named specials, and the chat template is the messages' contents, so a
    chat request and the offline engine's prompt are the same tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    config = json.loads((MODELS / model / "config.json").read_text())
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config, indent=1))
    vocab_size = int(config["vocab_size"])
    eos = config.get("eos_token_id")
    eos_id = int(eos[0] if isinstance(eos, list) else eos or FIRST_SPECIAL + 1)
    vocab = {f"t{i}": i for i in range(FIRST_SPECIAL)}
    specials = {i: f"<|special_{i}|>" for i in range(FIRST_SPECIAL, vocab_size)}
    vocab.update({name: i for i, name in specials.items()})
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    tok.add_special_tokens(list(specials.values()))
    tok.save(str(out / "tokenizer.json"))
    tok_cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        # an eos among the word ids (Nemotron-H's is 2) keeps its word's name
        "eos_token": specials.get(eos_id, f"t{eos_id}"),
        "pad_token": specials.get(eos_id, f"t{eos_id}"),
        "bos_token": None,
        "model_max_length": 131072,
        "chat_template": "{% for m in messages %}{{ m['content'] }} {% endfor %}",
        "clean_up_tokenization_spaces": False,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=1))
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": eos_id}))
    return out


# ------------------------------------------------------------------------------------ one offer


@dataclass(frozen=True, slots=True)
class Finished:
    """What one offer of the whole workload gave: its generation seconds and the answers' tokens."""

    generation_s: float
    output_tokens: int
    answers: int
    errors: int
    first_error: str | None


def chat_request(work: RaceWork, i: int, model: str) -> dict[str, Any]:
    """Prompt ``i``'s request; with several completions, one request with OpenAI's ``n`` (SGLang prefills
    the prompt once, then decodes ``n`` copies that read it from its radix cache)."""
    return {
        "model": model,
        "messages": [{"role": "user", "content": work.prompt(i)}],
        "max_tokens": work.max_tokens(i),
        "ignore_eos": True,
        **({"n": work.completions} if work.completions > 1 else {}),
        **SAMPLING,
    }


async def offer(url: str, work: RaceWork, in_flight: int, model: str) -> Finished:
    """Send the whole workload with at most ``in_flight`` requests open (a closed loop); a failed
    request is sent again once."""
    gate = asyncio.Semaphore(in_flight)
    tokens: list[int] = []
    answers: list[int] = []
    errors: list[str] = []
    timeout = aiohttp.ClientTimeout(total=None, sock_read=7200)
    t0 = time.monotonic()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as session:

        async def one(i: int) -> None:
            async with gate:
                for _attempt in range(2):
                    try:
                        async with session.post(url + CHAT_PATH, json=chat_request(work, i, model)) as resp:
                            body = await resp.json(content_type=None)
                            if resp.status != 200:
                                raise RuntimeError(f"HTTP {resp.status}: {str(body)[:200]}")
                        tokens.append(int(body["usage"]["completion_tokens"]))
                        answers.append(len(body["choices"]))
                        return
                    except (aiohttp.ClientError, RuntimeError, KeyError, ValueError) as exc:
                        errors.append(f"{type(exc).__name__}: {exc}"[:300])

        await asyncio.gather(*(one(i) for i in range(work.requests)))
    return Finished(
        round(time.monotonic() - t0, 2), sum(tokens), sum(answers), len(errors), errors[0] if errors else None
    )


async def flush_cache(url: str) -> int:
    """SGLang's ``/flush_cache`` (the next offer repeats the prompts); the HTTP status."""
    async with aiohttp.ClientSession() as session, session.post(url + "/flush_cache") as resp:
        return resp.status


def await_flush(url: str) -> None:
    """:func:`flush_cache` from synchronous code; a server that refuses fails the arm."""
    if (status := asyncio.run(flush_cache(url))) != 200:
        raise RuntimeError(f"/flush_cache answered HTTP {status}")


# ------------------------------------------------------------------------------------ arms


#: the defaults' offers ``--offers`` names: every request at once, regen's client concurrency, 256
OFFERS = ("all", "regen", "256")


@dataclass
class Settings:
    work: Path
    dry: bool
    model: str
    race: RaceWork
    ready_timeout_s: float = 900.0
    #: which of the defaults' offers run (:data:`OFFERS`)
    offers: tuple[str, ...] = OFFERS
    #: whether the offline engine's arm runs (``--no-offline``: a device session too short for it)
    offline: bool = True
    #: whether ``regen-wide`` runs after regen's own arm (``--no-wide``: a device session too short for it)
    wide: bool = True
    #: whether ``regen-nocache`` runs with n > 1 (``--no-nocache``: the prefill it saves already measured)
    nocache: bool = True
    #: whether regen's audit summary says how many prompts there are (``--size-unknown``: no, and regen plans
    #: as for a run of unknown size, its full plan: what serving that plan gains, at a size a device affords)
    size_known: bool = True
    #: flags every arm launches with (:data:`BOTH_ARMS_FLAGS`: Nemotron-H's Triton MoE runner)
    arm_flags: tuple[str, ...] = ()


def arm_row(name: str, start_s: float | None, done: Finished | None, log_text: str) -> dict[str, Any]:
    """An arm's row: its wall (start + generation), tok/s over that wall, the server log's reading."""
    row: dict[str, Any] = {"arm": name, "start_s": start_s}
    if done is not None:
        row.update(asdict(done))
        if start_s is not None:
            wall = start_s + done.generation_s
            row["wall_s"] = round(wall, 2)
            row["tps"] = round(done.output_tokens / wall, 1) if done.errors == 0 else None
    row.update(log_reading(log_text))
    row["prefill"] = serverlog.prefill_tokens(log_text)
    row["peaks"] = serverlog.peak_rates(log_text)
    return row


def log_reading(text: str) -> dict[str, Any]:
    """The median running count and decode rate of the server's own lines, and its steady windows."""
    lines = serverlog.decode_lines(text)
    if not lines:
        return {"decode_lines": 0}
    return {
        "decode_lines": len(lines),
        "median_running": statistics.median(ln.running for ln in lines),
        "max_running": max(ln.running for ln in lines),
        "median_log_tps": statistics.median(ln.gen_tps for ln in lines),
        "cuda_graph_share": round(sum(ln.cuda_graph for ln in lines) / len(lines), 3),
        "steady_windows": steady_windows(lines),
    }


def steady_windows(lines: list[serverlog.DecodeLine], size: int = 30) -> str:
    """``k/n`` windows of ``size`` consecutive decode lines that are steady by the benches' one rule
    (``serverlog.steady_window`` over ``serverlog.window_ends``)."""
    chunks = [lines[k : k + size] for k in range(0, len(lines) - size + 1, size)]
    return serverlog.steady_count([serverlog.window_ends(c) for c in chunks])


def default_server(s: Settings, model_dir: Path, name: str) -> Server:
    port = free_port()
    log_path = s.work / "logs" / f"{name}.log"
    if s.dry:
        options = {"max_total_num_tokens": 200_000}
        return Server(simulated_argv(port, log_path, options, 256, 400.0), log_path, port)
    # SGLang's defaults: the benches' launch line less --skip-tokenizer-init (chat needs the tokenizer)
    argv = [arg for arg in sglang_argv(model_dir, port, s.arm_flags) if arg != "--skip-tokenizer-init"]
    return Server(argv, log_path, port)


@contextlib.asynccontextmanager
async def serving_defaults(
    s: Settings, model_dir: Path, name: str
) -> AsyncIterator[tuple[Server, str, float]]:
    """A server with SGLang's defaults (:func:`default_server`), ready: it, its url and the seconds from
    launch to ready; stopped, and the GPU free again, on the way out."""
    server = default_server(s, model_dir, name).start()
    t = Timer()
    try:
        await wait_ready(server, s.ready_timeout_s)
        yield server, f"http://127.0.0.1:{server.port}", round(t(), 2)
    finally:
        server.stop()
        wait_gpu_free(s.dry)


async def default_arms(
    s: Settings, model_dir: Path, offers: dict[str, int], saved: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """One server with SGLang's defaults; each offer sends the whole workload (cache flushed between);
    after each, the rows so far (``saved`` and these) are saved."""
    rows: list[dict[str, Any]] = []
    try:
        async with serving_defaults(s, model_dir, "defaults") as (server, url, start_s):
            for name, in_flight in offers.items():
                mark = len(server.text())
                if rows and not s.dry:
                    await flush_cache(url)
                done = await offer(url, s.race, in_flight, str(model_dir))
                row = arm_row(name, start_s, done, server.text()[mark:])
                row["in_flight"] = in_flight
                rows.append(row)
                save_rows(s, saved + rows)
                log(f"{name}: {brief(row)}")
    except RuntimeError as exc:
        rows.append({"arm": "defaults", "error": str(exc)[-2000:]})
    return rows


def offline_arm(s: Settings, model_dir: Path) -> dict[str, Any]:
    """SGLang's offline engine with its defaults, every request at once, in its own process."""
    if s.dry:
        return {"arm": "offline", "skipped": "needs SGLang (dry run)"}
    result = s.work / "offline.json"
    given = s.work / "offline-input.json"
    given.write_text(json.dumps(offline_input(s.race, s.arm_flags)))
    log_path = s.work / "logs" / "offline.log"
    t = Timer()
    with log_path.open("wb") as fh:
        proc = subprocess.run(
            [sys.executable, "-m", "bench.gpu.race_offline", str(model_dir), str(given), str(result)],
            stdout=fh,
            stderr=subprocess.STDOUT,
            env=dict(os.environ, PYTHONUNBUFFERED="1"),
            timeout=3600,
        )
    wait_gpu_free(s.dry)
    text = log_path.read_text(errors="replace")
    if proc.returncode != 0 or not result.exists():
        return {
            "arm": "offline",
            "error": f"rc {proc.returncode}: {text[-1500:]}",
            "process_s": round(t(), 1),
        }
    got = json.loads(result.read_text())
    done = Finished(got["generation_s"], got["output_tokens"], got["answers"], 0, None)
    row = arm_row("offline", got["start_s"], done, text)
    row["process_s"] = round(t(), 1)
    return row


def offline_input(race: RaceWork, arm_flags: tuple[str, ...] = ()) -> dict[str, Any]:
    """The offline arm's workload: the same prompts, lengths and sampling as the chat arms send; a prompt
    with several completions given that many times in a row (SGLang 0.5.17's ``TokenizerManager`` warns that
    a large batch with ``n`` > 1 is slow, as it prefixes each prompt's cache one request at a time, and
    advises duplicating the requests instead)."""
    each = range(race.completions)
    return {
        "prompts": [race.prompt(i) for i in range(race.requests) for _ in each],
        "max_tokens": [race.max_tokens(i) for i in range(race.requests) for _ in each],
        "sampling": SAMPLING,
        "engine_args": engine_args(arm_flags),
    }


def engine_args(flags: tuple[str, ...]) -> dict[str, str]:
    """``--name value`` launch flags as ``sglang.Engine`` keywords (``name`` with ``_``), as ``ServerArgs``
    takes them."""
    names, values = flags[::2], flags[1::2]
    if len(names) != len(values) or not all(n.startswith("--") for n in names):
        raise ValueError(f"flags are not --name value pairs: {flags}")
    return {n[2:].replace("-", "_"): v for n, v in zip(names, values, strict=True)}


def regen_arm(s: Settings, model_dir: Path) -> tuple[list[dict[str, Any]], int | None]:
    """regen end to end: its plan (``regen tune``), its server start, its client at its own concurrency;
    then, on the same server, ``regen-wide``: its client at SGLang's running cap (a plan candidate, never
    a peer). With several completions a prompt and the radix cache kept, ``regen-nocache`` runs regen's plan
    for the user's flags plus ``--disable-radix-cache`` (kept by the planner, its memory planned without
    shared pages) on a server of its own (issue 57 item 4: the prefill the cache saved). Returns the rows
    and regen's client concurrency."""
    t = Timer()
    summary = s.work / "summary.json"
    summary.write_text(json.dumps(audit_summary(s.race, s.size_known)))
    configfile = s.work / "generate.json"  # the run's generate section: its n decides the radix cache
    configfile.write_text(json.dumps({"generate": {"sampling": regen_sampling(s.race)}}))
    planned = plan_regen(s, model_dir, (), s.work / "plan.json")
    if isinstance(planned, str):
        return [{"arm": "regen", "error": planned}], None
    launched, numbers = planned
    concurrency, cap = numbers["client_concurrency"], numbers["cap"]
    offers = {"regen": None, "regen-wide": int(cap) if s.wide and cap and cap != concurrency else None}
    rows = serve_regen(s, model_dir, launched, offers, numbers, t)
    if s.nocache and s.race.completions > 1 and RADIX_OFF not in launched.launch_args:
        t_off = Timer()
        off = plan_regen(s, model_dir, (RADIX_OFF,), s.work / "plan-nocache.json")
        if isinstance(off, str):
            rows.append({"arm": "regen-nocache", "error": off})
        else:
            rows += serve_regen(s, model_dir, off[0], {"regen-nocache": None}, off[1], t_off)
    return rows, int(concurrency) if concurrency else None


def plan_regen(
    s: Settings, model_dir: Path, flags: tuple[str, ...], plan_file: Path
) -> tuple[Any, dict] | str:
    """``regen tune`` for the race's workload under the user's flags (the config-only model's dummy weights,
    as every arm loads them, the model's own flags, and ``flags``): the plan file its server launches from
    and the plan's numbers, or why it refused. The plan file (--out) is what the workflow's servers launch
    from: its launch_args are the plan's flags (the --json print has none: the H100 races before
    2026-12-07 03:18 launched SGLang's defaults there)."""
    from regen.sglang.config import PlanFile

    tune_args = ("--audit-summary", str(s.work / "summary.json"), "--max-tokens", str(s.race.cap))
    tune_args += ("--out", str(plan_file), "--configfile", str(s.work / "generate.json"))
    user = (*BASE_ARGS, *s.arm_flags, *flags)
    plan = regen_tune(model_dir, user, *tune_args, gpu_mib=gpu_memory_mib(s.dry))
    if plan.refused or plan.plan is None:
        return f"regen tune refused: {plan.message}"
    if plan.message:  # what regen tune said on the console (a run too small for its plan says so)
        log(f"regen tune ({' '.join(flags) or 'the user flags'}): {plan.message}")
    numbers = {
        "plan_args": plan.plan.get("recommended"),
        "client_concurrency": plan.number("client_concurrency"),
        "cap": plan.number("effective_max_running_requests"),
    }
    return PlanFile.read(plan_file), numbers


def serve_regen(
    s: Settings,
    model_dir: Path,
    launched: Any,
    offers: dict[str, int | None],
    planned: dict[str, Any],
    t: Timer,
) -> list[dict[str, Any]]:
    """One server of ``launched`` (a ``PlanFile``) started by regen's ``acquire_server``, each offer (None:
    regen's own concurrency) run on it through regen's client, the cache flushed between them; stopped,
    and the GPU free again, on the way out. ``t`` started at the arm's start."""
    from regen.serving.lifecycle import acquire_server, stop_all_servers

    cap = planned.get("cap")
    sim = {"token_rate": 400.0, "max_running_requests": int(cap or 256), "startup_delay_s": 1.0}
    cfg = bench_server_cfg(
        model_dir,
        s.dry,
        args=[*BASE_ARGS, *s.arm_flags],
        use_tuner=True,
        port_base=free_port(),
        simulated=sim if s.dry else None,
    )
    servers, logs = s.work / "regen-servers", s.work / "regen-logs"
    first = next(iter(offers))
    rows: list[dict[str, Any]] = []
    try:
        started = log_size(logs / "gpu0.log")
        with acquire_server(cfg, launched, servers, logs, owner_pid=os.getpid()) as ep:
            start_s = round(t(), 2)
            if not s.dry:  # (the simulated server takes the plan as --options, not as SGLang's flags)
                missing = flags_not_launched(launched.launch_args, read_from(logs / "gpu0.log", started))
                if missing:
                    raise RuntimeError(f"the server was launched without the plan's {missing}")
            for name, in_flight in offers.items():
                if name != first and in_flight is None:
                    continue
                mark = log_size(logs / "gpu0.log")
                if rows and not s.dry:  # the offers repeat the prompts: none reads the last one's cache
                    await_flush(ep.url)
                done, cached = regen_client(s, ep, s.work / f"{name}-out", in_flight)
                text = read_from(logs / "gpu0.log", mark)
                row = {**planned, **arm_row(name, start_s, done, text), "in_flight": in_flight}
                rows.append(
                    row | {"client_prefill": cached, "radix_kept": RADIX_OFF not in launched.launch_args}
                )
                log(f"{name}: {brief(rows[-1])}")
    except Exception as exc:  # any failure is this arm's row; the peers still run
        rows.append({"arm": first, "error": "".join(traceback.format_exception(exc))[-3000:]})
        log(f"{first}: failed: {exc!r}")
    finally:
        stop_all_servers(servers, grace_s=60)
        wait_gpu_free(s.dry)
    return rows


def regen_client(s: Settings, ep: Any, out: Path, in_flight: int | None) -> tuple[Finished, dict[str, Any]]:
    """regen's client over the whole workload (``in_flight`` None: its own concurrency), each request's
    length set by the length proxy; with what its shard stats say SGLang read from the radix cache."""
    from bench.length_proxy import proxied
    from regen.generate.client import ShardJob, generate_shard
    from regen.records import record_id
    from regen.runconfig import GenerateConfig

    out.mkdir(parents=True, exist_ok=True)
    samples = s.race.samples()
    cfg = GenerateConfig.from_dict(
        dict(generate_dict(s.race.cap, in_flight), sampling=regen_sampling(s.race))
    )
    # each completion's request carries its record id (regen.records.record_id): every one of a prompt's
    # completions gets the prompt's length
    lengths = {
        record_id(x.id, v.name, k, plain=cfg.plain_ids): s.race.max_tokens(i)
        for i, x in enumerate(samples)
        for v in cfg.variants()
        for k in range(v.n)
    }
    t = Timer()
    with proxied(ep, lengths) as via:
        stats = generate_shard(
            ShardJob(
                samples=samples,
                journal=out / "journal.jsonl",
                records_out=out / "records.jsonl",
                failed_out=out / "failed.jsonl",
                cfg=cfg,
                endpoint=via,
                shard="00000",
            )
        )
    generation_s = round(t(), 2)
    answers, tokens, _ = count_output_tokens(out / "records.jsonl")
    done = Finished(generation_s, tokens, answers, int(getattr(stats, "failed", 0)), None)
    return done, stats.prefill.to_json()


def flags_not_launched(plan_args: Sequence[str], supervisor_log: str) -> list[str]:
    """The plan's flags and values missing from the command the supervisor logged starting (its first)."""
    started = next((line for line in supervisor_log.splitlines() if "starting server" in line), "")
    launched = set(started.split("): ", 1)[-1].split())
    return [a for a in plan_args if a not in launched]


def log_size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


def read_from(path: Path, offset: int) -> str:
    if not path.exists():
        return ""
    with path.open("rb") as fh:
        fh.seek(offset)
        return fh.read().decode(errors="replace")


def regen_sampling(race: RaceWork) -> dict[str, Any]:
    return {**SAMPLING, "max_tokens": race.cap, "n": race.completions, "seed": 0}


def audit_summary(race: RaceWork, size_known: bool = True) -> dict[str, Any]:
    """What the workflow's audit says of the race's prompts: their lengths, the answers' spread, and how many
    were read and kept (the planner weighs a run's size against what its plan adds at start, issue 57 item
    6; without the count, ``size_known`` False, it plans as for a run of unknown size)."""
    from bench.gpu.dense import audit_summary as dense_summary

    count = {"total": race.requests, "kept": race.requests} if size_known else {}
    return dense_summary(race.lengths) | count


# ------------------------------------------------------------------------------------ the race


def brief(row: dict[str, Any]) -> str:
    keys = ("wall_s", "tps", "start_s", "generation_s", "output_tokens", "errors", "median_running")
    return " ".join(f"{k}={row.get(k)}" for k in keys if k in row) or str(row)[:300]


def best_peer(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The fastest arm that is not regen's (by tok/s over its wall)."""
    peers = [r for r in rows if not str(r.get("arm")).startswith("regen") and r.get("tps")]
    return max(peers, key=lambda r: r["tps"]) if peers else None


@dataclass(frozen=True, slots=True)
class WallBound:
    """The shortest wall the race's work could take on this GPU by its servers' own lines: the fastest start
    of any arm, then each prompt computed once (the radix cache serving its other completions) at the
    highest prefill rate of any server (``serverlog.peak_rates``), and every answer token at the highest
    decode rate any server logged, or the longest answer at the fastest pace per token any request had,
    whichever is longer. No server overlaps prefill and decode for free or decodes at its peak from the
    first token to the last, so no plan of these servers beats it: where the best peer's wall is less than
    1.15x this, the bar is the bound (issue 57 item 2)."""

    start_s: float
    prefill_s: float
    decode_s: float
    tail_s: float

    @property
    def wall_s(self) -> float:
        return self.start_s + max(self.prefill_s + self.decode_s, self.tail_s)

    def fields(self, best_peer_wall_s: float | None) -> dict[str, Any]:
        """The race line's ``bound_*`` fields and ``bar``: ``1.15`` where the bound allows 1.15x the best
        peer, else ``bound``."""
        ratio = best_peer_wall_s / self.wall_s if best_peer_wall_s else None
        return {
            "bound_wall_s": round(self.wall_s, 1),
            "bound_start_s": round(self.start_s, 1),
            "bound_generation_s": round(self.wall_s - self.start_s, 1),
            "bound_ratio": f"{ratio:.3f}" if ratio else None,
            "bar": None if ratio is None else bar_of(ratio),
        }


def wall_bound(race: RaceWork, rows: list[dict[str, Any]]) -> WallBound | None:
    """:class:`WallBound` from the arms' rows (their start and their servers' ``peaks``); None where no arm
    started or no server logged a rate."""
    starts = [r["start_s"] for r in rows if r.get("start_s")]
    peaks = [r.get("peaks") or {} for r in rows]
    decode = max((p["peak_decode_tps"] for p in peaks if p.get("peak_decode_tps")), default=None)
    prefill = max((p["prefill_tps"] for p in peaks if p.get("prefill_tps")), default=None)
    pace_ms = min((p["fastest_token_ms"] for p in peaks if p.get("fastest_token_ms")), default=None)
    if not starts or decode is None or prefill is None or pace_ms is None:
        return None
    longest = max(race.max_tokens(i) for i in range(race.requests))
    return WallBound(
        start_s=min(starts),
        prefill_s=race.requests * race.prompt_tokens / prefill,
        decode_s=race.planned_output_tokens() / decode,
        tail_s=longest * pace_ms / 1000,
    )


def race_line(model: str, race: RaceWork, rows: list[dict[str, Any]], size_known: bool = True) -> str:
    fields: dict[str, Any] = {"model": model, "requests": race.requests, "size_known": size_known}
    fields["completions"] = race.completions
    fields["output_tokens"] = race.planned_output_tokens()
    for r in rows:
        key = str(r.get("arm", "?")).replace("-", "_")
        fields[f"{key}_wall_s"] = r.get("wall_s")
        fields[f"{key}_tps"] = r.get("tps")
        fields[f"{key}_steady"] = r.get("steady_windows")
    regen = next((r for r in rows if r.get("arm") == "regen"), {})
    best = best_peer(rows)
    fields["best_peer"] = best["arm"] if best else None
    # the prompt tokens each read from SGLang's radix cache, by the server's own Prefill lines
    fields["regen_cached_share"] = (regen.get("prefill") or {}).get("cached_share")
    fields["best_peer_cached_share"] = ((best or {}).get("prefill") or {}).get("cached_share")
    nocache = next((r for r in rows if r.get("arm") == "regen-nocache"), None)
    if nocache is not None:  # the prompt tokens regen's server computed, with its cache and without
        fields["regen_prefill_tokens"] = (regen.get("prefill") or {}).get("new_tokens")
        fields["regen_nocache_prefill_tokens"] = (nocache.get("prefill") or {}).get("new_tokens")
    ratio = regen.get("tps") / best["tps"] if best and regen.get("tps") else None
    fields["ratio"] = f"{ratio:.3f}" if ratio else None
    # the same without the starts (each arm's server start varies by 10-20 s on one host between runs)
    gen = best and regen.get("generation_s") and best.get("generation_s")
    fields["generation_ratio"] = f"{best['generation_s'] / regen['generation_s']:.3f}" if gen else None
    wide = next((r for r in rows if r.get("arm") == "regen-wide"), {})
    fields["wide_ratio"] = f"{wide['tps'] / best['tps']:.3f}" if best and wide.get("tps") else None
    if bound := wall_bound(race, rows):
        fields.update(bound.fields((best or {}).get("wall_s")))
    return result_line("race", **fields)


def run_race(s: Settings) -> list[dict[str, Any]]:
    """A warm-up (:func:`warm_up`), then regen (it plans the concurrency one default offer uses), then the
    defaults' offers from the widest down (the 256 one, the old baseline, last), then offline. The rows
    so far are saved after each step (``rows-so-far.json``) so a run cut short still leaves its evidence."""
    model_dir = race_model(s.model, s.work / "model")
    (s.work / "logs").mkdir(parents=True, exist_ok=True)
    log(f"warm-up: {asyncio.run(warm_up(s, model_dir))}")
    rows, concurrency = regen_arm(s, model_dir)
    save_rows(s, rows)
    if offers := default_offers(s.offers, s.race.requests, concurrency):
        rows.extend(asyncio.run(default_arms(s, model_dir, offers, saved=rows)))
        save_rows(s, rows)
    if s.offline:
        rows.append(offline_arm(s, model_dir))
        log(f"offline: {brief(rows[-1])}")
        save_rows(s, rows)
    return rows


#: the warm-up's requests: enough to run the sampling kernels the arms use
WARM_UP_REQUESTS = 16


async def warm_up(s: Settings, model_dir: Path) -> str:
    """A defaults server started and sent a few requests with the race's sampling, then stopped, before
    any arm: SGLang's one-time JIT builds on a fresh machine (on the H100, 2026-12-06: the first prefill
    graph capture 55 s against 8.6 s later, and the first sampled request 75 s) land here, not on
    whichever arm runs first. A user pays them once per machine with any tool."""
    async with serving_defaults(s, model_dir, "warm-up") as (_, url, ready_s):
        small = RaceWork(WARM_UP_REQUESTS, s.race.prompt_tokens, s.race.median, s.race.mean, s.race.cap)
        done = await offer(url, small, WARM_UP_REQUESTS, str(model_dir))
        return f"ready in {ready_s} s, {done.answers} answers in {done.generation_s} s"


def default_offers(names: tuple[str, ...], requests: int, concurrency: int | None) -> dict[str, int]:
    """The defaults' offers by name, widest first (a name regen's arm left without a concurrency, or equal
    to 256, is left out)."""
    offers: dict[str, int] = {}
    if "all" in names:
        offers["default-all"] = requests
    if "regen" in names and concurrency and concurrency != 256:
        offers[f"default-c{concurrency}"] = concurrency
    if "256" in names:
        offers["default-c256"] = 256
    return offers


def save_rows(s: Settings, rows: list[dict[str, Any]]) -> None:
    write_json(s.work / "rows-so-far.json", rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_campaign_args(p, work=Path("/tmp/race-work"))
    add_smoke(p, requests=60, prompt_tokens=16, median=12, mean=16, cap=64)
    p.add_argument("--model", default="llama-3.1-8b")
    p.add_argument("--requests", type=int, default=12_000)
    p.add_argument("--prompt-tokens", type=int, default=128)
    p.add_argument("--median", type=float, default=128)
    p.add_argument("--mean", type=float, default=160)
    p.add_argument("--cap", type=int, default=1024)
    p.add_argument("--completions", type=int, default=1, help="answers per prompt (issue 57 item 4: n = 4)")
    p.add_argument(
        "--offers",
        default=",".join(OFFERS),
        help=f"the defaults' offers, of {', '.join(OFFERS)} (empty: none, the offline engine the only peer)",
    )
    p.add_argument("--no-offline", action="store_true", help="leave the offline engine's arm out")
    p.add_argument("--no-wide", action="store_true", help="leave regen-wide (all at once, one server) out")
    p.add_argument("--no-nocache", action="store_true", help="leave regen-nocache (n > 1, cache off) out")
    p.add_argument(
        "--size-unknown",
        action="store_true",
        help="regen's audit summary without the prompt count: its full plan, not the small run's defaults",
    )
    args = parse_args(p, argv)
    if args.smoke:  # CI: the CPU rehearsal at tiny sizes, written to a temporary dir
        args.dry_cpu = True
        args.out = args.work = Path(tempfile.mkdtemp(prefix="race-smoke-"))
    race = RaceWork(args.requests, args.prompt_tokens, args.median, args.mean, args.cap, args.completions)
    offers = tuple(name for name in args.offers.split(",") if name)
    if unknown := set(offers) - set(OFFERS):
        p.error(f"--offers: unknown {sorted(unknown)}; known: {', '.join(OFFERS)}")
    s = Settings(
        work=args.work,
        dry=args.dry_cpu,
        model=args.model,
        race=race,
        offers=offers,
        offline=not args.no_offline,
        wide=not args.no_wide,
        nocache=not args.no_nocache,
        size_known=not args.size_unknown,
        arm_flags=() if args.dry_cpu else BOTH_ARMS_FLAGS.get(args.model, ()),
    )
    s.work.mkdir(parents=True, exist_ok=True)
    log(f"race: {args.model}, {race.requests} requests, {race.planned_output_tokens()} output tokens")
    rows = run_race(s)
    doc = {"date": dt.date.today().isoformat(), "model": args.model, "workload": asdict(race), "arms": rows}
    stem = f"race-{args.model}-{doc['date']}" + ("-dry" if s.dry else "")
    return publish(args.out, stem, doc, line=race_line(args.model, race, rows, s.size_known))


if __name__ == "__main__":
    sys.exit(main())
