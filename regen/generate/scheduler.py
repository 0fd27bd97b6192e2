"""The scheduling loop of one shard: pull the next completion (replaying what the journal holds under
the current fingerprint), send it on the job's own server or a lent one, journal each finished sample at
once (one flush per event-loop tick), hold server-level failures back, and stop the shard when the
circuit breaker trips (``regen.generate.client`` has the failure semantics).

A sample's requests are ``regen.generate.request``'s, its entry ``regen.generate.sample_record``'s.

Each sample is sent as every completion of every sampling variant (``generate.variants``, ``n`` each), in
order. A prompt with several completions is prefilled first by a request of its own, as SGLang's own
``n`` does (``Requests.prefill_prompt``), and its completions go out once that has returned: the radix
cache then serves them the prompt. Sent at once without it, they would each prefill it (SGLang's default
``fcfs`` policy matches a batch's requests against the tree as it was before the batch). SGLang's own ``n``
is not used: one request for all ``n`` copies one seed to all of them and fails or succeeds as a whole;
here each completion has its own seed, retries and journal line. A server launched with
``--disable-radix-cache`` (its ``/server_info``) gets no prefill request: it would be one more prefill.
A sample pulled for a lent server (another slot's, ``lend``) goes there whole, its prefill request with
it; what a lent server leaves unsent when the samples run out, the own server's workers send at once (the
prompt is not in their server's cache).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

import aiohttp

from regen.fingerprint import GenerationSettings, RunSettings, content_digest, request_fingerprint
from regen.generate.journal import Journal, RecordIdentity
from regen.generate.request import Requests, SampleFailed, chat_url
from regen.generate.sample_record import (
    Completion,
    RecordContext,
    VariantRun,
    answer_sample,
    output_tokens,
    prefill_prompt,
)
from regen.journal_lines import FAILED, RECORD
from regen.prompts import request_content, sample_request_fingerprint
from regen.records import FailureEntry, GenerationRecord, record_id
from regen.runconfig import GenerateConfig
from regen.sglang.cache_report import PrefillSaved
from regen.types import Endpoint, Sample

log = logging.getLogger(__name__)


class Lenders(Protocol):
    """Other GPU slots' servers with room to spare (``regen.generate.lending.SlotLenders``): a job whose own
    server is full sends its next samples there, so no GPU drains or idles while samples wait."""

    poll_s: float

    async def spare(self, session: aiohttp.ClientSession) -> list[tuple[Endpoint, int]]:
        """(server, how many more requests this job may send it now) for each server with room."""
        ...

    def close(self) -> None: ...


@dataclass(slots=True)
class ShardStats:
    total: int | None = None
    skipped_resumed: int = 0
    #: journaled under another fingerprint (changed settings or edited prompt): generated again
    regenerated_changed: int = 0
    #: journaled as failures under the current fingerprint: tried again
    retried_failed: int = 0
    completed: int = 0
    failed: int = 0
    truncated: int = 0
    retried_requests: int = 0
    output_tokens: int = 0
    wall_s: float = 0.0
    #: the prompt tokens sent and the part SGLang read from its radix cache (``cached_tokens``)
    prefill: PrefillSaved = field(default_factory=PrefillSaved)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "prefill": self.prefill.to_json()}


def sample_fingerprint(settings: GenerationSettings, sample: Sample) -> str:
    """The sample's request fingerprint under ``settings`` (what the journal replays by)."""
    return sample_request_fingerprint(settings.fingerprint, sample, settings.regenerate)


@dataclass(slots=True)
class Breaker:
    """Server-level failures in a row, with no success between them: at ``threshold`` the server is down."""

    threshold: int
    in_a_row: int = 0

    def success(self) -> None:
        self.in_a_row = 0

    def failure(self) -> bool:
        """Count one; True when the breaker trips."""
        self.in_a_row += 1
        return self.in_a_row >= self.threshold


class ShardRun:
    """The samples of one shard through ``requests``, into ``journal``: each as every completion of every
    sampling variant (``GenerateConfig.variants``)."""

    def __init__(
        self,
        cfg: GenerateConfig,
        settings: RunSettings,
        journal: Journal,
        samples: Iterator[Sample],
        requests: Requests,
        record: RecordContext,
        stats: ShardStats,
        breaker_threshold: int,
        on_exhausted: Callable[[], None] | None = None,
    ) -> None:
        self.cfg = cfg
        # speed: every record carries its variant's settings, serialized once (a Fragment is written as is)
        self.variants = [VariantRun.of(cfg, settings, v) for v in cfg.variants()]
        self.plain_ids = cfg.plain_ids
        self.settings_fingerprint = self.variants[0].settings_fingerprint
        self.journal = journal
        self.samples = samples
        self.requests = requests
        self.record = record
        self.stats = stats
        self.breaker = Breaker(breaker_threshold)
        self.halt = requests.halt
        self.on_exhausted = on_exhausted
        #: every record id of the shard's samples -> its current fingerprint (finalize keeps only these),
        #: and the completion it names
        self.current: dict[str, str] = {}
        self.identities: dict[str, RecordIdentity] = {}
        self.seen: set[str] = set()
        #: the completions still to send of the samples pulled for each server (None: the own; else a
        #: lender's url): a sample's completions go to the server whose radix cache its prefill filled
        self._pending: dict[str | None, deque[Completion]] = {None: deque()}
        #: completion id -> its prompt's prefill request and the server it went to (None: the own; else a
        #: lender's url); a completion sent to that server waits for it
        self._prefills: dict[str, tuple[asyncio.Future[None], str | None]] = {}
        self.held: list[dict[str, Any]] = []  # server-level failures, journaled only if the shard finishes
        self.attempted = 0
        self.exhausted = False  # every sample has been handed out
        self._flush_scheduled = False

    @property
    def shard(self) -> str:
        return self.record.shard

    def next_completion(self, lender: Endpoint | None = None) -> Completion | None:
        """The next completion to send (to ``lender``, or the own server): the next one of the samples
        pulled for that server, else the next sample's first (its request content built once, hashed here
        and sent as it is, its prompt prefilled on that server); replays (skips) what the journal holds.
        Once no sample is left, the own server also takes what lent servers left unsent."""
        where = lender.url if lender is not None else None
        pending = self._pending.setdefault(where, deque())
        while not pending:
            sample = next(self.samples, None)
            if sample is None:
                break
            sid = sample.id
            if sid in self.seen:
                log.warning("shard %s: duplicate sample id %r in the input; sent once", self.shard, sid)
                continue
            self.seen.add(sid)
            to_send = self._to_send(sample)
            if len(to_send) > 1 and self.cfg.regenerate == "last" and self._prefills_first(lender):
                prefill = asyncio.ensure_future(prefill_prompt(self.requests, self.cfg, to_send[0], lender))
                self._prefills.update((c.id, (prefill, where)) for c in to_send)
            pending.extend(to_send)
        if pending:
            return pending.popleft()
        if lender is None and (left := next((q for q in self._pending.values() if q), None)) is not None:
            return left.popleft()  # a lent server's leftovers, sent here at once (its prefill is not here)
        if not any(self._pending.values()) and not self.exhausted:
            self.exhausted = True
            if self.on_exhausted is not None:
                self.on_exhausted()
        return None

    def _prefills_first(self, lender: Endpoint | None) -> bool:
        """Whether a prompt's completions are sent after a prefill request on that server: where it keeps
        SGLang's radix cache (not known: SGLang's default, on)."""
        return self.requests.prefill_first if lender is None else lender.radix_cache is not False

    def _to_send(self, sample: Sample) -> list[Completion]:
        """The sample's completions the journal does not hold under their current fingerprints, in send
        order (variant by variant, k = 0..n-1); every one is noted as current."""
        sid = sample.id
        content = request_content(sample, self.cfg.regenerate)
        digest = content_digest(content)
        out = []
        for run in self.variants:
            variant = run.variant
            for k in range(variant.n):
                key = variant.completion_key(sid, k)
                rid = record_id(sid, variant.name, k, plain=self.plain_ids)
                fingerprint = request_fingerprint(run.settings_fingerprint, key, digest)
                self.current[rid] = fingerprint
                self.identities[rid] = RecordIdentity(sid, variant.name, k)
                outcome = self.journal.outcome_of(fingerprint)
                if outcome == RECORD or (outcome == FAILED and not self.cfg.retry_failed):
                    self.stats.skipped_resumed += 1
                    continue
                if outcome == FAILED:
                    self.stats.retried_failed += 1
                elif rid in self.journal.finished_ids:
                    self.stats.regenerated_changed += 1
                out.append(Completion(sample, run, k, rid, key, fingerprint, content["messages"]))
        return out

    async def worker(self) -> None:
        while self.halt.reason is None:
            nxt = self.next_completion()
            if nxt is None:
                return
            await self.one_sample(nxt, None)

    async def lend(self, lenders: Lenders) -> None:
        """Send samples to other slots' servers while they have room and samples are left; each sample
        still goes out once and lands in this job's journal (exactly-once as with the own server). The
        servers with room are offered to retries too (``Requests.retry_target``) until the shard's last
        request is answered."""
        tasks: set[asyncio.Task[None]] = set()
        try:
            while self.halt.reason is None and (not self.exhausted or self.requests.in_flight):
                await asyncio.sleep(lenders.poll_s)
                offers = await lenders.spare(self.requests.session)
                self.requests.offer(offers)  # a retry may go there while the own server is full
                for lender, room in offers if not self.exhausted else ():
                    # no more than its window lets this job have in flight there (regen.generate.pacing)
                    room = min(room, self.requests.window(chat_url(lender.url)).room)
                    for _ in range(room):
                        nxt = None if self.halt.reason is not None else self.next_completion(lender)
                        if nxt is None:
                            break
                        task = asyncio.create_task(self.one_sample(nxt, lender))
                        tasks.add(task)
                        task.add_done_callback(tasks.discard)
            if tasks:
                await asyncio.gather(*tasks)
        finally:
            self.requests.offer([])
            for task in tasks:
                task.cancel()

    async def one_sample(self, c: Completion, lender: Endpoint | None) -> None:
        prefill = self._prefills.pop(c.id, None)
        where = lender.url if lender is not None else None
        if prefill is not None and prefill[1] == where:  # another server has not seen the prompt: no waiting
            await asyncio.shield(prefill[0])
        self.attempted += 1
        try:
            outcome = await answer_sample(self.requests, self.cfg, self.record, c, lender)
        except SampleFailed as exc:
            entry = self.on_failure(c, exc)
        else:
            entry = self.on_answer(outcome)
        if entry is None:
            return
        self.stamp(entry, c)
        self.journal.append(entry, flush=False)
        self._schedule_flush()

    def on_answer(self, outcome: GenerationRecord | FailureEntry) -> dict[str, Any]:
        self.breaker.success()
        if isinstance(outcome, FailureEntry):  # dropped under truncation
            self.stats.failed += 1
            self.stats.truncated += 1
            return outcome.journal_entry()
        self.stats.completed += 1
        self.stats.output_tokens += output_tokens(outcome)
        if outcome.truncated:
            self.stats.truncated += 1
        return outcome.journal_entry()

    def on_failure(self, c: Completion, exc: SampleFailed) -> dict[str, Any] | None:
        """A client error is the completion's own terminal failure; a server-level one is held back
        (journaled only when the shard finishes) and counts towards the breaker."""
        err = exc.err
        if err.category == "client_error":
            self.breaker.success()
            self.stats.failed += 1
            return c.failure(f"client_error: {err.detail}", exc.attempts, str(err)).journal_entry()
        held = c.failure(err.category, exc.attempts, str(err)).journal_entry()
        self.stamp(held, c)
        self.held.append(held)
        if self.breaker.failure():
            self.halt.stop(
                f"{self.breaker.in_a_row} samples in a row failed at server level "
                f"after {self.cfg.max_attempts} attempts each; last: {err}"
            )
        return None

    def stamp(self, entry: dict[str, Any], c: Completion) -> None:
        """Add what decided the entry: its fingerprints (and, on records, its variant's settings)."""
        entry["fingerprint"] = c.fingerprint
        entry["settings_fingerprint"] = c.variant.settings_fingerprint
        if entry["kind"] == RECORD:
            entry["settings"] = c.variant.settings_json
        else:
            entry["at"] = time.time()

    def _schedule_flush(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        try:
            self.journal.flush()
        except OSError as exc:  # e.g. disk full: stop sending; the caller's final flush raises it
            if self.halt.reason is None:
                log.error("shard %s: cannot write the journal %s: %s", self.shard, self.journal.path, exc)
                self.halt.stop(f"cannot write the journal {self.journal.path}: {exc}")

    def drop_prefills(self) -> None:
        """Cancel the prefill requests of completions a stopped shard will not send."""
        for prefill, _ in self._prefills.values():
            prefill.cancel()
        self._prefills.clear()

    def failure(self) -> str | None:
        """Why the shard failed at the end (None: it finishes, its held failures isolated poison samples)."""
        if self.halt.reason is not None:
            return self.halt.reason
        held = len(self.held)
        if not held:
            return None
        last = self.held[-1]["error"]
        if self.stats.completed == 0:
            return f"every request failed at server level ({held} samples); last: {last}"
        if held * 2 > self.attempted:
            return f"{held} of {self.attempted} samples failed at server level; last: {last}"
        return None
