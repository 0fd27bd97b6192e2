"""SGLang's radix (prefix) cache as the simulated server models it: what of a prompt is served from the
cache instead of prefilled, and what it reports of that.

SGLang 0.5.17 matches a request's prompt against the radix tree when it schedules it (``Req.
init_next_round_input``: at most all but the prompt's last token, which is computed for the logits) and
inserts the prompt once its prefill batch has run (``cache_unfinished_req``). Under the default policy,
``fcfs``, requests admitted in one prefill batch each match the tree as it was before that batch: n copies
of a prompt sent at once prefill it n times (measured on an H100: regen's 3,200 completions of 800
prompts, a prompt's four sent together, found 256 of 409,600 prompt tokens cached). Only the cache-aware
policies (``lpm``, ``dfs-weight``) schedule one of such a group first (``_compute_prefix_matches``,
in-batch prefix caching), and ``lpm`` falls back to ``fcfs`` past 128 waiting requests. Tokens leave the
tree least recently used first when the KV pool needs room. ``meta_info.cached_tokens`` counts the tokens
served from it; the OpenAI usage shows it as ``usage.prompt_tokens_details.cached_tokens`` only when the
server runs with ``--enable-cache-report`` and the count is above 0 (``UsageProcessor._details_if_cached``),
else ``prompt_tokens_details`` is null.

The model here: a prompt (its token ids, or a stand-in sequence without a tokenizer) is cut into blocks
of :data:`BLOCK` tokens, each named by a hash chained over the blocks before it; a prompt's cached
tokens are those of its leading blocks already held (a repeated prompt: all of it, less the last
token), and its blocks are held once its batch has run (:meth:`PrefixCache.commit`, when the server logs
the batch's ``Prefill batch`` line), least recently used leaving first past ``capacity_tokens``. A
prompt that shares only part of a block with another is counted to the last whole common block (SGLang
at page size 1 counts to the token): a few tokens short, never more than it would. With ``--page-size``
P, SGLang's tree matches whole pages only (``RadixCache.match_prefix`` cuts the key to a multiple of P), so
a repeated prompt of n tokens finds floor((n - 1) / P) x P of them cached: 64 of a 128-token prompt at
page 64 (measured on an H200: regen's 3,200 completions of 800 such prompts read 204,800 cached tokens).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

BLOCK = 16


def served_tokens(prompt_tokens: int, matched: int, page: int) -> int:
    """What SGLang's tree serves of a prompt whose first ``matched`` tokens it holds: at most all but the
    prompt's last token (computed for the logits), cut to whole pages of ``page`` tokens."""
    return max(0, min(matched, prompt_tokens - 1)) // page * page


class PrefixCache:
    """The radix cache of one simulated server (see the module docstring); counts what it served."""

    def __init__(self, capacity_tokens: int, page_size: int = 1) -> None:
        self.capacity = capacity_tokens
        self.page = max(1, page_size)
        self._blocks: OrderedDict[int, int] = OrderedDict()  # chained block hash -> its tokens, LRU first
        self._held = 0
        self._batch: list[tuple[int, int]] = []  # the blocks of the prompts prefilled in the running batch
        self.prompt_tokens = 0
        self.cached_tokens = 0

    def serve(self, prompt: Sequence[Hashable]) -> int:
        """The tokens of ``prompt`` served from the cache (SGLang's ``cached_tokens``); the prompt is in
        the cache once its batch has run (:meth:`commit`)."""
        n = len(prompt)
        chain: list[tuple[int, int]] = []
        h = 0
        for start in range(0, n, BLOCK):
            block = tuple(prompt[start : start + BLOCK])
            h = hash((h, block))
            chain.append((h, len(block)))
        matched = 0
        for h, size in chain:
            if h not in self._blocks:
                break
            matched += size
        self._batch.extend(chain)
        cached = served_tokens(n, matched, self.page)
        self.prompt_tokens += n
        self.cached_tokens += cached
        return cached

    def commit(self) -> None:
        """The running prefill batch has run: its prompts are in the tree (``cache_unfinished_req``)."""
        for h, size in self._batch:
            if h in self._blocks:
                self._blocks.move_to_end(h)
            else:
                self._blocks[h] = size
                self._held += size
        self._batch.clear()
        while self._held > self.capacity and self._blocks:
            self._held -= self._blocks.popitem(last=False)[1]

    def stats(self) -> dict[str, Any]:
        """Prompt tokens asked for, served from the cache, and prefilled (the rest), so far."""
        return {
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "prefilled_tokens": self.prompt_tokens - self.cached_tokens,
            "held_tokens": self._held,
        }


def stand_in_prompt(messages: list[Any]) -> list[Hashable]:
    """A prompt's token sequence without a tokenizer, as ``parsers.count_prompt_tokens`` counts it: three
    tokens to start, four per turn (its role), one per word of its content."""
    out: list[Hashable] = ["<start>"] * 3
    for m in messages:
        role = m.get("role") if isinstance(m, dict) else None
        content = m.get("content") if isinstance(m, dict) else None
        out += [("role", role)] * 4
        if isinstance(content, str):
            out += content.split()
    return out


@dataclass(slots=True)
class PrefillWindow:
    """The prefills since the server's last ``Prefill batch`` line, as SGLang's line counts them
    (``#new-seq``, ``#new-token``, ``#cached-token``). A request with ``n`` > 1 is, in SGLang's
    ``TokenizerManager``, one prefix request (``max_new_tokens`` 0) and then ``n`` copies, each of which
    finds the whole pages of all of the prompt but its last token cached."""

    seqs: int = 0
    new_tokens: int = 0
    cached_tokens: int = 0

    def add(self, prompt_tokens: int, cached: int, n: int, page: int | None) -> None:
        """One request of ``prompt_tokens`` of which ``cached`` came from the cache, with ``n`` choices, on a
        radix cache of ``page``-token pages; without one (``page`` None: ``--disable-radix-cache``,
        SGLang's ``ChunkCache``) each copy computes the whole prompt again."""
        self.seqs += 1
        self.new_tokens += prompt_tokens - cached
        self.cached_tokens += cached
        if n > 1:
            reused = 0 if page is None else served_tokens(prompt_tokens, prompt_tokens, page)
            self.seqs += n
            self.new_tokens += n * (prompt_tokens - reused)
            self.cached_tokens += n * reused

    def line(self, gap_s: float, token_usage: float, running: int, queued: int) -> str:
        """SGLang's ``Prefill batch`` line (``SchedulerMetricsReporter.report_prefill_stats``) for these
        prefills as one batch, ``gap_s`` after the last line."""
        return (
            f"Prefill batch, #new-seq: {self.seqs}, #new-token: {self.new_tokens}, "
            f"#cached-token: {self.cached_tokens}, token usage: {token_usage:.2f}, #running-req: {running}, "
            f"#queue-req: {queued}, #pending-token: 0, cuda graph: False, "
            f"input throughput (token/s): {self.new_tokens / gap_s:.2f}"
        )
