"""From the audit to the plan (issue 52 item 4): the real ``regen audit`` on data with reasoning writes
answer-only lengths, the tune rule's entry plans a thinking-on + thinking-off run at their mix, and the
tune rule's tracked settings change with the variants' thinking modes (so a changed variant replans)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import orjson
import yaml

from regen.fingerprint import decisive_plan_config
from regen.ingest.audit import cli
from regen.ingest.audit_summary import ANSWER_ONLY_HISTOGRAM
from regen.runconfig import GenerateConfig, ServerConfig
from regen.sglang.config import PlanFile
from regen.tune.tune import write_plan_for_workflow
from regen.tune.workload_plan import variant_shares
from tests.support.demo_assets import build_demo_dataset

ROOT = Path(__file__).resolve().parents[2]
THINK_ON = {"name": "think", "n": 1, "thinking": "on"}
THINK_OFF = {"name": "plain", "n": 2, "thinking": "off"}


def _server() -> ServerConfig:
    server = yaml.safe_load((ROOT / "config" / "demo.yaml").read_text())["server"]
    return ServerConfig.from_mapping({**server, "mode": "sglang"})  # a GPU plan, not the stand-in's cap


def _plan(summary: Path, out: Path, variants: list[dict[str, Any]]) -> dict[str, Any]:
    write_plan_for_workflow(
        server_cfg=_server(),
        max_tokens=4096,
        audit_summary=str(summary),
        out_path=str(out),
        variants=variant_shares(GenerateConfig.from_dict({"variants": variants})),
    )
    return PlanFile.read(out).launched_section


def test_a_thinking_off_variant_plans_at_the_audits_answer_only_length(
    tmp_path: Path, demo_tokenizer_dir: Path
) -> None:
    files = build_demo_dataset(tmp_path / "data", demo_tokenizer_dir, n=120, n_tokenized=4, n_sharegpt=4)
    out = tmp_path / "audit"
    argv = [str(files.jsonl), "--tokenizer", str(demo_tokenizer_dir), "--override-gates", "--out", str(out)]
    assert cli(argv) == 0
    summary = out / "summary.json"
    hists = orjson.loads(summary.read_bytes())["histograms"]
    answer_mean, full_mean = hists[ANSWER_ONLY_HISTOGRAM]["mean"], hists["supervised_tokens"]["mean"]
    assert answer_mean < full_mean
    mixed = _plan(summary, tmp_path / "mixed.json", [THINK_ON, THINK_OFF])
    on = _plan(summary, tmp_path / "on.json", [THINK_ON])
    rule = mixed["rules"]["client_concurrency"]
    assert f"thinking off 2 (plain) x their answer-only mean {answer_mean:,.0f}" in rule, rule
    assert f"the old answers' mean {full_mean:,.0f}" in rule
    assert "answer-only" not in on["rules"]["client_concurrency"]


def _demo() -> dict[str, Any]:
    from regen.configfile import load_config

    return load_config([str(ROOT / "config" / "demo.yaml")])


def test_the_variants_thinking_modes_are_tracked_settings_of_the_tune_rule() -> None:
    demo = _demo()
    assert "variants" not in decisive_plan_config(demo)  # no variants: the param as it was (pinned)

    def tracked(variants: list[dict[str, Any]], **generate: Any) -> str:
        config = copy.deepcopy(demo)
        config["generate"] = {**config["generate"], **generate, "variants": variants}
        return repr(decisive_plan_config(config))

    both = tracked([THINK_ON, THINK_OFF])
    assert "'variants': [{'name': 'think', 'n': 1, 'thinking': 'on'}" in both
    assert tracked([THINK_ON, {**THINK_OFF, "thinking": "on"}]) != both  # a mode changed: replan
    assert tracked([THINK_ON, {**THINK_OFF, "n": 3}]) != both  # a weight changed: replan
    inherits = {"name": "plain", "n": 2}  # the dataset's generate.thinking decides its mode
    assert tracked([THINK_ON, inherits], thinking="off") == both
    assert "thinking_fraction" not in both
    mix = tracked([THINK_ON, inherits], thinking="mix", thinking_fraction=0.25)
    assert "'thinking': 'mix'" in mix and "'thinking_fraction': 0.25" in mix
    assert mix != tracked([THINK_ON, inherits], thinking="mix", thinking_fraction=0.75)


def test_without_variants_a_switch_of_the_thinking_mode_replans() -> None:
    """The implicit variant's mode weighs the planned answer too (answer-only lengths with thinking off),
    so switching ``generate.thinking`` changes the tune rule's tracked settings; thinking on, the default,
    leaves a run's param as it was."""
    demo = _demo()
    assert demo["generate"].get("thinking", "on") == "on"

    def tracked(**generate: Any) -> dict[str, Any]:
        config = copy.deepcopy(demo)
        config["generate"] = {**config["generate"], **generate}
        return decisive_plan_config(config)

    on, off = tracked(thinking="on"), tracked(thinking="off")
    assert on == decisive_plan_config(demo) and "thinking" not in on
    assert off != on and off["thinking"] == "off" and "thinking_fraction" not in off
    assert tracked(thinking="mix", thinking_fraction=0.25) != tracked(thinking="mix", thinking_fraction=0.75)
    assert variant_shares(GenerateConfig.from_dict({"thinking": "off"}))[0].thinking_share == 0.0


def test_samples_the_audit_could_not_split_are_named_in_the_rule(
    tmp_path: Path, demo_tokenizer_dir: Path
) -> None:
    """A mix of rows with their own loss masks (left out of the answer-only lengths) and rows with
    reasoning: the rule says over how many samples the answer-only mean is and how many were left out."""
    from regen.chat import ChatTemplate
    from regen.ingest.audit import AuditConfig, audit_records
    from regen.types import Message, Sample

    chat = ChatTemplate.from_dir(demo_tokenizer_dir)
    rows = [
        Sample(f"s{i}", (Message("user", f"q{i}"), Message("assistant", "a short answer", "reasoning " * 40)))
        for i in range(3)
    ]
    masked = Sample(
        "m", (Message("user", "q"), Message("assistant", "a", "r")), {"mask_supervised_tokens": 90}
    )
    _, summary = audit_records([*rows, masked], AuditConfig.from_dict({}), chat)
    path = tmp_path / "summary.json"
    path.write_bytes(orjson.dumps(summary.to_json()))
    rule = _plan(path, tmp_path / "plan.json", [THINK_ON, THINK_OFF])["rules"]["client_concurrency"]
    assert "answer-only mean" in rule and "over 3 samples (1 not split, left out)" in rule, rule


def test_completions_per_prompt_and_the_regenerate_mode_replan_and_temperature_does_not() -> None:
    """``generate.sampling.n`` and ``generate.regenerate`` decide whether prompts share prefixes (the radix
    cache's case), so a change replans; a sampling value the plan does not read leaves the param alone; the
    defaults (n 1, regenerate last) leave a run's param as it was (issue 57)."""
    demo = _demo()

    def tracked(**generate: Any) -> dict[str, Any]:
        config = copy.deepcopy(demo)
        config["generate"] = {**config["generate"], **generate}
        return decisive_plan_config(config)

    one = tracked(sampling={**demo["generate"]["sampling"], "n": 1})
    four = tracked(sampling={**demo["generate"]["sampling"], "n": 4})
    hot = tracked(sampling={**demo["generate"]["sampling"], "temperature": 1.3})
    assert one == decisive_plan_config(demo) and "n" not in one and "regenerate" not in one
    assert four != one and four["n"] == 4
    assert hot == one
    every_turn = tracked(regenerate="all")
    assert every_turn != one and every_turn["regenerate"] == "all"
    with_variants = tracked(regenerate="all", variants=[THINK_ON])
    assert with_variants["regenerate"] == "all" and "n" not in with_variants
