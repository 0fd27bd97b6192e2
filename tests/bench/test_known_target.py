"""The known-answer target (bench.gpu.known_target.model, issue 27): a tiny instance of the same construction.

The design side (chain, SGLang's sampling order, the exact length distributions) runs here. The model side
runs the tiny checkpoint through transformers' own Qwen3.5 code (``bench/gpu/known_target/check.py``) with
the trainers' venv (torch + transformers 5.8.1): ``make test-trainers`` sets ``REGEN_TRAINERS_PYTHON``; in
the main venv (no torch) those tests skip.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest
from support.known_target import built_chain, checked_model

from bench.gpu.known_target import model as kt

MAX_TOKENS = 2048


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("kt")
    report = kt.build(out, kt.TINY, kt.ChainSpec(), [MAX_TOKENS])
    return out, report


@pytest.fixture(scope="module")
def chain(built: tuple[Path, dict]) -> kt.Chain:
    return built_chain(built[0])


@pytest.fixture(scope="module")
def checked(built: tuple[Path, dict]) -> dict:
    return checked_model(built[0])


def test_sampling_order_keeps_designed_branches_and_drops_the_rest() -> None:
    s = kt.Sampling(temperature=0.6, top_p=0.95, top_k=20)
    probs = kt.sampled_probs({1: 0.0, 2: kt.bf16_round(0.6 * np.log(0.2 / 0.8))}, s)
    assert probs[1] == pytest.approx(0.8, abs=2e-3) and sum(probs.values()) == pytest.approx(1.0)
    # a branch top-p would cut is refused at design time, not silently dropped
    with pytest.raises(ValueError):
        kt.sampled_probs({1: 0.0, 2: 0.6 * np.log(0.02 / 0.98)}, s)
    with pytest.raises(ValueError):
        kt.branch_logits({1: 0.97, 2: 0.03}, s)


def test_every_token_id_is_one_state_and_tool_call_parses(built: tuple[Path, dict], chain: kt.Chain) -> None:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(built[0] / "tokenizer.json"))
    assert len(chain.states) == len({s.token for s in chain.states.values()})
    # the prompt's last token (thinking on / off) starts the chain
    from regen.chat import ChatTemplate

    tpl = ChatTemplate.from_dir(built[0])
    for thinking, start in ((True, chain.start_thinking), (False, chain.start_plain)):
        text = tpl.render(
            [{"role": "user", "content": "hi"}], add_generation_prompt=True, enable_thinking=thinking
        )
        assert tok.encode(text, add_special_tokens=False).ids[-1] == start
    # the most likely tool call, decoded as SGLang does, parsed as SGLang's qwen25 detector does
    ids, t = [], chain.tool_first
    while t != chain.eos:
        ids.append(t)
        probs = chain.probs(t)
        t = max(probs, key=lambda u: probs[u])
    text = tok.decode(ids, skip_special_tokens=True)
    body = text.split("<tool_call>\n", 1)[1].split("\n</tool_call>", 1)[0]
    call = json.loads(body)
    assert call == {"name": kt.TOOL_NAME, "arguments": {"city": "Paris", "unit": "celsius"}}


def test_designed_lengths_match_a_sampled_chain(built: tuple[Path, dict], chain: kt.Chain) -> None:
    """The dynamic programme's distributions against 2,000 chains sampled from the same probabilities."""
    rng = np.random.default_rng(0)
    table = {
        t: (list(p), np.cumsum(list(p.values()))) for t, p in ((t, chain.probs(t)) for t in chain.states)
    }
    n = 2000
    total = np.zeros(n, dtype=int)
    reasoning = np.zeros(n, dtype=int)
    tool = np.zeros(n, dtype=bool)
    for i in range(n):
        t, k = chain.start_thinking, 0
        while t != chain.eos and k < 4 * MAX_TOKENS:
            toks, cum = table[t]
            t = toks[int(np.searchsorted(cum, rng.random() * cum[-1], side="right"))]
            k += 1
            if t == chain.think_close:
                reasoning[i] = k
            tool[i] |= t == chain.tool_first
        total[i] = k
    d = built[1]["by_max_tokens"][0]
    stop = float(np.mean(total <= MAX_TOKENS))
    se = np.sqrt(d["stop_fraction"] * (1 - d["stop_fraction"]) / n)
    assert abs(stop - d["stop_fraction"]) < 4 * se
    r = d["reasoning_tokens"]
    assert abs(reasoning.mean() - r["mean"]) < 4 * r["sd"] / np.sqrt(n)
    assert abs(np.median(reasoning) - r["p50"]) < 0.06 * r["p50"]
    assert abs(tool.mean() - d["tool_call_fraction_of_all"]) < 4 * np.sqrt(0.21 / n)
    assert 0.05 < d["length_fraction"] < 0.6  # some rows run past max_tokens, by design


def test_transformers_loads_the_checkpoint_with_every_tensor(checked: dict) -> None:
    assert checked["missing"] == [] and checked["unexpected"] == [] and checked["shape_mismatch"] == []
    assert checked["zero_output_projections"]


def test_model_next_token_distribution_is_the_designed_one(checked: dict, chain: kt.Chain) -> None:
    assert checked["prompt_last"] == chain.start_thinking
    for t, st in chain.states.items():
        got = checked["logits"][str(t)]
        assert {int(u): v for u, v in got["succ"].items()} == st.succ  # bf16-exact: equal, not close
        assert got["other_max"] == got["other_min"] == kt.OTHER_LOGIT
        probs = {int(u): p for u, p in checked["probs"][str(t)].items()}
        designed = chain.probs(t)
        assert probs.keys() == designed.keys()
        assert all(abs(probs[u] - designed[u]) < 1e-9 for u in designed)


def test_mtp_draft_logits_equal_the_main_models(checked: dict) -> None:
    assert checked["mtp_logits_equal"]


def test_transformers_generate_follows_the_chain(checked: dict, chain: kt.Chain) -> None:
    for ids in checked["generated"]:
        assert ids[0] == chain.probs(chain.start_thinking).popitem()[0]  # "<think>"
        for a, b in itertools.pairwise(ids):
            if a == chain.eos:
                break
            assert b in chain.probs(a), (a, b)


def test_simulated_server_answers_from_the_chain_like_sglang(
    built: tuple[Path, dict], chain: kt.Chain
) -> None:
    """regen's simulated SGLang in chain mode (the CPU rehearsal's server): ids follow the chain, the
    reasoning split sits at ``</think>``, and with tools a tool-call answer comes back parsed (qwen25)."""
    import urllib.request

    from tokenizers import Tokenizer

    from bench.sim_chain import chain_server_for
    from regen.simulated.launcher import start_simulated_server
    from regen.simulated.parsers import parse_qwen3_reasoning

    model = built[0]
    tok = Tokenizer.from_file(str(model / "tokenizer.json"))
    url, stop = start_simulated_server(
        inline=True,
        tokenizer_path=str(model),
        server_factory=chain_server_for(str(model / "chain.json")),
        tool_call_parser="qwen25",
    )
    tools = [{"type": "function", "function": {"name": kt.TOOL_NAME, "parameters": {"type": "object"}}}]
    finishes, calls = set(), 0
    try:
        for i in range(60):
            body = {
                "model": "m",
                "messages": [{"role": "user", "content": f"q{i}"}],
                "max_tokens": 3000,
                "temperature": 0.6,
                "top_p": 0.95,
                "top_k": 20,
                "seed": i,
                "tools": tools,
                "return_token_ids": True,
            }
            req = urllib.request.Request(
                f"{url}/v1/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
            )
            with urllib.request.urlopen(req, timeout=30) as resp:
                choice = json.load(resp)["choices"][0]
            ids = choice["response_token_ids"]
            prev = chain.start_thinking
            for t in ids:
                assert t in chain.probs(prev)
                prev = t
            reasoning, content = parse_qwen3_reasoning(tok.decode(ids, skip_special_tokens=True), True)
            assert choice["message"]["reasoning_content"] == reasoning
            finishes.add(choice["finish_reason"])
            if choice["message"].get("tool_calls"):
                calls += 1
                fn = choice["message"]["tool_calls"][0]["function"]
                args = json.dumps(json.loads(fn["arguments"]), sort_keys=True)
                assert fn["name"] == kt.TOOL_NAME and args in kt.tool_arguments(chain)
                assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] == ""
                assert choice["matched_stop"] is None
            elif choice["finish_reason"] == "stop":
                assert choice["message"]["content"] == content and choice["matched_stop"] == chain.eos
    finally:
        stop()
    assert calls > 0 and {"stop", "tool_calls"} <= finishes
