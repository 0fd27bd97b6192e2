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
