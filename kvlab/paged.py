"""The paged KV block pool: which page belongs to which request, and how much is reserved.

A pool of ``num_pages`` pages (``block_size`` tokens each) is one owner array on the array
module (NumPy or CuPy): ``owner[p]`` is the request that holds page ``p``, or ``FREE``. Many
requests are served in one call (:meth:`BlockPool.allocate` takes an owner and a count per
request), as vLLM's ``BlockPool.get_new_blocks`` does for a whole batch.

Besides pages actually held ("used"), a request may hold a *reservation*: a number of pages set
aside for its future at admission (TensorRT-LLM, TGI, the Orca baselines). The pool counts a
request as committing ``max(reserved, used)`` pages; ``num_uncommitted_pages`` is what an
admission check may still promise, and ``num_reserved_unused_pages`` is the waste the brief
is about (pages reserved for a future that has not come).

Errors (``ValueError``): allocating more pages than are free, freeing a page twice, freeing a
page another request owns.
"""
from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np

from . import _validate as v
from .backend import get_xp, to_numpy

FREE = -1


class BlockPool:
    """A pool of KV pages owned by requests ``0 .. num_owners - 1``.

    Parameters
    ----------
    num_pages : int
        Pages in the pool (pages).
    num_owners : int
        Number of distinct requests that may own pages (request ids are ``0 .. num_owners - 1``).
    xp : module, optional
        Array module for the page table (default: :func:`kvlab.backend.get_xp`).

    Examples
    --------
    >>> pool = BlockPool(num_pages=8, num_owners=3, xp=np)
    >>> pool.allocate([0, 2], [3, 2]).tolist()
    [0, 1, 2, 3, 4]
    >>> pool.num_free_pages, pool.used_pages(2)
    (3, 2)
    """

    def __init__(self, *, num_pages: int, num_owners: int, xp: ModuleType | None = None) -> None:
        self.num_pages = v.positive_int(num_pages, "num_pages")
        self.num_owners = v.positive_int(num_owners, "num_owners")
        self.xp = get_xp() if xp is None else xp
        self._owner = self.xp.full(self.num_pages, FREE, dtype=self.xp.int64)
        # Host-side per-owner counters: scheduling decisions read them without a device sync.
        self._used = np.zeros(self.num_owners, dtype=np.int64)
        self._reserved = np.zeros(self.num_owners, dtype=np.int64)
        self._num_used = 0
        self._num_committed = 0

    # ----------------------------------------------------------------- counts (pages)
    @property
    def num_free_pages(self) -> int:
        """Pages held by no request (pages)."""
        return self.num_pages - self._num_used

    @property
    def num_used_pages(self) -> int:
        """Pages held by some request (pages)."""
        return self._num_used

    @property
    def num_committed_pages(self) -> int:
        """Sum over requests of ``max(reserved, used)`` (pages)."""
        return self._num_committed

    @property
    def num_uncommitted_pages(self) -> int:
        """Pages neither held nor promised to any request (pages)."""
        return self.num_pages - self._num_committed

    @property
    def num_reserved_unused_pages(self) -> int:
        """Pages promised to requests but not yet holding KV (pages)."""
        return self._num_committed - self._num_used

    def used_pages(self, owner: int) -> int:
        """Pages held by request ``owner`` (pages)."""
        return int(self._used[owner])

    def reserved_pages(self, owner: int) -> int:
        """Pages reserved for request ``owner`` (pages; 0 when it has no reservation)."""
        return int(self._reserved[owner])

    def block_table(self, owner: int) -> Any:
        """The pages held by request ``owner``, ascending (array of page ids)."""
        self._check_owners(np.asarray([owner]))
        return self.xp.flatnonzero(self._owner == owner)

    # ----------------------------------------------------------------- changes
    def reserve(self, owner: int, pages: int) -> None:
        """Set request ``owner``'s reservation to ``pages`` pages (0 clears it).

        Raises ``ValueError`` when the new commitment would exceed the pool.
        """
        self._check_owners(np.asarray([owner]))
        pages = v.nonnegative_int(pages, "pages")
        used = int(self._used[owner])
        delta = max(pages, used) - max(int(self._reserved[owner]), used)
        if self._num_committed + delta > self.num_pages:
            raise ValueError(f"reserving {pages} pages for request {owner} would commit "
                             f"{self._num_committed + delta} pages of a {self.num_pages}-page pool")
        self._reserved[owner] = pages
        self._num_committed += delta

    def allocate(self, owners: Any, counts: Any) -> Any:
        """Give ``counts[i]`` free pages to request ``owners[i]``, for every ``i`` in one call.

        Parameters
        ----------
        owners : array of int, shape (n,)
            Distinct request ids.
        counts : array of int, shape (n,)
            Pages to give each (pages, >= 0).

        Returns
        -------
        Array of page ids, shape (sum(counts),), grouped by owner in the order given.

        Raises ``ValueError`` when fewer than ``sum(counts)`` pages are free, or when the pages
        beyond the requests' own reservations would eat pages promised to other requests.
        """
        owners_h = np.atleast_1d(np.asarray(to_numpy(owners), dtype=np.int64))
        counts_h = np.atleast_1d(np.asarray(to_numpy(counts), dtype=np.int64))
        self._check_owners(owners_h)
        if owners_h.shape != counts_h.shape or (counts_h < 0).any():
            raise ValueError(f"counts must be one non-negative count per owner, got {counts_h.tolist()} "
                             f"for owners {owners_h.tolist()}")
        if np.unique(owners_h).size != owners_h.size:
            raise ValueError(f"owners must be distinct, got {owners_h.tolist()}")
        total = int(counts_h.sum())
        if total > self.num_free_pages:
            raise ValueError(f"cannot allocate {total} pages: only {self.num_free_pages} of "
                             f"{self.num_pages} are free")
        res, used = self._reserved[owners_h], self._used[owners_h]
        extra = int((np.maximum(res, used + counts_h) - np.maximum(res, used)).sum())
        if self._num_committed + extra > self.num_pages:
            raise ValueError(f"cannot allocate {total} pages: {extra} of them lie beyond the requests' "
                             f"reservations and only {self.num_uncommitted_pages} pages are unpromised")
        xp = self.xp
        pages = xp.flatnonzero(self._owner == FREE)[:total]
        self._owner[pages] = xp.repeat(xp.asarray(owners_h), xp.asarray(counts_h))
        self._change_used(owners_h, counts_h)
        return pages

    def free(self, pages: Any, owner: int) -> None:
        """Return ``pages`` held by request ``owner`` to the pool.

        Raises ``ValueError`` on a page freed twice (already free, or listed twice) or a page
        that another request holds.
        """
        self._check_owners(np.asarray([owner]))
        xp = self.xp
        pages = xp.asarray(pages, dtype=xp.int64).reshape(-1)
        pages_h = to_numpy(pages)
        if ((pages_h < 0) | (pages_h >= self.num_pages)).any():
            raise ValueError(f"page ids must be in [0, {self.num_pages}), got {pages_h.tolist()}")
        if np.unique(pages_h).size != pages_h.size:
            raise ValueError(f"double free: page ids listed twice in {pages_h.tolist()}")
        holders = to_numpy(self._owner[pages])
        if (holders == FREE).any():
            raise ValueError(f"double free: pages {pages_h[holders == FREE].tolist()} are already free")
        if (holders != owner).any():
            bad = holders != owner
            raise ValueError(f"request {owner} frees pages {pages_h[bad].tolist()} held by requests "
                             f"{holders[bad].tolist()}")
        self._owner[pages] = FREE
        self._change_used(np.asarray([owner]), np.asarray([-pages_h.size]))

    def release(self, owner: int) -> int:
        """Free every page request ``owner`` holds and clear its reservation; return the count."""
        held = self.block_table(owner)
        num = int(held.shape[0])
        if num:
            self.free(held, owner)
        self.reserve(owner, 0)
        return num

    # ----------------------------------------------------------------- internals
    def _check_owners(self, owners: np.ndarray) -> None:
        if ((owners < 0) | (owners >= self.num_owners)).any():
            raise ValueError(f"request ids must be in [0, {self.num_owners}), got {owners.tolist()}")

    def _change_used(self, owners: np.ndarray, deltas: np.ndarray) -> None:
        for owner, delta in zip(owners.tolist(), deltas.tolist()):
            before = max(int(self._reserved[owner]), int(self._used[owner]))
            self._used[owner] += delta
            self._num_committed += max(int(self._reserved[owner]), int(self._used[owner])) - before
        self._num_used += int(deltas.sum())

    def check(self) -> None:
        """Recount everything from the page table; ``AssertionError`` if a counter disagrees."""
        owner = to_numpy(self._owner)
        held = np.bincount(owner[owner != FREE], minlength=self.num_owners)
        assert (held == self._used).all(), "per-request page counts disagree with the page table"
        assert int(held.sum()) == self._num_used, "used page count disagrees with the page table"
        assert int(np.maximum(self._reserved, self._used).sum()) == self._num_committed
        assert self._num_committed <= self.num_pages, "pool over-committed"
