"""The features section, its layer convention, the row choice and the storage/GPU-hour projection, with the
refusal ``regen check`` (and the workflow's first step) gives a run that would not fit."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from regen.check import Host, check_features, features_notes
from regen.configfile import load_config
from regen.features.config import (
    FeaturesConfig,
    FeaturesConfigError,
    RowChoice,
    layers_from_drafter_config,
    parse_bytes,
)
from regen.features.projection import TokenCounts, bytes_per_token, project, refusal
from regen.features.rows import TokenRow, chosen, shard_rows
from regen.layout.run import RunLayout
from regen.sglang.models import ModelShape

ROOT = Path(__file__).resolve().parents[2]
DEMO_MODEL = ROOT / "resources/demo-model/config.json"  # Qwen3: 28 layers, hidden 1024


def test_defaults_are_eagle3_plus_the_last_layer_after_the_norm() -> None:
    cfg = FeaturesConfig.from_dict({})
    assert not cfg.enabled and cfg.dtype == "bf16" and cfg.last_layer == "post_norm" and cfg.rows.everything
    assert cfg.stored_layers(40) == (2, 20, 37, 40)
    assert FeaturesConfig.from_dict({"last_layer": "none"}).stored_layers(40) == (2, 20, 37)


def test_dflash_layers_are_specforge_build_target_layer_ids_plus_one() -> None:
    # SpecForge's build_target_layer_ids(36, 5) = [1, 9, 17, 25, 33];
    # speculators' DFlash example [2, 10, 18, 26, 34]
    cfg = FeaturesConfig.from_dict({"layers": "dflash", "last_layer": "none"})
    assert cfg.stored_layers(36) == (2, 10, 18, 26, 34)


def test_the_two_conventions_name_the_same_layers(tmp_path: Path) -> None:
    speculators = tmp_path / "speculators.json"
    speculators.write_text(
        json.dumps({"speculators_model_type": "eagle3", "eagle_aux_hidden_state_layer_ids": [2, 20, 37]})
    )
    specforge = tmp_path / "specforge.json"
    specforge.write_text(json.dumps({"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 19, 36]}}))
    assert (
        layers_from_drafter_config(speculators)[0] == layers_from_drafter_config(specforge)[0] == (2, 20, 37)
    )
    cfg = FeaturesConfig.from_dict({"drafter_config": str(specforge), "layers": [3, 4]})
    assert cfg.stored_layers(40) == (2, 20, 37, 40)  # the drafter's config decides


def test_bad_layer_settings_name_the_key() -> None:
    with pytest.raises(FeaturesConfigError, match=r"features.layers .*\[41\] outside 1..40"):
        FeaturesConfig.from_dict({"layers": [2, 41]}).stored_layers(40)
    with pytest.raises(FeaturesConfigError, match="last layer 40"):
        FeaturesConfig.from_dict({"layers": [2, 40]}).stored_layers(40)
    with pytest.raises(ValueError, match=r"features\.dtype"):
        FeaturesConfig.from_dict({"dtype": "fp16"})
    with pytest.raises(FeaturesConfigError, match="max_storage"):
        FeaturesConfig.from_dict({"max_storage": "lots"})
    assert parse_bytes("2TiB") == 2 * 2**40 and parse_bytes("500GB") == 500 * 10**9 and parse_bytes(7) == 7


def test_rows_setting_reads_all_a_count_or_a_fraction() -> None:
    assert FeaturesConfig.from_dict({"rows": "all"}).rows.everything
    assert FeaturesConfig.from_dict({"rows": 100}).rows == RowChoice(count=100)
    assert FeaturesConfig.from_dict({"rows": 0.25}).rows == RowChoice(fraction=0.25)


def rows(n: int) -> list[TokenRow]:
    return [TokenRow(f"r{i}", f"s{i // 2}", (1, 2, 3), (0, 1, 1)) for i in range(n)]


def test_the_choice_is_stable_nested_and_blind_to_the_file_order() -> None:
    all_rows = rows(400)
    shuffled = all_rows[:]
    random.Random(3).shuffle(shuffled)
    for choice in (RowChoice(fraction=0.3), RowChoice(count=50)):
        assert [r.id for r in chosen(all_rows, choice)] == [r.id for r in chosen(shuffled, choice)]
    small = {r.id for r in chosen(all_rows, RowChoice(fraction=0.2))}
    large = {r.id for r in chosen(all_rows, RowChoice(fraction=0.5))}
    assert small < large and 40 < len(small) < 120
    assert {r.id for r in chosen(all_rows, RowChoice(count=20))} < {
        r.id for r in chosen(all_rows, RowChoice(count=60))
    }
    # a sample's rows go together, to its prompt shard; the shards partition the choice
    parts = [shard_rows(all_rows, RowChoice(fraction=0.5), k, 4) for k in range(4)]
    assert sorted(r.id for p in parts for r in p) == sorted(large)
    for part in parts:
        samples = {r.sample_id for r in part}
        assert all(r.sample_id in samples for r in all_rows if r.id in large and r.sample_id in samples)


def test_the_issue_numbers_per_token() -> None:
    # issue 59: hidden 5,120, three auxiliary layers plus the last, bf16: 40,960 B a token (+ its token id)
    assert bytes_per_token(4, 5120, 2, 0) == 40_960 + 8
    assert bytes_per_token(4, 5120, 1, 4) == 20_480 + 4 + 8


def test_projection_from_the_audit_and_the_refusal_names_what_fits() -> None:
    model = ModelShape.from_config(DEMO_MODEL)
    summary = {
        "kept": 1000,
        "histograms": {"prompt_tokens": {"mean": 300.0}, "supervised_tokens": {"mean": 700.0}},
    }
    counts = TokenCounts.from_audit(summary, completions_per_prompt=2)
    assert (counts.rows, counts.tokens) == (2000, 2_000_000)
    cfg = FeaturesConfig.from_dict({"enabled": True})
    p = project(counts, cfg, model)
    assert p.layers == (2, 14, 25, 28)
    assert p.bytes == 2_000_000 * (4 * 1024 * 2 + 8)
    assert p.gpu_hours > 0 and "projection" in p.rate_source
    assert refusal(p, None, free=p.bytes, where="results/features") is None
    why = refusal(p, max_storage=p.bytes // 4, free=10 * p.bytes, where="results/features")
    assert (
        why is not None
        and "features.max_storage" in why
        and f"{p.bytes:,} B" in why
        and f"{p.bytes // 4:,} B" in why
    )
    assert "features.rows: 0.25" in why
    fitted = project(counts, FeaturesConfig.from_dict({"enabled": True, "rows": 0.25}), model)
    assert refusal(fitted, p.bytes // 4, 10 * p.bytes, "results/features") is None
    why = refusal(p, None, free=p.bytes // 10, where="results/features")
    assert why is not None and "free space under results/features" in why
    measured = project(counts, FeaturesConfig.from_dict({"prefill_tokens_per_s": 1000.0}), model)
    assert measured.gpu_hours == pytest.approx(2_000_000 / 1000 / 3600)
    # the disk's share: 1,000 tokens/s of 8,200 B each is 8.2 MB written a second by one GPU's job
    assert measured.write_rate == 1000.0 * (4 * 1024 * 2 + 8)
    assert "writes 8.2 MB/s" in measured.lines()[-1]


def feature_config(tmp_path: Path, features: str) -> dict:
    path = tmp_path / "features.yaml"
    path.write_text(f"server:\n  model_config: {DEMO_MODEL}\nfeatures: {features}\n")
    return load_config([str(ROOT / "config/demo.yaml"), str(path)])


def test_regen_check_refuses_a_run_over_max_storage(tmp_path: Path) -> None:
    results = tmp_path / "results"
    layout = RunLayout(results=results)
    layout.audit_summary.parent.mkdir(parents=True)
    summary = {
        "kept": 300,
        "total": 310,
        "histograms": {"prompt_tokens": {"mean": 200}, "supervised_tokens": {"mean": 300}},
    }
    layout.audit_summary.write_text(json.dumps(summary))
    host = Host(results_dir=str(results))
    assert check_features(feature_config(tmp_path, "{enabled: false, max_storage: 1KB}"), host) == []
    fits = feature_config(tmp_path, "{enabled: true}")
    assert check_features(fits, host) == []
    notes = features_notes(fits, results)
    assert any("GPU-hours" in n for n in notes) and any("the audit's" in n for n in notes)
    (problem,) = check_features(feature_config(tmp_path, "{enabled: true, max_storage: 100MB}"), host)
    assert (
        problem.key == "features.max_storage"
        and "100.0 MB" in problem.message
        and "features.rows: 0." in problem.message
    )
    # once the token export exists, its real lengths decide
    layout.export_tokenized.parent.mkdir(parents=True)
    layout.export_tokenized.write_text(
        json.dumps({"id": "a", "input_ids": [1] * 10, "loss_mask": [1] * 10}) + "\n"
    )
    assert check_features(feature_config(tmp_path, "{enabled: true, max_storage: 100MB}"), host) == []
    assert any("real lengths" in n for n in features_notes(fits, results))


@pytest.mark.parametrize(
    ("measured", "target", "measured_on"),
    [
        ("features-dense.json", "dense", "Llama-3.1-8B's layers"),
        ("moe-warm/features-moe.json", "moe", "Qwen3-30B-A3B's layers"),
    ],
)
def test_before_any_job_the_rate_is_the_prefill_measured_on_an_h100_for_the_family(
    measured: str, target: str, measured_on: str, tmp_path: Path
) -> None:
    """The projection before any features job has run rates the prefill at the utilization the bench measured
    for the family (tokens over prefill seconds, ``measurements/features-2026-12-07b-h100``), read through
    the same model shape the run's projection reads."""
    doc = json.loads((ROOT / "measurements/features-2026-12-07b-h100" / measured).read_text())
    (tmp_path / "config.json").write_text(json.dumps(doc["config"]))
    model = ModelShape.from_config(tmp_path / "config.json")
    counts = TokenCounts(rows=doc["rows"], tokens=doc["tokens"], source="the bench's rows")
    p = project(counts, FeaturesConfig.from_dict({"enabled": True}), model)
    prefilled = doc["regen"]["tokens"] / doc["regen"]["prefill_s"]
    assert p.rate == pytest.approx(prefilled, rel=0.02), (p.rate_source, prefilled)
    assert p.rate_source.startswith("assumed:") and f"a {target} target" in p.rate_source
