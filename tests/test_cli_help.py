"""Every option of every ``regen`` command says what it does in ``--help``."""

from __future__ import annotations

import contextlib
import importlib
import io
import re

import pytest

from regen.cli import COMMANDS

#: subcommands whose own --help is checked too
SUBCOMMANDS = {"tune": ["--sweep"]}  # the demo-asset builder is test support, not a regen command
OPTION = re.compile(r"^  (-{1,2}[\w-]+|[a-z_]+)(?=[ ,]|$)")


def help_text(command: str, extra: list[str]) -> str:
    module = importlib.import_module(COMMANDS[command][0])
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as info:
        module.cli([*extra, "--help"])
    assert info.value.code == 0
    return out.getvalue()


def undocumented(text: str) -> list[str]:
    """Option lines of an argparse help with no description on the line or the next one."""
    lines = text.splitlines()
    missing = []
    for i, line in enumerate(lines):
        m = OPTION.match(line)
        if m is None or m.group(1) in ("-h",):
            continue
        rest = line[m.end() :]
        described = bool(re.search(r"\S\s{2,}\S", rest) or re.match(r"^\s{2,}\S", rest))
        if not described:
            nxt = lines[i + 1] if i + 1 < len(lines) else ""
            described = nxt.startswith(" " * 8) and bool(nxt.strip()) and not OPTION.match(nxt)
        if not described:
            missing.append(line.strip())
    return missing


@pytest.mark.parametrize(
    ("command", "extra"),
    [(c, []) for c in COMMANDS] + [(c, [s]) for c, subs in SUBCOMMANDS.items() for s in subs],
)
def test_every_option_has_help(command: str, extra: list[str]) -> None:
    text = help_text(command, extra)
    assert undocumented(text) == [], text


@pytest.mark.parametrize("command", list(COMMANDS))
def test_help_names_the_command_as_typed(command: str) -> None:
    """``regen X --help`` prints ``usage: regen X`` (not a module's or an old command's name)."""
    assert help_text(command, []).startswith(f"usage: regen {command}")


@pytest.mark.parametrize("extra", [[], ["--sweep"]])
def test_tune_help_shows_the_configfile_option(extra: list[str]) -> None:
    assert re.search(r"^  --configfile", help_text("tune", extra), re.M)


def test_tune_reads_the_model_and_memory_from_the_configfile(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from pathlib import Path

    from regen.tune.tune import cli

    monkeypatch.chdir(Path(__file__).resolve().parents[1])  # the demo's paths are the checkout's
    demo = Path("config") / "demo.yaml"
    assert cli(["--configfile", str(demo)]) == 0  # server.model_config, gpu_memory_mib 81920 from it
    assert "recommended flags:" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        cli([])  # neither --model-config nor --configfile
