"""BlockPool: batched allocation, freeing, reservations, and the errors it must raise."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from kvlab.backend import to_numpy
from kvlab.paged import BlockPool


def test_allocate_many_in_one_call(xp):
    pool = BlockPool(num_pages=10, num_owners=4, xp=xp)
    pages = to_numpy(pool.allocate([2, 0, 3], [3, 0, 2]))
    assert pages.tolist() == [0, 1, 2, 3, 4]
    assert to_numpy(pool.block_table(2)).tolist() == [0, 1, 2]
    assert to_numpy(pool.block_table(3)).tolist() == [3, 4]
    assert pool.used_pages(0) == 0
    assert (pool.num_free_pages, pool.num_used_pages) == (5, 5)
    pool.free(xp.asarray([1]), 2)
    # The freed page is handed out first next time (lowest free id).
    assert to_numpy(pool.allocate([1], [2])).tolist() == [1, 5]
    pool.check()


def test_reservations_and_reserved_but_unused(xp):
    pool = BlockPool(num_pages=10, num_owners=3, xp=xp)
    pool.reserve(0, 4)
    pool.allocate([0], [1])
    assert pool.num_reserved_unused_pages == 3
    assert pool.num_uncommitted_pages == 6
    pool.allocate([0], [4])  # beyond its reservation: commits 5
    assert (pool.num_committed_pages, pool.num_reserved_unused_pages) == (5, 0)
    pool.reserve(1, 5)
    assert pool.num_uncommitted_pages == 0
    with pytest.raises(ValueError, match="reserv"):
        pool.allocate([2], [1])  # 5 pages are physically free but all promised to request 1
    assert pool.release(0) == 5 and pool.num_committed_pages == 5
    with pytest.raises(ValueError, match="commit"):
        pool.reserve(2, 6)
    pool.check()


def test_errors(xp):
    pool = BlockPool(num_pages=4, num_owners=2, xp=xp)
    with pytest.raises(ValueError, match="only 4 of 4 are free"):
        pool.allocate([0, 1], [3, 2])
    pages = pool.allocate([0, 1], [2, 2])
    with pytest.raises(ValueError, match="held by requests"):
        pool.free(pages[2:], 0)
    pool.free(pages[:1], 0)
    with pytest.raises(ValueError, match="double free"):
        pool.free(pages[:1], 0)
    with pytest.raises(ValueError, match="double free"):
        pool.free(xp.asarray([1, 1]), 0)
    with pytest.raises(ValueError, match="request ids"):
        pool.allocate([5], [1])
    with pytest.raises(ValueError, match="num_pages"):
        BlockPool(num_pages=0, num_owners=1)
    pool.check()


@settings(max_examples=60)
@given(st.lists(st.tuples(st.sampled_from(["alloc", "free", "release", "reserve"]),
                          st.integers(0, 4), st.integers(0, 6)), max_size=40))
def test_random_operations_conserve_pages(ops):
    """Against a plain dict model: every page is free or held by exactly one owner."""
    pool = BlockPool(num_pages=12, num_owners=5, xp=np)
    held: dict[int, set[int]] = {o: set() for o in range(5)}
    reserved = dict.fromkeys(range(5), 0)
    for op, owner, k in ops:
        committed = sum(max(reserved[o], len(held[o])) for o in range(5))
        if op == "alloc":
            extra = max(reserved[owner], len(held[owner]) + k) - max(reserved[owner], len(held[owner]))
            if k > 12 - sum(map(len, held.values())) or committed + extra > 12:
                with pytest.raises(ValueError):
                    pool.allocate([owner], [k])
            else:
                held[owner] |= set(pool.allocate([owner], [k]).tolist())
        elif op == "free":
            mine = sorted(held[owner])[:k]
            pool.free(np.asarray(mine, dtype=np.int64), owner)
            held[owner] -= set(mine)
        elif op == "release":
            assert pool.release(owner) == len(held[owner])
            held[owner], reserved[owner] = set(), 0
        else:
            delta = max(k, len(held[owner])) - max(reserved[owner], len(held[owner]))
            if committed + delta > 12:
                with pytest.raises(ValueError):
                    pool.reserve(owner, k)
            else:
                pool.reserve(owner, k)
                reserved[owner] = k
        pool.check()
        all_pages = [p for s in held.values() for p in s]
        assert len(all_pages) == len(set(all_pages))  # no page owned twice
        assert pool.num_used_pages == len(all_pages) <= pool.num_pages
        for o in range(5):
            assert set(pool.block_table(o).tolist()) == held[o]


def test_docstring_examples():
    import doctest

    import kvlab.paged

    assert doctest.testmod(kvlab.paged, extraglobs={"np": np}).failed == 0
