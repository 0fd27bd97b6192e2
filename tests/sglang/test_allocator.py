"""The caching-allocator simulation (regen/sglang/allocator.py) against the rules of PyTorch's
CUDACachingAllocator.cpp it follows, on sequences the tests make."""

from __future__ import annotations

from regen.sglang.allocator import (
    LARGE_BUFFER,
    ROUND_LARGE,
    SMALL_BUFFER,
    CachingAllocator,
    allocation_size,
    round_size,
)

MIB = 1 << 20


def test_requests_round_to_512_bytes_and_segments_by_size_class() -> None:
    assert round_size(1) == 512 and round_size(513) == 1024
    assert allocation_size(MIB) == SMALL_BUFFER  # up to 1 MiB: a 2 MiB small segment
    assert allocation_size(MIB + 512) == LARGE_BUFFER  # under 10 MiB: a 20 MiB segment
    assert allocation_size(10 * MIB) == 10 * MIB  # from 10 MiB: its own segment, rounded to 2 MiB
    assert allocation_size(10 * MIB + 1) == 10 * MIB + ROUND_LARGE


def test_a_large_tail_over_1_mib_is_split_off_and_stays_reserved_when_its_neighbour_lives() -> None:
    a = CachingAllocator()
    h = a.malloc(258 * MIB + 3 * MIB // 4)  # a 260 MiB segment, 1.25 MiB left: split
    assert a.reserved == 260 * MIB and a.inactive_split == 260 * MIB - (258 * MIB + 3 * MIB // 4)
    a.empty_cache()
    assert a.reserved == 260 * MIB  # the tail is in a segment with a live block
    a.free(h)
    a.empty_cache()
    assert a.reserved == 0 and a.inactive_split == 0


def test_a_tail_of_1_mib_or_less_is_handed_out_whole() -> None:
    a = CachingAllocator()
    a.malloc(129 * MIB + 3 * MIB // 8)  # 130 MiB segment, 0.625 MiB left: not split
    assert a.inactive_split == 0 and a.allocated == 130 * MIB


def test_best_fit_splits_the_smallest_free_block_and_strands_the_rest() -> None:
    a = CachingAllocator()
    big, small = a.malloc(200 * MIB), a.malloc(100 * MIB)
    a.free(big)
    a.free(small)
    half = a.malloc(60 * MIB)  # best fit: the 100 MiB block, split 60 + 40
    a.empty_cache()  # the 200 MiB segment goes back; the 40 MiB tail stays with its live neighbour
    assert a.reserved == 100 * MIB and a.inactive_split == 40 * MIB
    a.free(half)
    a.empty_cache()
    assert a.reserved == 0


def test_freed_neighbours_merge_back_into_one_block() -> None:
    a = CachingAllocator()
    x = a.malloc(300 * MIB)
    a.free(x)
    parts = [a.malloc(100 * MIB) for _ in range(3)]
    assert a.reserved == 300 * MIB
    for h in (parts[0], parts[2], parts[1]):
        a.free(h)
    assert a.inactive_split == 0  # one free block again
    a.empty_cache()
    assert a.reserved == 0


def test_small_requests_share_2_mib_segments() -> None:
    a = CachingAllocator()
    hs = [a.malloc(300 * 1024) for _ in range(6)]  # 6 x 300 KiB in one 2 MiB small segment
    assert a.segments == 1 and a.reserved == SMALL_BUFFER
    a.malloc(300 * 1024)
    assert a.segments == 2
    for h in hs:
        a.free(h)
    a.empty_cache()
    assert a.segments == 1
