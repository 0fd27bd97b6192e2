"""The report's server-plan page names, beside each planned number, the SGLang rule it follows (issue 33
item 6), read from the plan file's ``rules``."""

from __future__ import annotations

import json
from pathlib import Path

from regen.observe.report import server_plan_html

KV_RULE = "KVCacheConfigurator.profile_max_num_token"


def test_the_plan_page_shows_the_rule_of_the_kv_number(tmp_path: Path) -> None:
    section = {
        "weights_gib": 10.0,
        "kv_cache_gib": 50.0,
        "kv_cache_tokens": 1000,
        "rules": {"kv_cache_tokens": KV_RULE, "weights_gib": "config bytes per parameter"},
    }
    plan = tmp_path / "server.json"
    plan.write_text(json.dumps({"launched": "recommended", "recommended": section, "gpu_memory_mib": 81920}))
    page = server_plan_html(plan, [], "sglang")
    assert "<th>SGLang rule</th>" in page
    kv_row = next(r for r in page.split("<tr>") if "1000" in r and KV_RULE in r)
    assert f"<td>{KV_RULE}</td>" in kv_row  # in the KV tokens row, not elsewhere on the page
    no_rules = tmp_path / "old.json"
    no_rules.write_text(json.dumps({"launched": "recommended", "recommended": {"kv_cache_tokens": 5}}))
    assert KV_RULE not in server_plan_html(no_rules, [], "sglang")


def test_the_plan_page_says_whether_the_prestarted_servers_were_kept(tmp_path: Path) -> None:
    """The tune rule's verdict on the servers started while the data was audited (regen.tune.prestart)."""
    plan = tmp_path / "server.json"
    note = {"source": "first pass over the dataset's first 50 rows", "reason": "every launch flag identical"}
    for adopted, said, cls in ((True, "adopted by the tune rule", "note"), (False, "not adopted", "warn")):
        doc = {"launched": "recommended", "recommended": {}, "prestart": {**note, "adopted": adopted}}
        plan.write_text(json.dumps(doc))
        page = server_plan_html(plan, [], "sglang")
        line = next(p for p in page.split("<p ") if "prestarted" in p)
        assert said in line and "first 50 rows" in line and line.startswith(f"class='{cls}'")
    plan.write_text(json.dumps({"launched": "recommended", "recommended": {}}))
    assert "prestarted" not in server_plan_html(plan, [], "sglang")
