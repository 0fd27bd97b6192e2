"""The simulated server in chain mode: a known-answer target's chain (``bench.gpu.known_target``) sampled
as SGLang samples that model, for the known-target benches' CPU rehearsal.

Plugged into ``regen.simulated`` through its server hook: ``$REGEN_SIM_SERVER=bench.sim_chain:chain_server``
with ``$REGEN_SIM_CHAIN`` the model's ``chain.json`` (the server needs ``tokenizer_path``: the model's
tokenizer), or ``start_simulated_server(server_factory=chain_server_for(path))`` in a thread.
"""

from __future__ import annotations

import hashlib
import math
import os
import random
from collections.abc import Callable
from typing import Any

import orjson

from regen.simulated.completion import Ask, Completion
from regen.simulated.options import SimOptions
from regen.simulated.parsers import parse_qwen3_reasoning, parse_qwen25_tool_calls
from regen.simulated.requestlog import LogWriter
from regen.simulated.server import ServerFactory, SimulatedServer
from regen.simulated.tokens import TokenCompletion

CHAIN_ENV = "REGEN_SIM_CHAIN"  # path of the model's chain.json
#: the value of regen.simulated.launcher.SERVER_HOOK_ENV that answers from the chain
CHAIN_HOOK = "bench.sim_chain:chain_server"


class ChainModel:
    """A known-answer target's chain (``chain.json`` of ``bench/gpu/known_target/model.py``): each token's
    successors and their logits. Sampled as SGLang 0.5.17 samples: logits / temperature, softmax over the
    vocabulary (every other id at ``other_logit``), then top-k and top-p ("joint": kept when among the k
    largest and the mass strictly above is below top_p), renormalized; temperature 0 is greedy."""

    def __init__(self, path: str) -> None:
        with open(path, "rb") as fh:
            obj = orjson.loads(fh.read())
        self.succ = {int(s["token"]): [(int(t), float(lg)) for t, lg in s["succ"]] for s in obj["states"]}
        self.eos = int(obj["eos"])
        self._cache: dict[tuple[int, float, int, float], tuple[list[int], list[float]]] = {}

    def dist(self, token: int, temperature: float, top_k: int, top_p: float) -> tuple[list[int], list[float]]:
        """The kept successors of ``token`` and their cumulative probabilities."""
        key = (token, temperature, top_k, top_p)
        if key not in self._cache:
            pairs = sorted(self.succ.get(token, []), key=lambda x: -x[1])
            if not pairs:  # a token outside the chain (uniform over the vocabulary): end the turn instead
                pairs = [(self.eos, 0.0)]
            if temperature <= 1e-6 or top_k == 1:
                self._cache[key] = ([pairs[0][0]], [1.0])
            else:
                w = [math.exp((lg - pairs[0][1]) / temperature) for _, lg in pairs]
                total = sum(w)
                kept, above = [], 0.0
                for i, (t, _) in enumerate(pairs):
                    if (top_k <= 0 or i < top_k) and above < top_p:
                        kept.append((t, w[i] / total))
                    above += w[i] / total
                norm = sum(p for _, p in kept)
                cum, acc = [], 0.0
                for _, p in kept:
                    acc += p / norm
                    cum.append(acc)
                self._cache[key] = ([t for t, _ in kept], cum)
        return self._cache[key]

    def sample(
        self,
        start: int,
        rng: random.Random,
        max_tokens: int,
        ignore_eos: bool,
        sampling: tuple[float, int, float],
    ) -> tuple[list[int], bool]:
        """Completion ids after a prompt ending in ``start``; True when it ended on the end-of-turn id."""
        ids: list[int] = []
        cur = start
        while len(ids) < max_tokens:
            toks, cum = self.dist(cur, *sampling)
            u = rng.random()
            cur = toks[next((i for i, c in enumerate(cum) if u < c), len(toks) - 1)]
            ids.append(cur)
            if cur == self.eos and not ignore_eos:
                return ids, True
        return ids, False


class ChainSimulatedServer(SimulatedServer):
    """The simulated server answering from a known target's chain (its ``sampled_choice``)."""

    def __init__(
        self, opts: SimOptions, log: LogWriter, on_crash: Callable[[], None], chain: ChainModel
    ) -> None:
        super().__init__(opts, log, on_crash)
        if self.tokens is None:
            raise SystemExit("chain mode needs tokenizer_path (the model's tokenizer)")
        self.chain = chain

    def sampled_choice(
        self, req: dict[str, Any], ask: Ask, prompt_ids: list[int], index: int
    ) -> tuple[TokenCompletion, Completion, list[dict[str, Any]] | None] | None:
        """One choice sampled from the known target's chain, parsed as SGLang parses it (reasoning, then
        tool calls when the request has tools and a tool-call parser is set). The draw depends on the
        messages, seed, choice index and max_tokens: a retry with a larger budget is a fresh draw, as on
        SGLang, whose flashinfer sampler ignores the request seed."""
        assert self.tokens is not None
        key = orjson.dumps(ask.messages) + repr((ask.seed, index, ask.max_tokens)).encode()
        rng = random.Random(hashlib.blake2b(key, digest_size=8).digest())
        top_k, top_p = req.get("top_k"), req.get("top_p")
        sampling = (ask.temperature, int(top_k) if top_k is not None else -1, float(top_p) if top_p else 1.0)
        ids, stopped = self.chain.sample(prompt_ids[-1], rng, ask.max_tokens, ask.ignore_eos, sampling)
        text = self.tokens.tokenizer.decode(ids, skip_special_tokens=True)
        reasoning, content = parse_qwen3_reasoning(text, ask.thinking)
        if reasoning is None:
            reasoning_tokens = 0
        elif self.tokens.think_close_id in ids:
            reasoning_tokens = ids.index(self.tokens.think_close_id) + 1
        else:
            reasoning_tokens = len(ids)
        finish = "stop" if stopped else "length"
        choice_calls = None
        tools = req.get("tools")
        if self.opts.tool_call_parser in ("qwen25", "hermes") and tools and req.get("tool_choice") != "none":
            parsed = parse_qwen25_tool_calls(content, tools)
            if parsed is not None:
                content, found = parsed
                if found:
                    choice_calls = found
                    finish = "tool_calls" if finish == "stop" else finish
        made = Completion(reasoning, content, reasoning_tokens, len(ids), finish)
        matched = self.chain.eos if finish == "stop" else None
        return TokenCompletion(made, ids, matched), made, choice_calls


def chain_server_for(path: str) -> ServerFactory:
    """A server factory answering from the chain at ``path`` (in-thread servers)."""
    chain = ChainModel(path)

    def make(opts: SimOptions, log: LogWriter, on_crash: Callable[[], None]) -> SimulatedServer:
        return ChainSimulatedServer(opts, log, on_crash, chain)

    return make


def chain_server(opts: SimOptions, log: LogWriter, on_crash: Callable[[], None]) -> SimulatedServer:
    """The server hook: a ChainSimulatedServer on the chain at ``$REGEN_SIM_CHAIN``."""
    path = os.environ.get(CHAIN_ENV)
    if not path:
        raise SystemExit(f"{CHAIN_HOOK} needs ${CHAIN_ENV} (the model's chain.json)")
    return chain_server_for(path)(opts, log, on_crash)
