"""PyTorch's CUDA caching allocator, as a pure simulation (no torch): what a sequence of allocations and
frees leaves reserved on the device.

Followed from ``c10/cuda/CUDACachingAllocator.cpp`` (PyTorch 2.11, the one SGLang 0.5.17 pins), with its
default configuration (no ``PYTORCH_CUDA_ALLOC_CONF``: SGLang sets none; no expandable segments, no
``max_split_size``, no garbage-collection threshold, one stream):

- ``round_size``: a request is rounded up to a multiple of ``kMinBlockSize`` (512 B).
- Two pools: requests up to ``kSmallSize`` (1 MiB) come from the small pool, larger ones from the large pool.
- ``get_free_block``: best fit -- the smallest free block of the pool at least as large as the request,
  the lowest address among equal sizes (``BlockComparatorSize``).
- ``get_allocation_size``: with no fitting free block a new segment is ``cudaMalloc``'d: ``kSmallBuffer``
  (2 MiB) for a small request, ``kLargeBuffer`` (20 MiB) for one under ``kMinLargeAlloc`` (10 MiB), else the
  request rounded up to ``kRoundLarge`` (2 MiB).
- ``should_split``: the block handed out is split when what remains is at least 512 B (small pool) or more
  than ``kSmallSize`` (large pool); otherwise the whole block is handed out (and counted as allocated).
- ``free_block``: a freed block merges with its free neighbours in the same segment.
- ``empty_cache`` (``release_cached_blocks``): only segments that are one free block are given back; free
  blocks inside a segment that still holds a live block stay reserved ("inactive split" bytes).

Where ``cudaMalloc`` places a segment is the driver's choice, not PyTorch's; it matters only through the
best-fit tie-break among free blocks of equal size (the lowest address wins). Modelled as a top-down
virtual-address heap: a new segment takes the top of the highest free range that holds it, a released
segment's range is free again. Measured (issue 49, on an H200 with torch 2.11): the driver handed out
successive segments at falling addresses (16 of 17 steps in the 120b's load); with top-down placement the
simulation of gpt-oss's load equals PyTorch's own allocator to the byte (measurements/
mxfp4-repack-replay-2026-12-04.json), where bottom-up placement leaves the 120b 5.1 GB more reserved.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

MIN_BLOCK = 512  # kMinBlockSize
SMALL_SIZE = 1 << 20  # kSmallSize
SMALL_BUFFER = 2 << 20  # kSmallBuffer
LARGE_BUFFER = 20 << 20  # kLargeBuffer
MIN_LARGE_ALLOC = 10 << 20  # kMinLargeAlloc
ROUND_LARGE = 2 << 20  # kRoundLarge
ADDRESS_SPACE = 1 << 47  # the simulated device virtual-address range


def round_size(size: int) -> int:
    return MIN_BLOCK if size < MIN_BLOCK else -(-size // MIN_BLOCK) * MIN_BLOCK


def allocation_size(size: int) -> int:
    """The segment ``cudaMalloc``'d for a (rounded) request no free block fits."""
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return -(-size // ROUND_LARGE) * ROUND_LARGE


@dataclass(slots=True)
class _Block:
    addr: int
    size: int
    segment: int
    small: bool
    allocated: bool = False
    prev: _Block | None = None
    next: _Block | None = None

    @property
    def is_split(self) -> bool:
        return self.prev is not None or self.next is not None


@dataclass
class CachingAllocator:
    """One device's caching allocator. ``malloc`` returns a handle, ``free`` takes it back."""

    _free: dict[bool, list[tuple[int, int]]] = field(default_factory=lambda: {True: [], False: []})
    _by_addr: dict[int, _Block] = field(default_factory=dict)
    _segments: dict[int, int] = field(default_factory=dict)  # segment base address -> bytes
    _live: dict[int, _Block] = field(default_factory=dict)
    _next_handle: int = 0
    _va_free: list[tuple[int, int]] = field(default_factory=lambda: [(0, ADDRESS_SPACE)])
    peak_reserved: int = 0
    peak_allocated: int = 0
    allocated: int = 0

    # ---------------------------------------------------------------- the two calls
    def malloc(self, nbytes: int) -> int:
        size = round_size(nbytes)
        small = size <= SMALL_SIZE
        block = self._take_free(size, small)
        if block is None:
            seg = allocation_size(size)
            base = self._place(seg)
            self._segments[base] = seg
            block = _Block(base, seg, base, small)
            self._by_addr[base] = block
            self.peak_reserved = max(self.peak_reserved, self.reserved)
        remaining = block.size - size
        if (small and remaining >= MIN_BLOCK) or (not small and remaining > SMALL_SIZE):
            rest = _Block(block.addr + size, remaining, block.segment, small, prev=block, next=block.next)
            if block.next is not None:
                block.next.prev = rest
            block.next = rest
            block.size = size
            self._by_addr[rest.addr] = rest
            self._insert_free(rest)
        block.allocated = True
        self.allocated += block.size
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        handle = self._next_handle
        self._next_handle += 1
        self._live[handle] = block
        return handle

    def free(self, handle: int) -> None:
        block = self._live.pop(handle)
        block.allocated = False
        self.allocated -= block.size
        for neighbour in (block.prev, block.next):
            if neighbour is not None and not neighbour.allocated:
                self._remove_free(neighbour)
                block = self._merge(block, neighbour)
        self._insert_free(block)

    def empty_cache(self) -> None:
        """``torch.cuda.empty_cache()``: give back every segment that is one free block."""
        for small in (True, False):
            for _size, addr in list(self._free[small]):
                block = self._by_addr[addr]
                if not block.is_split:
                    self._remove_free(block)
                    del self._by_addr[addr]
                    self._unplace(block.segment, self._segments.pop(block.segment))

    # ---------------------------------------------------------------- what it holds
    @property
    def reserved(self) -> int:
        return sum(self._segments.values())

    @property
    def inactive_split(self) -> int:
        return sum(
            size
            for small in (True, False)
            for size, addr in self._free[small]
            if self._by_addr[addr].is_split
        )

    @property
    def segments(self) -> int:
        return len(self._segments)

    # ---------------------------------------------------------------- internals
    def _place(self, size: int) -> int:
        """cudaMalloc: the top of the highest free address range that holds ``size``."""
        i = max(
            (j for j, (lo, hi) in enumerate(self._va_free) if hi - lo >= size),
            key=lambda j: self._va_free[j][1],
        )
        lo, hi = self._va_free[i]
        if hi - size > lo:
            self._va_free[i] = (lo, hi - size)
        else:
            del self._va_free[i]
        return hi - size

    def _unplace(self, base: int, size: int) -> None:
        """cudaFree: the range is free again, joined with free neighbours."""
        ranges = sorted([*self._va_free, (base, base + size)])
        merged: list[tuple[int, int]] = []
        for lo, hi in ranges:
            if merged and merged[-1][1] == lo:
                merged[-1] = (merged[-1][0], hi)
            else:
                merged.append((lo, hi))
        self._va_free = merged

    def _take_free(self, size: int, small: bool) -> _Block | None:
        pool = self._free[small]
        i = bisect.bisect_left(pool, (size, -1))
        if i == len(pool):
            return None
        _, addr = pool.pop(i)
        return self._by_addr[addr]

    def _insert_free(self, block: _Block) -> None:
        bisect.insort(self._free[block.small], (block.size, block.addr))

    def _remove_free(self, block: _Block) -> None:
        pool = self._free[block.small]
        pool.pop(bisect.bisect_left(pool, (block.size, block.addr)))

    def _merge(self, block: _Block, other: _Block) -> _Block:
        first, second = (block, other) if block.addr < other.addr else (other, block)
        del self._by_addr[second.addr]
        first.size += second.size
        first.next = second.next
        if second.next is not None:
            second.next.prev = first
        return first
