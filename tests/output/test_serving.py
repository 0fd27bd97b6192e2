"""The serving contract (issue 24, items 4 and 6): preserve_thinking reaches the chat template through
SGLang's chat_template_kwargs and is fingerprinted; each thinking mode may sample with its own block, which
the records name; the export manifest's serving block says all of it, from the records' settings."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pyarrow.parquet as pq
import pytest
from conversations import two_turn_samples

from regen.chat import ChatTemplate
from regen.fingerprint import GenerationSettings, decisive_config
from regen.generate.client import Endpoint, ShardJob, generate_shard
from regen.generate.sample_record import thinking_for
from regen.output.export import ExportConfig, export_dataset
from regen.output.merge import MergeConfig, merge
from regen.output.provenance import build_provenance
from regen.output.serving import trainer_settings_markdown
from regen.output.validate import ValidateConfig, validate_shard
from regen.runconfig import ANSWERS, GenerateConfig, RunConfig, keys_deciding
from regen.simulated.launcher import start_simulated_server
from regen.types import Message, Sample

ROOT = Path(__file__).resolve().parents[2]
TOKENIZER = ROOT / "resources" / "demo-tokenizer"


def generate(root: Path, samples: list[Sample], tokenizer: Path, **cfg: Any) -> list[dict[str, Any]]:
    url, stop = start_simulated_server(inline=True, tokenizer_path=str(tokenizer), long_fraction=0.0)
    out = root / "gen.jsonl"
    try:
        generate_shard(
            ShardJob(
                samples,
                root / "journal.jsonl",
                out,
                root / "failed.jsonl",
                GenerateConfig.from_dict(
                    {"backoff_base_s": 0.001, "request_timeout_s": 5, "sampling": {"max_tokens": 200}, **cfg}
                ),
                Endpoint(url, "gpu0"),
                "00000",
            )
        )
    finally:
        stop()
    return [orjson.loads(x) for x in out.read_bytes().splitlines()]


def test_preserve_thinking_reaches_the_template_and_the_fingerprint(tmp_path: Path) -> None:
    tok = tmp_path / "tok"
    shutil.copytree(TOKENIZER, tok)
    cfg_path = tok / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["chat_template"] = "{%- if preserve_thinking %}[kept]{% endif %}" + cfg["chat_template"]
    cfg_path.write_text(json.dumps(cfg))
    samples = two_turn_samples(3, id_prefix="p")
    on = generate(tmp_path / "on", samples, tok, preserve_thinking=True)
    off = generate(tmp_path / "off", samples, tok)
    decode = ChatTemplate.from_dir(tok).tokenizer.decode
    assert all(decode(r["prompt_token_ids"], skip_special_tokens=False).startswith("[kept]") for r in on)
    assert not any(decode(r["prompt_token_ids"], skip_special_tokens=False).startswith("[kept]") for r in off)
    # fingerprinted: a change regenerates; and the workflow passes it to the generate jobs
    assert "preserve_thinking" in keys_deciding(GenerateConfig, ANSWERS)
    assert decisive_config({"generate": {"preserve_thinking": True}})["generate"] == {
        "preserve_thinking": True
    }
    plain = GenerationSettings.for_run(RunConfig.from_config({"generate": {}}))
    kept = GenerationSettings.for_run(RunConfig.from_config({"generate": {"preserve_thinking": True}}))
    assert plain.fingerprint != kept.fingerprint and kept.run.preserve_thinking is True
    assert GenerationSettings.of(GenerateConfig.from_dict({"preserve_thinking": True})).run.preserve_thinking


def test_each_thinking_mode_samples_with_its_own_block(tmp_path: Path) -> None:
    """Non-thinking samples at temperature 0 (greedy: the simulated server ignores the seed, as SGLang's
    greedy decoding does) answer the same prompt alike; thinking samples keep the shared block."""
    prompt = (Message("user", "the very same question"),)
    samples = [Sample(f"m{i}", prompt) for i in range(40)]
    cfg = {
        "thinking": "mix",
        "thinking_fraction": 0.5,
        "sampling": {"max_tokens": 200, "non_thinking": {"temperature": 0}},
    }
    recs = generate(tmp_path, samples, TOKENIZER, **cfg)
    off = [r for r in recs if not r["thinking"]]
    on = [r for r in recs if r["thinking"]]
    assert off and on
    assert {r["sampling"]["block"] for r in off} == {"non_thinking"} and {
        r["sampling"]["temperature"] for r in off
    } == {0.0}
    assert {r["sampling"]["block"] for r in on} == {"sampling"} and {
        r["sampling"]["temperature"] for r in on
    } == {0.6}
    assert len({r["content"] for r in off}) == 1 and len({r["content"] for r in on}) > 1
    assert all(r["thinking"] == thinking_for(r["id"], "mix", 0.5) for r in recs)
    # the fingerprint covers the blocks
    base = GenerationSettings.for_run(RunConfig.from_config({"generate": {"sampling": {}}}))
    other = GenerationSettings.for_run(RunConfig.from_config({"generate": cfg}))
    assert base.fingerprint != other.fingerprint
    assert dict(other.variant.sampling_non_thinking) == {"temperature": 0.0}


@pytest.fixture
def exported(tmp_path: Path) -> tuple[dict[str, Any], Path]:
    samples = two_turn_samples(20, id_prefix="c")
    samples += [Sample(f"n{i}", (Message("user", f"no system {i}"),)) for i in range(6)]
    cfg = {
        "thinking": "mix",
        "thinking_fraction": 0.6,
        "preserve_thinking": False,
        "sampling": {"max_tokens": 300, "non_thinking": {"temperature": 0.7, "top_p": 0.8}},
    }
    generate(tmp_path, samples, TOKENIZER, **cfg)
    valid = tmp_path / "valid.parquet"
    validate_shard(tmp_path / "gen.jsonl", valid, tmp_path / "quarantine.jsonl", ValidateConfig.from_dict({}))
    provenance = build_provenance(plan={}, tokenizer_dir=str(TOKENIZER), valid_paths=[str(valid)])
    merge([valid], tmp_path / "dataset", MergeConfig.from_dict({}), provenance)
    out = tmp_path / "export"
    manifest = export_dataset(
        dataset_dir=str(tmp_path / "dataset"),
        specforge_out=str(out / "specforge.jsonl"),
        tokenized_out=str(out / "tokenized.jsonl"),
        manifest_out=str(out / "manifest.json"),
        config=ExportConfig.from_dict({"eval_fraction": 0.2, "max_length": 4096}),
        tokenizer_dir=str(TOKENIZER),
        regenerate="last",
    )
    return manifest, tmp_path


def test_the_manifest_states_the_serving_contract(exported: tuple[dict[str, Any], Path]) -> None:
    manifest, root = exported
    serving = manifest["serving"]
    rows = {r["id"]: r for r in pq.read_table(root / "dataset").to_pylist()}
    per_row = [orjson.loads(x) for x in (root / "export" / "thinking.jsonl").read_bytes().splitlines()]
    assert per_row and all(p["thinking"] == rows[p["id"]]["thinking"] for p in per_row)
    counts = Counter("on" if p["thinking"] else "off" for p in per_row)
    assert serving["thinking"]["rows"] == {"on": counts["on"], "off": counts["off"]} and counts["off"]
    assert serving["thinking"]["configured"] == "mix" and serving["thinking"]["thinking_fraction"] == 0.6
    assert serving["preserve_thinking"] is False
    sf = [orjson.loads(x) for f in ("specforge.jsonl", "specforge.eval.jsonl")
          for x in (root / "export" / f).read_bytes().splitlines()]  # fmt: skip
    no_system = sum(line["conversations"][0]["role"] != "system" for line in sf)
    assert no_system and serving["system_prompt"]["specforge_rows_it_is_added_to"] == no_system
    assert serving["system_prompt"]["specforge_adds"] == "You are a helpful assistant."
    sha = serving["chat_template_sha256"]
    assert len(sha["exported_with"]) == 64  # generated_with: the records' (a bare test config names none)
    provenance = orjson.loads((root / "dataset" / "_manifest.json").read_bytes())["provenance"]
    assert sha["generated_with"] == provenance["settings"]["chat_template_sha256"]
    assert serving["sampling"]["non_thinking"] == {
        "temperature": 0.7, "top_p": 0.8, "top_k": 20, "max_tokens": 300, "block": "non_thinking"
    }  # fmt: skip
    assert serving["sampling"]["thinking"]["block"] == "sampling"


def test_trainer_settings_render_from_the_manifest(exported: tuple[dict[str, Any], Path]) -> None:
    text = trainer_settings_markdown(exported[0])
    assert "data.chat_template: qwen3-thinking" in text and "data.train_only_last_turn: true" in text
    assert "data.max_length: 4096" in text and "--total-seq-len 4096" in text
    assert "thinking mix (60% of samples with thinking on)" in text and "`preserve_thinking` false" in text
    assert "non-thinking: temperature 0.7, top_p 0.8, top_k 20 (`generate.sampling.non_thinking`)" in text
    assert "`You are a helpful assistant.`" in text
