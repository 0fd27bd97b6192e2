"""Security: loopback by default, no secret in any file regen writes, no path escape, no eval of config."""

from __future__ import annotations

import ast
import os
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from regen.generate.client import Endpoint, ShardJob, generate_shard
from regen.ingest.dataset import iter_samples
from regen.runconfig import GenerateConfig, ServerConfig
from regen.serving.base import ServerError
from regen.serving.lifecycle import acquire_server, stop_all_servers
from regen.serving.local_sglang import build_sglang_command
from regen.serving.ports import port_is_free
from regen.serving.simulated_mode import build_simulated_command
from regen.serving.slots import supervisor_argv
from regen.simulated.launcher import start_simulated_server
from regen.types import BadRow, Message, Sample

REPO = Path(__file__).resolve().parent.parent
API_KEY = "sk-regen-TEST-SECRET-4f9a1c"
AWS_SECRET = "aws-TEST-SECRET-9d8e7f6a5b"
PAYLOAD = "__import__('os').system('touch pwned')"


def free_port_base() -> int:
    for _ in range(200):
        base = random.randint(20000, 60000)
        if port_is_free("127.0.0.1", base):
            return base
    raise RuntimeError("no free port")


def listening_sockets() -> dict[int, str]:
    """port -> local address of every IPv4/IPv6 TCP socket in LISTEN state (from /proc/net)."""
    out: dict[int, str] = {}
    for name in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/net/{name}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local, state = fields[1], fields[3]
            if state != "0A":
                continue
            addr_hex, port_hex = local.split(":")
            if len(addr_hex) == 8:
                addr = ".".join(str(b) for b in reversed(bytes.fromhex(addr_hex)))
            else:
                addr = "::" if set(addr_hex) == {"0"} else addr_hex
            out[int(port_hex, 16)] = addr
    return out


@pytest.fixture
def servers(tmp_workdir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """A simulated-mode server config on a free port; every server stopped afterwards."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    cfg = {
        "mode": "simulated",
        "model_path": "demo-model",
        "gpus": 1,
        "port_base": free_port_base(),
        "startup_timeout_s": 20,
        "idle_timeout_s": 30,
        "simulated": {"token_rate": 0, "startup_delay_s": 0.1},
    }
    yield cfg
    stop_all_servers(tmp_workdir / "work" / "servers", grace_s=5)


def samples(n: int, prefix: str = "q") -> list[Sample]:
    return [Sample(id=f"{prefix}{i}", messages=(Message("user", f"hello {i}"),)) for i in range(n)]


def run_shard(root: Path, cfg: dict[str, Any], items: list[Sample]) -> list[dict[str, Any]]:
    records = root / "results" / "generations" / "00000.jsonl"
    with acquire_server(ServerConfig.from_mapping(cfg), None, owner_pid=os.getpid(), poll_s=0.05) as ep:
        generate_shard(
            ShardJob(
                items,
                root / "work" / "journal" / "00000.jsonl",
                records,
                root / "results" / "generations" / "00000.failed.jsonl",
                GenerateConfig.from_dict({"concurrency": 4}),
                ep,
                "00000",
            )
        )
    return [orjson.loads(x) for x in records.read_bytes().splitlines()]


# ------------------------------------------------------------------------------------ loopback


def test_server_commands_bind_loopback_unless_configured() -> None:
    sim = build_simulated_command(ServerConfig.from_mapping({"model_path": "m"}), 31000, "m")
    assert sim[sim.index("--host") + 1] == "127.0.0.1"
    real = build_sglang_command(ServerConfig.from_mapping({"model_path": "m"}), None, 31000, "m")
    assert real[real.index("--host") + 1] == "127.0.0.1"
    exposed = build_sglang_command(
        ServerConfig.from_mapping({"model_path": "m", "host": "0.0.0.0"}), None, 31000, "m"
    )
    assert exposed[exposed.index("--host") + 1] == "0.0.0.0"
    # a --host smuggled in through server.args cannot override the configured bind address
    smuggled = build_sglang_command(
        ServerConfig.from_mapping({"model_path": "m", "args": ["--host", "0.0.0.0"]}), None, 31000, "m"
    )
    assert [smuggled[i + 1] for i, a in enumerate(smuggled) if a == "--host"] == ["127.0.0.1"]
    with pytest.raises(ServerError, match=r"bad sglang launch flags: .*--no-such-flag"):
        build_sglang_command(
            ServerConfig.from_mapping({"model_path": "m", "args": ["--no-such-flag", "1"]}), None, 31000, "m"
        )


def test_simulated_server_socket_listens_on_loopback_only(tmp_workdir: Path, servers: dict[str, Any]) -> None:
    with acquire_server(ServerConfig.from_mapping(servers), None, owner_pid=os.getpid(), poll_s=0.05) as ep:
        port = int(ep.url.rsplit(":", 1)[1])
        assert ep.url.startswith("http://127.0.0.1:")
        assert listening_sockets().get(port) == "127.0.0.1"


# ------------------------------------------------------------------------------------- secrets


def test_api_key_and_aws_secret_never_reach_any_file(
    tmp_workdir: Path, servers: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REGEN_TEST_API_KEY", API_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", AWS_SECRET)
    cfg = {**servers, "api_key_env": "REGEN_TEST_API_KEY"}
    recs = run_shard(tmp_workdir, cfg, samples(12))
    assert len(recs) == 12
    written = [p for p in tmp_workdir.rglob("*") if p.is_file()]
    assert any(p.name == "gpu0.log" for p in written) and any(p.suffix == ".url" for p in written)
    assert any("status" in p.parts for p in written), "the status file is checked too"
    for path in written:
        data = path.read_bytes()
        assert API_KEY.encode() not in data, f"the API key leaked into {path}"
        assert AWS_SECRET.encode() not in data, f"the AWS secret leaked into {path}"
    # the supervisor gets the variable's name, never its value
    state = (tmp_workdir / "work" / "servers" / "gpu0.url").read_text().split()
    argv = Path(f"/proc/{state[1]}/cmdline").read_bytes() if len(state) > 1 else b""
    assert API_KEY.encode() not in argv


def test_supervisor_argv_names_the_key_variable_not_the_key(tmp_path: Path) -> None:
    from regen.layout.slots import SlotFiles
    from regen.serving.slots import LaunchSpec

    spec = LaunchSpec(
        files=SlotFiles.of(0, tmp_path, tmp_path),
        url="http://127.0.0.1:1",
        host="127.0.0.1",
        port=1,
        model="m",
        command=["true"],
        env={"REGEN_TEST_API_KEY": API_KEY},
        idle_timeout_s=1,
        startup_timeout_s=1,
        max_restarts=0,
        owner_pid=1,
        api_key_env="REGEN_TEST_API_KEY",
    )
    argv = supervisor_argv(spec)
    assert "REGEN_TEST_API_KEY" in argv and API_KEY not in " ".join(argv)
    assert "Authorization" not in repr(Endpoint("u", "s", api_key=API_KEY)), "the key is kept out of repr"
    assert API_KEY not in repr(Endpoint("u", "s", api_key=API_KEY))


# ---------------------------------------------------------------------------------- path escape


def test_ids_that_could_escape_a_directory_are_rejected_at_ingest(tmp_path: Path) -> None:
    rows = [
        {
            "id": "fine-1",
            "messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}],
        },
        {"id": "../../etc/x", "messages": [{"role": "user", "content": "a"}]},
        {"id": "a/b", "messages": [{"role": "user", "content": "a"}]},
        {"id": "..", "messages": [{"role": "user", "content": "a"}]},
        {"id": "back\\slash", "messages": [{"role": "user", "content": "a"}]},
        {"id": "fine-2", "messages": [{"role": "user", "content": "c"}]},
    ]
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    bad: list[BadRow] = []
    got = [s.id for s in iter_samples(path, "messages", "id", "skip", bad_rows=bad)]
    assert got == ["fine-1", "fine-2"]
    assert [(b.row, b.field) for b in bad] == [(1, "id"), (2, "id"), (3, "id"), (4, "id")]


def test_no_file_name_is_derived_from_a_sample_id(tmp_workdir: Path) -> None:
    # even if a hostile id got past ingest, generation writes only its fixed per-shard files
    hostile = [
        Sample(id=sid, messages=(Message("user", "x"),))
        for sid in ("../../escaped-A", "/tmp/escaped-B", "sub/escaped-C", "escaped-D")
    ]
    url, stop = start_simulated_server(inline=True)
    try:
        root = tmp_workdir / "run"
        generate_shard(
            ShardJob(
                hostile,
                root / "work" / "journal" / "00000.jsonl",
                root / "results" / "generations" / "00000.jsonl",
                root / "results" / "generations" / "00000.failed.jsonl",
                GenerateConfig.from_dict({"concurrency": 2}),
                Endpoint(url, "gpu0"),
                "00000",
            )
        )
    finally:
        stop()
    files = sorted(str(p.relative_to(tmp_workdir)) for p in tmp_workdir.rglob("*") if p.is_file())
    assert files == [
        "run/results/generations/00000.failed.jsonl",
        "run/results/generations/00000.jsonl",
        "run/work/journal/00000.jsonl",
        "run/work/journal/00000.jsonl.index",
        "run/work/journal/00000.jsonl.lock",  # the journal's one-writer lock (regen.generate.journal)
        "run/work/status/00000.json",
    ]
    assert not any("escaped" in p.name for p in Path("/tmp").iterdir())


# ------------------------------------------------------------------------------ config is data

FORBIDDEN_CALLS = {"eval", "exec", "compile", "__import__"}


def _safe_loader(call: ast.Call) -> bool:
    """``yaml.load(..., Loader=SAFE_LOADER)``: regen's one loader, safe_load's own (C when built)."""
    return any(
        kw.arg == "Loader" and isinstance(kw.value, ast.Name) and kw.value.id == "SAFE_LOADER"
        for kw in call.keywords
    )


def test_the_one_yaml_loader_is_a_safe_one() -> None:
    import yaml

    from regen.runconfig import SAFE_LOADER

    assert SAFE_LOADER in (yaml.SafeLoader, getattr(yaml, "CSafeLoader", None))
    with pytest.raises(yaml.constructor.ConstructorError):
        yaml.load("!!python/object/apply:os.system ['true']", Loader=SAFE_LOADER)


def _violations(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        fn = node.func
        name = fn.id if isinstance(fn, ast.Name) else fn.attr if isinstance(fn, ast.Attribute) else ""
        where = f"{path.relative_to(REPO) if path.is_relative_to(REPO) else path.name}:{node.lineno}"
        builtin = isinstance(fn, ast.Name) or (
            isinstance(fn, ast.Attribute) and isinstance(fn.value, ast.Name) and fn.value.id == "builtins"
        )
        if name in FORBIDDEN_CALLS and builtin:
            found.append(f"{where}: {name}()")
        if name in ("load", "loads") and isinstance(fn, ast.Attribute) and isinstance(fn.value, ast.Name):
            if fn.value.id == "pickle":
                found.append(f"{where}: pickle.{name}()")
            if fn.value.id == "yaml" and name == "load" and not _safe_loader(node):
                found.append(f"{where}: yaml.load() (use yaml.safe_load)")
        for kw in node.keywords:
            if kw.arg == "shell" and isinstance(kw.value, ast.Constant) and kw.value.value is True:
                found.append(f"{where}: shell=True")
    return found


def test_package_never_evaluates_strings_as_code() -> None:
    sources = sorted((REPO / "regen").rglob("*.py")) + sorted((REPO / "scripts").glob("*.py"))
    assert len(sources) > 10
    problems = [v for path in sources for v in _violations(path)]
    assert problems == []


def test_the_checker_catches_eval(tmp_path: Path) -> None:
    bad = tmp_path / "probe.py"
    bad.write_text("import re, yaml\nx = eval('1')\ny = yaml.load('a')\nz = re.compile('a')\n")
    try:
        assert len(_violations(bad)) == 2  # re.compile is fine
    finally:
        bad.unlink()


def test_a_code_looking_config_value_flows_through_as_inert_text(
    tmp_workdir: Path, servers: dict[str, Any]
) -> None:
    cfg = {**servers, "model_path": PAYLOAD}
    recs = run_shard(tmp_workdir, cfg, samples(3))
    assert {r["model"] for r in recs} == {PAYLOAD}, "the string reached the server and came back verbatim"
    assert not (tmp_workdir / "pwned").exists()
    assert not Path("pwned").exists() and not (REPO / "pwned").exists()
    log = (tmp_workdir / "logs" / "servers" / "gpu0.log").read_text()
    assert PAYLOAD in log  # it was passed as one argv element, not run
