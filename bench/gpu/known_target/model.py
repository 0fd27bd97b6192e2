"""A known-answer target at the Qwen3.6-27B shape: a Markov chain written into real weights (issue 27).

Every block's output projection (full attention ``o_proj``, gated-delta ``out_proj``, MLP ``down_proj``)
is zero, so each layer adds exactly 0 to the residual stream and the final hidden state of a position
is its token's embedding row. A chain state's embedding row holds ``EMBED_VALUE`` on ``m`` dimensions
of its own (``m`` chosen so that ``d / m`` is a power of 4): the final zero-centred RMSNorm
(``x / rms(x) * (1 + w)``, ``w = 0``, as Qwen3.5/3.6 store it) turns it into exactly ``sqrt(d / m)`` (a
power of two) on those dimensions, and ``lm_head`` column ``first dim of the group`` holds the state's
logits divided by that power of two. Logits are rounded to bf16 first, so what the GPU computes in bf16
is the designed value bit for bit, and the designed distributions below are computed from the rounded
logits (not from the probabilities asked for). The compute per token is the real shape's: every GEMM,
the gated-delta recurrence and the attention run at full size; their inputs are just zero.

The chain (one state per token id; a token's embedding fixes its successors, so no id is in two states):
  prompt ends "<|im_start|>assistant\\n" (thinking on: last id "\\n") -> "<think>" -> reasoning stage 1
  reasoning stage i (a word, self-loop ``stay``) -> stage i+1 ... -> stage K -> decision word:
      back to stage 1 (another round, prob ``reasoning_round``) or "</think>"
  "</think>" -> "\\n\\n" (the thinking-off prompt also ends in "\\n\\n": it starts the answer directly)
  "\\n\\n" -> text answer (answer stages, rounds, then "<|im_end|>") or a tool call:
      <tool_call>\\n{"name": "get_weather", "arguments": {"city": CITY, "unit": UNIT}}\\n</tool_call>
      then <|im_end|>
  spelled with token ids used nowhere else (a non-canonical split where the canonical one repeats ids).
Every branch keeps probability >= ``MIN_BRANCH`` after temperature, so SGLang's top-k (20) and
top-p (0.95) keep all designed successors and drop everything else: the distribution SGLang samples
from is the designed one, computed exactly here in SGLang's order (temperature, then top-k and top-p
on the tempered probabilities, "joint" as flashinfer applies them; with <= 20 successors, the same).

MTP (the ``mtp.*`` NEXTN layer): ``fc`` maps the normalized token embedding through (identity on the
state dimensions, zero on the hidden half), its decoder layer's outputs are zero, so the draft logits
equal the main model's logits at the drafted token: each draft is the most likely successor of the
previous one, and SGLang's target-only verification accepts draft ``t`` with the target's probability
of ``t``. The acceptance is therefore set by the chain (``stay`` on reasoning stages).

Disk: tensors that are all zero are holes in the safetensors file (seek past them, truncate to size):
the full-shape checkpoint is ~54 GB apparent but a few GB on disk (lm_head is dense: every row has the
"not a successor" logit in each state column). The file system must support sparse files (checked).

Usage:
  python -m bench.gpu.known_target model OUT [--layers 64] [--max-tokens 4096 8192] [--tiny] [--dense]
  (--tiny: same construction at a small shape, for the CPU test; needs only numpy and tokenizers)
  (--dense: a dense Qwen3ForCausalLM at Qwen3-8B's config, no MTP, every norm weight 1 (Qwen3's RMSNorm is
  not zero-centred), o_proj and down_proj zero, the short chain DENSE_CHAIN: issue 36)
Writes OUT/{config.json, generation_config.json, tokenizer.json, tokenizer_config.json,
model[-0000i-of-0000n].safetensors (+ index), chain.json, designed.json}.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import shutil
import struct
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[3]
TOKENIZER_DIR = REPO / "resources" / "demo-tokenizer"
MIN_BRANCH = 0.07  # every designed branch after temperature; top_p 0.95 keeps branches above 0.05
OTHER_LOGIT = -64.0  # every non-successor token, in every state (-107 after temperature 0.6)
EMBED_VALUE = 16.0  # large enough that RMSNorm's eps moves the normalized value by < 1e-5
TOOL_NAME = "get_weather"
CITIES = (("Paris", 0.5), ("Oslo", 0.3), ("Lima", 0.2))
UNITS = (("celsius", 0.7), ("fahrenheit", 0.3))
TOOL_TAGS = ("<tool_call>", "</tool_call>")  # added tokens, as in Qwen3's tokenizer
# the tool call's JSON, its separators varied (JSON allows any spacing) so no piece repeats
TOOL_PREFIX = '<tool_call>\n{"name": "' + TOOL_NAME + '", "arguments": {"city":"'
TOOL_MID = '","unit" : "'
TOOL_END = '"}}\n</tool_call>'
EXTRA_PIECES = ('\n{"', '", "', '": {"', '":"', '","', '" : "', '"}}\n', *(v for v, _ in CITIES + UNITS))


@dataclass(frozen=True)
class Sampling:
    temperature: float = 0.6
    top_p: float = 0.95
    top_k: int = 20


@dataclass(frozen=True)
class ChainSpec:
    """The chain's free parameters (probabilities after temperature, before rounding)."""

    reasoning_stages: int = 40  # words per reasoning round
    stay: float = 0.8  # self-loop of a stage word: also the MTP draft's acceptance there
    reasoning_round: float = 0.9  # another round of reasoning (else "</think>")
    answer_stages: int = 8
    answer_round: float = 0.75
    tool_share: float = 0.3  # "\n\n" -> tool call
    sampling: Sampling = field(default_factory=Sampling)


@dataclass(frozen=True)
class Shape:
    arch: str = "qwen3_5"  # qwen3_5: hybrid Qwen3_5ForCausalLM (+ MTP); qwen3: dense Qwen3ForCausalLM
    hidden: int = 5120
    layers: int = 64
    intermediate: int = 17408
    heads: int = 24
    kv_heads: int = 4
    head_dim: int = 256
    lin_k_heads: int = 16
    lin_v_heads: int = 48
    lin_k_dim: int = 128
    lin_v_dim: int = 128
    conv_kernel: int = 4
    vocab: int = 248320
    full_attention_interval: int = 4
    mtp_layers: int = 1


TINY = Shape(
    hidden=256,
    layers=4,
    intermediate=128,
    heads=2,
    kv_heads=1,
    head_dim=256,  # the real head dim: the rotary sections of the config stay valid
    lin_k_heads=2,
    lin_v_heads=4,
    lin_k_dim=16,
    lin_v_dim=16,
    vocab=4160,  # the tokenizer (4,110 ids) plus padding, as real vocabularies have
)
# the dense variant (issue 36): Qwen3-8B's config (the smallest dense Qwen3 with untied embeddings, which
# the chain needs: embedding and lm_head rows differ), served by SGLang 0.5.17's qwen3.py with EAGLE3
DENSE = Shape(
    arch="qwen3",
    hidden=4096,
    layers=36,
    intermediate=12288,
    heads=32,
    kv_heads=8,
    head_dim=128,
    vocab=151936,
    mtp_layers=0,
)
TINY_DENSE = Shape(**{**asdict(DENSE), "hidden": 256, "layers": 2, "intermediate": 128, "vocab": 4160})
# the dense target's chain: short, so rows finish far inside the export window (SpecForge's default
# --max-length 2048; regen drops rows that end on max_tokens): 8 reasoning words a round, 2 rounds on
# average, a 4-word answer (the designed lengths are in designed.json)
DENSE_CHAIN = ChainSpec(reasoning_stages=8, reasoning_round=0.5, answer_stages=4, answer_round=0.5)


# ---------------------------------------------------------------------------------------------- chain


def bf16_round(x: float) -> float:
    """Round to the nearest bf16 (ties to even), as a float."""
    b = struct.unpack("<I", struct.pack("<f", float(x)))[0]
    b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
    return float(struct.unpack("<f", struct.pack("<I", b))[0])


@dataclass
class State:
    token: int
    piece: str  # the token's text
    role: str  # prompt | think_open | reasoning | think_close | sep | answer | tool | eos
    succ: dict[int, float]  # successor token id -> logit (bf16-exact, max 0)


@dataclass
class Chain:
    states: dict[int, State]
    start_thinking: int  # last prompt id with thinking on
    start_plain: int  # last prompt id with thinking off
    think_close: int
    eos: int
    tool_first: int  # first token of a tool call
    sampling: Sampling
    spec: ChainSpec

    def to_json(self) -> dict[str, Any]:
        return {
            "start_thinking": self.start_thinking,
            "start_plain": self.start_plain,
            "think_close": self.think_close,
            "eos": self.eos,
            "tool_first": self.tool_first,
            "other_logit": OTHER_LOGIT,
            "sampling": asdict(self.sampling),
            "spec": asdict(self.spec),
            "states": [
                {
                    "token": s.token,
                    "piece": s.piece,
                    "role": s.role,
                    "succ": [[t, lg] for t, lg in s.succ.items()],
                }
                for s in self.states.values()
            ],
        }

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Chain:
        states = {
            int(s["token"]): State(
                int(s["token"]), s["piece"], s["role"], {int(t): float(lg) for t, lg in s["succ"]}
            )
            for s in obj["states"]
        }
        spec = dict(obj["spec"])
        spec["sampling"] = Sampling(**spec["sampling"])
        return cls(
            states,
            obj["start_thinking"],
            obj["start_plain"],
            obj["think_close"],
            obj["eos"],
            obj["tool_first"],
            Sampling(**obj["sampling"]),
            ChainSpec(**spec),
        )

    def probs(self, token: int) -> dict[int, float]:
        """The distribution SGLang samples the successor of ``token`` from (module doc)."""
        return sampled_probs(self.states[token].succ, self.sampling)


def sampled_probs(succ: dict[int, float], s: Sampling) -> dict[int, float]:
    """SGLang 0.5.17's sampling on a state's logits, exactly: softmax(logits / T) over the whole vocabulary
    (non-successors at OTHER_LOGIT), then top-k and top-p ("joint": a token is kept when it is among the
    k largest and the probability mass strictly above it is below top_p), renormalized. Non-successors are
    checked to fall outside (they are all smaller than every successor)."""
    toks = sorted(succ, key=lambda t: -succ[t])
    z = np.array([succ[t] for t in toks], dtype=np.float64) / s.temperature
    zmax = z.max()
    w = np.exp(z - zmax)
    total = w.sum()  # non-successors: < 1e-40 of the mass (checked below)
    p = w / total
    keep = []
    above = 0.0
    for i, t in enumerate(toks):
        if i < s.top_k and above < s.top_p:
            keep.append((t, p[i]))
        above += p[i]
    other = math.exp(OTHER_LOGIT / s.temperature - zmax)
    if other * 1e6 > total:
        raise ValueError("non-successor tokens would carry probability mass")
    if len(keep) < len(toks):
        raise ValueError(f"top-k/top-p drops designed successors: {succ}")
    norm = sum(q for _, q in keep)
    return {t: q / norm for t, q in keep}


def branch_logits(probs: dict[int, float], s: Sampling) -> dict[int, float]:
    """Logits (max 0, bf16-exact) whose tempered softmax is ``probs`` up to bf16 rounding."""
    if any(p < MIN_BRANCH for p in probs.values()):
        raise ValueError(f"a branch below {MIN_BRANCH} would not survive top-p robustly: {probs}")
    top = max(probs.values())
    return {t: bf16_round(s.temperature * math.log(p / top)) for t, p in probs.items()}


class Vocab:
    """The demo tokenizer's ids, handed out once each."""

    def __init__(self, tokenizer_dir: Path) -> None:
        from tokenizers import Tokenizer

        self.tok = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
        self.used: set[int] = set()
        added = self.tok.get_added_tokens_decoder()
        self.special = {i for i, a in added.items() if a.special or a.content in ("<think>", "</think>")}
        self.size = self.tok.get_vocab_size()
        self.pieces = {i: self.tok.decode([i], skip_special_tokens=False) for i in range(self.size)}
        self.by_piece: dict[str, list[int]] = {}
        for i, p in self.pieces.items():
            if p and "\ufffd" not in p and i not in self.special:
                self.by_piece.setdefault(p, []).append(i)

    def id(self, piece: str) -> int:
        i = self.tok.token_to_id(piece)
        if i is None:
            raise ValueError(f"{piece!r} is not one token of the tokenizer")
        return self.take(i)

    def take(self, i: int) -> int:
        if i in self.used:
            raise ValueError(f"token {i} ({self.pieces[i]!r}) already used by another state")
        self.used.add(i)
        return i

    def words(self, n: int) -> list[int]:
        """``n`` unused word tokens (" word", alphabetic, their text's canonical encoding), in id order."""
        out = []
        for i in range(self.size):
            p = self.pieces[i]
            word = p.startswith(" ") and p[1:].isalpha() and len(p) >= 4
            # canonical: the text of a run of such words tokenizes back to the same ids
            if i not in self.used and word and self.tok.encode(p, add_special_tokens=False).ids == [i]:
                out.append(self.take(i))
                if len(out) == n:
                    return out
        raise ValueError(f"tokenizer has fewer than {n} unused word tokens")

    def spell(self, text: str) -> list[int]:
        """``text`` as tokens none of which is used yet (canonical split where possible; longest
        pieces first, backtracking), and mark them used."""
        best: list[int] | None = None

        def go(pos: int, acc: list[int], taken: set[int]) -> bool:
            nonlocal best
            if pos == len(text):
                best = list(acc)
                return True
            for end in range(min(len(text), pos + 16), pos, -1):
                for i in self.by_piece.get(text[pos:end], ()):
                    if i in self.used or i in taken:
                        continue
                    acc.append(i)
                    taken.add(i)
                    if go(end, acc, taken):
                        return True
                    acc.pop()
                    taken.discard(i)
            return False

        if not go(0, [], set()):
            raise ValueError(f"cannot spell {text!r} with unused tokens")
        assert best is not None
        for i in best:
            self.take(i)
        return best


def design_chain(spec: ChainSpec, tokenizer_dir: Path) -> Chain:
    v = Vocab(tokenizer_dir)
    s = spec.sampling
    states: dict[int, State] = {}

    def add(tok: int, role: str, probs: dict[int, float]) -> None:
        states[tok] = State(tok, v.pieces[tok], role, branch_logits(probs, s))

    nl, nlnl = v.id("Ċ"), v.id("ĊĊ")  # last prompt token: thinking on / off
    think_open, think_close, eos = v.id("<think>"), v.id("</think>"), v.id("<|im_end|>")
    r_words = v.words(spec.reasoning_stages + 1)
    a_words = v.words(spec.answer_stages + 1)
    # the tool call: a fixed prefix, a city, a unit, a fixed end; the value tokens branch
    pre = v.spell(TOOL_PREFIX)
    cities = [(v.spell(c), p) for c, p in CITIES]
    mid = v.spell(TOOL_MID)
    units = [(v.spell(u), p) for u, p in UNITS]
    end = v.spell(TOOL_END)

    add(nl, "prompt", {think_open: 1.0})
    add(think_open, "think_open", {r_words[0]: 1.0})
    for i, w in enumerate(r_words[:-1]):
        add(w, "reasoning", {w: spec.stay, r_words[i + 1]: 1 - spec.stay})
    add(r_words[-1], "reasoning", {r_words[0]: spec.reasoning_round, think_close: 1 - spec.reasoning_round})
    add(think_close, "think_close", {nlnl: 1.0})
    add(nlnl, "sep", {a_words[0]: 1 - spec.tool_share, pre[0]: spec.tool_share})
    for i, w in enumerate(a_words[:-1]):
        add(w, "answer", {w: spec.stay, a_words[i + 1]: 1 - spec.stay})
    add(a_words[-1], "answer", {a_words[0]: spec.answer_round, eos: 1 - spec.answer_round})

    def seq(ids: list[int], nxt: dict[int, float]) -> None:
        for a, b in itertools.pairwise(ids):
            add(a, "tool", {b: 1.0})
        add(ids[-1], "tool", nxt)

    seq(pre, {c[0]: p for c, p in cities})
    for c, _ in cities:
        seq(c, {mid[0]: 1.0})
    seq(mid, {u[0]: p for u, p in units})
    for u, _ in units:
        seq(u, {end[0]: 1.0})
    seq(end, {eos: 1.0})
    add(eos, "eos", {eos: 1.0})
    return Chain(states, nl, nlnl, think_close, eos, pre[0], s, spec)


# ------------------------------------------------------------------------------------ designed stats


def first_passage(chain: Chain, start: int, targets: set[int], horizon: int) -> dict[int, np.ndarray]:
    """P(the first token in ``targets`` is emitted at step t, and it is token x), t = 1..horizon, when
    generation starts after ``start``: {x: array[horizon + 1]}."""
    ids = list(chain.states)
    idx = {t: i for i, t in enumerate(ids)}
    n = len(ids)
    m = np.zeros((n, n))
    for t in ids:
        for u, p in chain.probs(t).items():
            m[idx[t], idx[u]] = p
    tmask = np.zeros(n, dtype=bool)
    for t in targets:
        tmask[idx[t]] = True
    out = {t: np.zeros(horizon + 1) for t in targets}
    pi = np.zeros(n)
    pi[idx[start]] = 1.0
    for step in range(1, horizon + 1):
        pi = pi @ m
        for t in targets:
            out[t][step] = pi[idx[t]]
        pi[tmask] = 0.0
    return out


def visits(chain: Chain, start: int, stop: int, horizon: int) -> dict[int, float]:
    """Expected number of times each token is emitted before ``stop`` (within ``horizon`` steps)."""
    ids = list(chain.states)
    idx = {t: i for i, t in enumerate(ids)}
    m = np.zeros((len(ids), len(ids)))
    for t in ids:
        for u, p in chain.probs(t).items():
            m[idx[t], idx[u]] = p
    pi = np.zeros(len(ids))
    pi[idx[start]] = 1.0
    acc = np.zeros(len(ids))
    for _ in range(horizon):
        pi = pi @ m
        acc += pi
        pi[idx[stop]] = 0.0
    return {t: float(acc[idx[t]]) for t in ids}


def quantiles(pmf: np.ndarray, qs: tuple[float, ...] = (0.1, 0.25, 0.5, 0.75, 0.9, 0.99)) -> dict[str, int]:
    c = np.cumsum(pmf) / pmf.sum()
    return {f"p{round(q * 100)}": int(np.searchsorted(c, q)) for q in qs}


def pmf_stats(pmf: np.ndarray) -> dict[str, Any]:
    mass = float(pmf.sum())
    t = np.arange(len(pmf))
    return {
        "mass": mass,
        "mean": float((t * pmf).sum() / mass),
        "sd": float(math.sqrt(max(0.0, (t * t * pmf).sum() / mass - ((t * pmf).sum() / mass) ** 2))),
        **quantiles(pmf),
    }


def mtp_acceptance(chain: Chain, token_visits: dict[int, float], steps: int = 3) -> dict[str, float]:
    """Per-draft acceptance and mean accept length (SGLang's ``accept len``: accepted drafts + 1) with
    ``steps`` greedy drafts: from a state the drafts are the argmax path, each accepted with the target's
    probability of it. Weighted by how often each state is emitted (an estimate: a verify step starts
    at every accepted run's end, not at every token)."""
    tot = acc1 = alen = 0.0
    for t, w in token_visits.items():
        if w <= 0 or chain.states[t].role == "eos":
            continue
        cur, run, length = t, 1.0, 1.0
        p_first = None
        for _ in range(steps):
            probs = chain.probs(cur)
            d = max(probs, key=lambda u: probs[u])
            run *= probs[d]
            p_first = probs[d] if p_first is None else p_first
            length += run
            cur = d
        tot += w
        acc1 += w * (p_first or 0.0)
        alen += w * length
    return {"per_draft_acceptance": acc1 / tot, "accept_length": alen / tot, "draft_steps": steps}


def mtp_simulated(
    chain: Chain, runs: int = 300, steps: int = 3, max_tokens: int = 8192, seed: int = 0
) -> float:
    """Mean accept length by simulating SGLang's target-only verification: per verify step, the greedy
    draft path from the last token; draft i is accepted with the target's probability of it (else the
    token is drawn from the rest, renormalized), stopping at the first rejection; all accepted: one bonus
    token. Tokens over verify steps, over ``runs`` completions (thinking on)."""
    rng = np.random.default_rng(seed)
    tokens = verifies = 0
    for _ in range(runs):
        cur, n = chain.start_thinking, 0
        while cur != chain.eos and n < max_tokens:
            verifies += 1
            drafts, d = [], cur
            for _ in range(steps):
                probs = chain.probs(d)
                d = max(probs, key=lambda u: probs[u])
                drafts.append(d)
            for d in [*drafts, None]:
                probs = chain.probs(cur)
                if d is not None and rng.random() < probs.get(d, 0.0):
                    nxt = d
                else:
                    rest = {u: p for u, p in probs.items() if u != d}
                    toks = list(rest)
                    w = np.array([rest[u] for u in toks])
                    nxt = toks[int(rng.choice(len(toks), p=w / w.sum()))] if toks else d
                cur, n = nxt, n + 1
                tokens += 1
                if nxt != d or cur == chain.eos:
                    break
    return tokens / verifies


def designed_stats(chain: Chain, max_tokens: int, retry_factor: int = 2) -> dict[str, Any]:
    """What a run of ``max_tokens`` should measure, from the chain alone (thinking on)."""
    horizon = 4 * retry_factor * max_tokens  # the lengths' own distributions, far past the budget
    r = first_passage(chain, chain.start_thinking, {chain.think_close}, horizon)[chain.think_close]
    a_eos = first_passage(chain, chain.think_close, {chain.eos}, horizon)[chain.eos]
    a_tool = first_passage(chain, chain.tool_first, {chain.eos}, horizon)[chain.eos]
    nlnl = chain.probs(chain.think_close)
    assert list(nlnl) == [chain.start_plain]
    p_tool = chain.probs(chain.start_plain)[chain.tool_first]
    # the tool path is fixed length from the sep onward except the value branches: split A by kind
    tool_pmf = np.zeros(horizon + 1)
    tool_pmf[2:] = p_tool * a_tool[: horizon - 1]  # "</think>" -> "\n\n" -> tool_first ... eos
    text_pmf = a_eos - tool_pmf
    total = np.convolve(r, a_eos)[: horizon + 1]
    total_tool = np.convolve(r, tool_pmf)[: horizon + 1]
    m = max_tokens
    m2 = retry_factor * m
    stop = float(total[: m + 1].sum())
    stop_tool = float(total_tool[: m + 1].sum())
    r_within = float(r[: m + 1].sum())
    return {
        "max_tokens": m,
        "stop_fraction": stop,
        "length_fraction": 1 - stop,
        "truncated_in_reasoning_fraction": 1 - r_within,  # content "" (unclosed think block)
        "tool_call_fraction_of_all": p_tool,
        "tool_call_fraction_of_stopped": stop_tool / stop,
        "retry": {
            "max_tokens": retry_factor * m,
            "finishes_if_fresh_draw": float(total[: m2 + 1].sum()),  # real SGLang ignores the seed here
            "finishes_given_first_truncated_if_same_draw": float(
                total[m + 1 : m2 + 1].sum() / max(1e-300, 1 - stop)
            ),
            "stop_fraction_after_retry_fresh": stop + (1 - stop) * float(total[: m2 + 1].sum()),
        },
        "reasoning_tokens": pmf_stats(r),  # "<think>" .. "</think>" inclusive, untruncated
        "answer_tokens": pmf_stats(a_eos),  # after "</think>", "<|im_end|>" included
        "answer_tokens_text": pmf_stats(text_pmf),
        "answer_tokens_tool": pmf_stats(tool_pmf),
        "completion_tokens": pmf_stats(total),
        "completion_tokens_stopped_within_max": pmf_stats(total[: m + 1]),
        "final_rows": final_rows(r, a_eos, total, m, m2),
    }


def final_rows(r: np.ndarray, a: np.ndarray, total: np.ndarray, m: int, m2: int) -> dict[str, Any]:
    """The rows a run with ``truncation: retry`` keeps: a first attempt at ``m`` tokens, and for the
    truncated ones a fresh draw at ``m2`` (SGLang ignores the seed). Length distributions of the rows that
    end on a stop (completion and reasoning tokens), and the tokens generated per prompt (both attempts)."""
    f_m = float(total[: m + 1].sum())
    a_cdf = np.cumsum(a)
    k = np.arange(len(r))

    def reasoning_given_stop(budget: int) -> np.ndarray:
        out = np.zeros(budget + 1)
        out[: budget + 1] = r[: budget + 1] * a_cdf[budget - k[: budget + 1]]
        return out

    comp = np.zeros(m2 + 1)
    comp[: m + 1] += total[: m + 1]
    comp += (1 - f_m) * total[: m2 + 1]
    reas = np.zeros(m2 + 1)
    reas[: m + 1] += reasoning_given_stop(m)
    reas += (1 - f_m) * reasoning_given_stop(m2)
    t = np.arange(len(total))
    gen_first = float((np.minimum(t, m) * total).sum() + m * (1 - total.sum()))
    gen_retry = float((np.minimum(t, m2) * total).sum() + m2 * (1 - total.sum()))
    return {
        "retry_fraction": 1 - f_m,
        "stop_fraction": float(comp.sum()),
        "completion_tokens_stopped": pmf_stats(comp),
        "reasoning_tokens_stopped": pmf_stats(reas),
        "generated_tokens_per_prompt": gen_first + (1 - f_m) * gen_retry,
    }


def tool_arguments(chain: Chain) -> dict[str, float]:
    """The designed tool-call arguments (JSON, keys sorted) and their probabilities."""
    out = {}
    for c, pc in CITIES:
        for u, pu in UNITS:
            out[json.dumps({"city": c, "unit": u}, sort_keys=True)] = pc * pu
    return out


def design_report(chain: Chain, max_tokens: list[int]) -> dict[str, Any]:
    horizon = 8 * max(max_tokens)
    vis = visits(chain, chain.start_thinking, chain.eos, horizon)
    return {
        "tool": {"name": TOOL_NAME, "arguments": tool_arguments(chain)},
        "mtp": {**mtp_acceptance(chain, vis), "accept_length_simulated": mtp_simulated(chain)},
        "by_max_tokens": [designed_stats(chain, m) for m in max_tokens],
        "sampling": asdict(chain.sampling),
        "spec": asdict(chain.spec),
        "states": len(chain.states),
        "note": (
            "exact from the chain's bf16 logits with SGLang's sampling order; reasoning tokens count <think> "
            "through </think>, answer tokens the rest including <|im_end|>; thinking on"
        ),
    }


# ----------------------------------------------------------------------------------------- weights


def group_size(d: int) -> tuple[int, int]:
    """The fewest dims per state m such that d / m is a power of 4, and the normalized value sqrt(d/m)."""
    for m in range(1, d + 1):
        if d % m == 0:
            q = d // m
            r = math.isqrt(q)
            if r * r == q and r & (r - 1) == 0:
                return m, r
    raise ValueError(f"hidden size {d} has no power-of-4 quotient")


def dense_config_json(shape: Shape, eos: int, pad: int | None) -> dict[str, Any]:
    """Qwen3-8B's config.json at ``shape`` (transformers' and SGLang's ``Qwen3ForCausalLM``)."""
    return {
        "model_type": "qwen3",
        "architectures": ["Qwen3ForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": None,
        "eos_token_id": eos,
        "pad_token_id": pad,
        "head_dim": shape.head_dim,
        "hidden_act": "silu",
        "hidden_size": shape.hidden,
        "initializer_range": 0.02,
        "intermediate_size": shape.intermediate,
        "max_position_embeddings": 40960,
        "max_window_layers": shape.layers,
        "num_attention_heads": shape.heads,
        "num_hidden_layers": shape.layers,
        "num_key_value_heads": shape.kv_heads,
        "rms_norm_eps": 1e-6,
        "rope_scaling": None,
        "rope_theta": 1000000,
        "sliding_window": None,
        "use_sliding_window": False,
        "tie_word_embeddings": False,
        "use_cache": True,
        "vocab_size": shape.vocab,
        "torch_dtype": "bfloat16",
        "dtype": "bfloat16",
    }


def config_json(shape: Shape, eos: int, pad: int | None) -> dict[str, Any]:
    if shape.arch == "qwen3":
        return dense_config_json(shape, eos, pad)
    nl = shape.layers
    return {
        "model_type": "qwen3_5_text",
        "architectures": ["Qwen3_5ForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "attn_output_gate": True,
        "bos_token_id": None,
        "eos_token_id": eos,
        "pad_token_id": pad,
        "full_attention_interval": shape.full_attention_interval,
        "layer_types": [
            "full_attention" if (i + 1) % shape.full_attention_interval == 0 else "linear_attention"
            for i in range(nl)
        ],
        "head_dim": shape.head_dim,
        "hidden_act": "silu",
        "hidden_size": shape.hidden,
        "initializer_range": 0.02,
        "intermediate_size": shape.intermediate,
        "linear_conv_kernel_dim": shape.conv_kernel,
        "linear_key_head_dim": shape.lin_k_dim,
        "linear_num_key_heads": shape.lin_k_heads,
        "linear_num_value_heads": shape.lin_v_heads,
        "linear_value_head_dim": shape.lin_v_dim,
        "mamba_ssm_dtype": "float32",
        "max_position_embeddings": 262144,
        "mlp_only_layers": [],
        "mtp_num_hidden_layers": shape.mtp_layers,
        "mtp_use_dedicated_embeddings": False,
        "num_attention_heads": shape.heads,
        "num_hidden_layers": nl,
        "num_key_value_heads": shape.kv_heads,
        "partial_rotary_factor": 0.25,
        "rms_norm_eps": 1e-6,
        "rope_parameters": {
            "mrope_interleaved": True,
            "mrope_section": [11, 11, 10],
            "partial_rotary_factor": 0.25,
            "rope_theta": 10000000,
            "rope_type": "default",
        },
        "tie_word_embeddings": False,
        "use_cache": True,
        "vocab_size": shape.vocab,
        "torch_dtype": "bfloat16",
        "dtype": "bfloat16",
    }


def tensor_specs(shape: Shape) -> list[tuple[str, tuple[int, ...]]]:
    """Every tensor of the checkpoint (Hugging Face names, as transformers' Qwen3_5ForCausalLM and SGLang's
    loaders read them; ``mtp.*`` as SGLang's Qwen3_5ForCausalLMMTP reads them)."""
    d = shape.hidden
    kd, vd = shape.lin_k_heads * shape.lin_k_dim, shape.lin_v_heads * shape.lin_v_dim
    conv = 2 * kd + vd
    dense = shape.arch == "qwen3"
    q_out = (1 if dense else 2) * shape.heads * shape.head_dim  # hybrid: attn_output_gate (query, gate)
    kv = shape.kv_heads * shape.head_dim

    def full_attn(p: str) -> list[tuple[str, tuple[int, ...]]]:
        return [
            (f"{p}.self_attn.q_proj.weight", (q_out, d)),
            (f"{p}.self_attn.k_proj.weight", (kv, d)),
            (f"{p}.self_attn.v_proj.weight", (kv, d)),
            (f"{p}.self_attn.o_proj.weight", (d, shape.heads * shape.head_dim)),
            (f"{p}.self_attn.q_norm.weight", (shape.head_dim,)),
            (f"{p}.self_attn.k_norm.weight", (shape.head_dim,)),
        ]

    def mlp_norms(p: str) -> list[tuple[str, tuple[int, ...]]]:
        return [
            (f"{p}.mlp.gate_proj.weight", (shape.intermediate, d)),
            (f"{p}.mlp.up_proj.weight", (shape.intermediate, d)),
            (f"{p}.mlp.down_proj.weight", (d, shape.intermediate)),
            (f"{p}.input_layernorm.weight", (d,)),
            (f"{p}.post_attention_layernorm.weight", (d,)),
        ]

    out: list[tuple[str, tuple[int, ...]]] = [("model.embed_tokens.weight", (shape.vocab, d))]
    for i in range(shape.layers):
        p = f"model.layers.{i}"
        if dense or (i + 1) % shape.full_attention_interval == 0:
            out += full_attn(p)
        else:
            out += [
                (f"{p}.linear_attn.in_proj_qkv.weight", (conv, d)),
                (f"{p}.linear_attn.in_proj_z.weight", (vd, d)),
                (f"{p}.linear_attn.in_proj_b.weight", (shape.lin_v_heads, d)),
                (f"{p}.linear_attn.in_proj_a.weight", (shape.lin_v_heads, d)),
                (f"{p}.linear_attn.conv1d.weight", (conv, 1, shape.conv_kernel)),
                (f"{p}.linear_attn.dt_bias", (shape.lin_v_heads,)),
                (f"{p}.linear_attn.A_log", (shape.lin_v_heads,)),
                (f"{p}.linear_attn.norm.weight", (shape.lin_v_dim,)),
                (f"{p}.linear_attn.out_proj.weight", (d, vd)),
            ]
        out += mlp_norms(p)
    out += [("model.norm.weight", (d,)), ("lm_head.weight", (shape.vocab, d))]
    for i in range(shape.mtp_layers):
        out += full_attn(f"mtp.layers.{i}") + mlp_norms(f"mtp.layers.{i}")
    if shape.mtp_layers:
        out += [
            ("mtp.fc.weight", (d, 2 * d)),
            ("mtp.pre_fc_norm_embedding.weight", (d,)),
            ("mtp.pre_fc_norm_hidden.weight", (d,)),
            ("mtp.norm.weight", (d,)),
        ]
    return out


def bf16_bits(a: np.ndarray) -> np.ndarray:
    """float32 values that are bf16-exact -> their bf16 bit patterns (uint16)."""
    b = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    if np.any(b & 0xFFFF):
        raise ValueError("value not exactly representable in bf16")
    return (b >> 16).astype(np.uint16)


def nonzero_tensors(chain: Chain, shape: Shape) -> dict[str, Any]:
    """The tensors that are not all zero, as writers: name -> (row-chunk generator of uint16 arrays)."""
    d = shape.hidden
    m, scale = group_size(d)
    tokens = sorted(chain.states)
    if len(tokens) * m > d:
        raise ValueError(f"{len(tokens)} states x {m} dims do not fit hidden size {d}")
    dim_of = {t: i * m for i, t in enumerate(tokens)}  # first dim of the state's group
    if max(tokens) >= shape.vocab:
        raise ValueError("a chain token id is outside the model's vocabulary")

    def embed(rows: slice) -> np.ndarray:
        a = np.zeros((rows.stop - rows.start, d), dtype=np.float32)
        for t in tokens:
            if rows.start <= t < rows.stop:
                a[t - rows.start, dim_of[t] : dim_of[t] + m] = EMBED_VALUE
        return a

    def head(rows: slice) -> np.ndarray:
        a = np.zeros((rows.stop - rows.start, d), dtype=np.float32)
        cols = [dim_of[t] for t in tokens]
        a[:, cols] = OTHER_LOGIT / scale
        for t in tokens:
            for u, lg in chain.states[t].succ.items():
                if rows.start <= u < rows.stop:
                    a[u - rows.start, dim_of[t]] = lg / scale
        return a

    def fc(rows: slice) -> np.ndarray:
        a = np.zeros((rows.stop - rows.start, 2 * d), dtype=np.float32)
        for r in range(rows.start, rows.stop):
            a[r - rows.start, r] = 1.0  # embedding half: identity; hidden half: zero
        return a

    def ones(rows: slice) -> np.ndarray:
        return np.ones(rows.stop - rows.start, dtype=np.float32)

    out: dict[str, Any] = {"model.embed_tokens.weight": embed, "lm_head.weight": head}
    if shape.arch == "qwen3":  # Qwen3's RMSNorm is x / rms(x) * w: w = 1 is the identity (w = 0 in Qwen3.5)
        out.update({n: ones for n, _ in tensor_specs(shape) if n.endswith("norm.weight")})
    if shape.mtp_layers:
        out["mtp.fc.weight"] = fc
    return out


def write_safetensors(path: Path, specs: list[tuple[str, tuple[int, ...]]], writers: dict[str, Any]) -> int:
    """A bf16 safetensors file where all-zero tensors are holes (never written). Returns bytes on disk."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt", "writer": "bench/gpu/known_target/model.py"}}
    off = 0
    for name, shp in specs:
        n = 2 * math.prod(shp)
        header[name] = {"dtype": "BF16", "shape": list(shp), "data_offsets": [off, off + n]}
        off += n
    hb = json.dumps(header, separators=(",", ":")).encode()
    hb += b" " * (-len(hb) % 8)
    base = 8 + len(hb)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as fh:
        fh.write(struct.pack("<Q", len(hb)) + hb)
        for name, shp in specs:
            if name not in writers:
                continue
            start = header[name]["data_offsets"][0]
            rows = shp[0]
            chunk = max(1, (64 << 20) // (2 * math.prod(shp[1:])))
            for r0 in range(0, rows, chunk):
                r1 = min(rows, r0 + chunk)
                a = writers[name](slice(r0, r1))
                if not a.any():
                    continue  # a hole, like the all-zero tensors
                fh.seek(base + start + 2 * r0 * math.prod(shp[1:]))
                fh.write(bf16_bits(a).tobytes())
        fh.truncate(base + off)
    os.replace(tmp, path)
    return os.stat(path).st_blocks * 512


def write_shards(
    out: Path, specs: list[tuple[str, tuple[int, ...]]], writers: dict[str, Any], shard_bytes: int = 4 << 30
) -> tuple[int, int]:
    """The checkpoint as Hugging Face shards (``model-0000i-of-0000n.safetensors`` + index) of about
    ``shard_bytes`` each, so no reader maps 54 GB at once. Returns (bytes on disk, apparent bytes)."""
    groups: list[list[tuple[str, tuple[int, ...]]]] = [[]]
    size = 0
    for name, shp in specs:
        n = 2 * math.prod(shp)
        if groups[-1] and size + n > shard_bytes:
            groups.append([])
            size = 0
        groups[-1].append((name, shp))
        size += n
    for old in out.glob("model*.safetensors*"):
        old.unlink()
    weight_map = {}
    on_disk = apparent = 0
    for i, g in enumerate(groups):
        fname = (
            f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors" if len(groups) > 1 else "model.safetensors"
        )
        on_disk += write_safetensors(out / fname, g, {k: w for k, w in writers.items() if k in dict(g)})
        apparent += (out / fname).stat().st_size
        weight_map.update({name: fname for name, _ in g})
    if len(groups) > 1:
        total = sum(2 * math.prod(shp) for _, shp in specs)
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=1))
    return on_disk, apparent


def byte_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map (the byte-level BPE alphabet)."""
    bs = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs), strict=True))


def write_tokenizer(out: Path, tokenizer_dir: Path = TOKENIZER_DIR) -> None:
    """The demo's byte-level BPE tokenizer and Qwen3 chat template, plus what a Qwen3 tokenizer also has
    and the chain needs: ``<tool_call>``/``</tool_call>`` as added (non-special) tokens, and JSON
    punctuation runs as extra vocabulary pieces (no merges: prompts encode exactly as before; only the
    model emits them), so that the tool call is spelled with ids no other state uses."""
    tj = json.loads((tokenizer_dir / "tokenizer.json").read_text())
    tc = json.loads((tokenizer_dir / "tokenizer_config.json").read_text())
    vocab = tj["model"]["vocab"]
    for a in tj["added_tokens"]:  # the model's vocabulary stays contiguous: added ids join it
        if a["id"] >= len(vocab):
            vocab.setdefault(a["content"], a["id"])
    nxt = len(vocab)
    if sorted(vocab.values()) != list(range(nxt)):
        raise ValueError(f"{tokenizer_dir}: vocabulary ids are not contiguous")
    bu = byte_unicode()
    for piece in EXTRA_PIECES:
        key = "".join(bu[b] for b in piece.encode())
        if key not in vocab:
            vocab[key] = nxt
            nxt += 1
    for tag in TOOL_TAGS:
        if all(a["content"] != tag for a in tj["added_tokens"]):
            entry = {"id": nxt, "content": tag, "single_word": False, "lstrip": False, "rstrip": False}
            tj["added_tokens"].append({**entry, "normalized": False, "special": False})
            tc.setdefault("added_tokens_decoder", {})[str(nxt)] = {
                k: v for k, v in {**entry, "normalized": False, "special": False}.items() if k != "id"
            }
            nxt += 1
    (out / "tokenizer.json").write_text(json.dumps(tj, ensure_ascii=False))
    (out / "tokenizer_config.json").write_text(json.dumps(tc, indent=1, ensure_ascii=False))


def build(out: Path, shape: Shape, spec: ChainSpec, max_tokens: list[int]) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    write_tokenizer(out)
    chain = design_chain(spec, out)
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    endoftext = tok.token_to_id("<|endoftext|>")
    (out / "config.json").write_text(json.dumps(config_json(shape, chain.eos, endoftext), indent=1))
    (out / "generation_config.json").write_text(
        json.dumps({"eos_token_id": [chain.eos, endoftext], "pad_token_id": endoftext, "do_sample": True})
    )
    on_disk, apparent = write_shards(out, tensor_specs(shape), nonzero_tensors(chain, shape))
    (out / "chain.json").write_text(json.dumps(chain.to_json()))
    report = design_report(chain, max_tokens)
    report["checkpoint"] = {
        "apparent_bytes": apparent,
        "on_disk_bytes": on_disk,
        "group_dims": group_size(shape.hidden)[0],
        "normalized_value": group_size(shape.hidden)[1],
        "shape": asdict(shape),
    }
    (out / "designed.json").write_text(json.dumps(report, indent=1))
    return report


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("out", type=Path)
    p.add_argument("--layers", type=int, default=None, help="default: 64 (4 with --tiny)")
    p.add_argument("--tiny", action="store_true", help="the same construction at a small shape (CPU test)")
    p.add_argument(
        "--dense",
        action="store_true",
        help="the dense Qwen3ForCausalLM variant (Qwen3-8B's config, no MTP) with the short chain "
        "DENSE_CHAIN (the --reasoning-*/--answer-* defaults become its values)",
    )
    p.add_argument("--max-tokens", type=int, nargs="+", default=[4096, 8192])
    p.add_argument("--reasoning-stages", type=int, default=None)
    p.add_argument("--reasoning-round", type=float, default=None)
    p.add_argument("--answer-stages", type=int, default=None)
    p.add_argument("--answer-round", type=float, default=None)
    p.add_argument("--stay", type=float, default=None)
    p.add_argument("--tool-share", type=float, default=None)
    p.add_argument("--min-free-gib", type=float, default=8.0, help="refuse if the disk would keep less free")
    a = p.parse_args(argv)
    base = {(False, False): Shape(), (True, False): TINY, (False, True): DENSE, (True, True): TINY_DENSE}
    base = base[a.tiny, a.dense]
    shape = Shape(**{**asdict(base), "layers": a.layers or base.layers})
    default = DENSE_CHAIN if a.dense else ChainSpec()
    given = {k: getattr(a, k) for k in ("reasoning_stages", "stay", "reasoning_round", "answer_stages")}
    given |= {"answer_round": a.answer_round, "tool_share": a.tool_share}
    spec = ChainSpec(**{k: getattr(default, k) if v is None else v for k, v in given.items()})
    a.out.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(a.out).free / 2**30
    if free < a.min_free_gib + 4:  # lm_head + fc + embeddings: ~3 GB on disk at the full shape
        raise SystemExit(f"{a.out}: {free:.1f} GiB free, want {a.min_free_gib + 4:.0f}")
    rep = build(a.out, shape, spec, a.max_tokens)
    ck = rep["checkpoint"]
    if ck["on_disk_bytes"] > 0.5 * ck["apparent_bytes"] and ck["apparent_bytes"] > 8 << 30:
        raise SystemExit(f"{a.out}: the file system stored the zeros ({ck['on_disk_bytes'] / 2**30:.1f} GiB)")
    by = rep["by_max_tokens"]
    print(
        f"wrote {a.out}: {rep['states']} states, {ck['apparent_bytes'] / 1e9:.1f} GB apparent, "
        f"{ck['on_disk_bytes'] / 1e9:.2f} GB on disk; mtp accept length {rep['mtp']['accept_length']:.2f}; "
        + "; ".join(
            f"max_tokens {b['max_tokens']}: stop {b['stop_fraction']:.3f}, reasoning mean "
            f"{b['reasoning_tokens']['mean']:.0f}, tool share {b['tool_call_fraction_of_all']:.3f}"
            for b in by
        )
    )
    return 0
