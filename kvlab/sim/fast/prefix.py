"""The prefix cache's pool rules, compiled: :class:`kvlab.prefix_cache.PrefixPool`'s methods on its arrays.

The same flat arrays as the specification (read :mod:`kvlab.prefix_cache` for the rules), packed
for the compiled loop (:mod:`.loop`; built by :func:`.compiled.pool_arrays`, rows named in :mod:`.layout`):

* ``pg`` (int64, shape (4, num_pages + 1)): per page ``ref`` (``PG_REF``), the cached block id
  (``PG_BLOCK``, -1 none) and the free queue's links (``PG_NEXT`` / ``PG_PREV``; column
  ``num_pages`` is the sentinel);
* ``page_of`` (int64, one per block id): the page caching it, or -1;
* ``blk`` (int64, shape (2, total blocks)): per request block slot (CSR) its id (``BL_ID``)
  and the page in its block table (``BL_PAGE``);
* ``rb`` (int64, shape (2, num_requests + 1)): the CSR offsets (``RB_START``) and each
  request's leading blocks entered in the cache (``RB_CACHED``).

Each function is the method of the same name with the loop's counters left to the caller (it
returns the counts they change by); all are inlined into the loop.
"""
from __future__ import annotations

from ..._numba_cache import njit  # first: it gives Numba a writable cache folder, keyed on the sources

from ...prefix_cache import NONE
from .layout import BL_ID, BL_PAGE, PG_BLOCK, PG_NEXT, PG_PREV, PG_REF, RB_CACHED, RB_START

_jit = njit(nogil=True, inline="always")


@_jit
def match(r, max_blocks, pg, page_of, blk, rb):  # pragma: no cover (compiled)
    """``(hit blocks, of them pages other requests hold)`` of request ``r`` if admitted now (changes nothing)."""
    s = rb[RB_START, r]
    hit = shared = 0
    for j in range(min(max(max_blocks, 0), rb[RB_START, r + 1] - s)):
        p = page_of[blk[BL_ID, s + j]]
        if p == NONE:
            break
        hit += 1
        if pg[PG_REF, p] > 0:
            shared += 1
    return hit, shared


@_jit
def _unlink(p, pg):  # pragma: no cover (compiled)
    nxt, prv = pg[PG_NEXT, p], pg[PG_PREV, p]
    pg[PG_NEXT, prv] = nxt
    pg[PG_PREV, nxt] = prv
    pg[PG_NEXT, p] = NONE
    pg[PG_PREV, p] = NONE


@_jit
def _append(p, pg, sentinel):  # pragma: no cover (compiled)
    tail = pg[PG_PREV, sentinel]
    pg[PG_NEXT, tail] = p
    pg[PG_PREV, p] = tail
    pg[PG_NEXT, p] = sentinel
    pg[PG_PREV, sentinel] = p


@_jit
def take_hits(r, num_blocks, pg, page_of, blk, rb):  # pragma: no cover (compiled)
    """Put ``r``'s first ``num_blocks`` cached blocks in its empty table; the cached-free pages it took (pages)."""
    s = rb[RB_START, r]
    taken = 0
    for j in range(num_blocks):
        p = page_of[blk[BL_ID, s + j]]
        if pg[PG_REF, p] == 0:
            _unlink(p, pg)
            taken += 1
        pg[PG_REF, p] += 1
        blk[BL_PAGE, s + j] = p
    rb[RB_CACHED, r] = num_blocks
    return taken


@_jit
def take_pages(r, used, count, sentinel, pg, page_of, blk, rb):  # pragma: no cover (compiled)
    """Append ``count`` pages from the free queue's head to ``r``'s table of ``used``; the cached blocks evicted."""
    s = rb[RB_START, r] + used
    evicted = 0
    for j in range(count):
        p = pg[PG_NEXT, sentinel]
        _unlink(p, pg)
        b = pg[PG_BLOCK, p]
        if b != NONE:
            page_of[b] = NONE
            pg[PG_BLOCK, p] = NONE
            evicted += 1
        pg[PG_REF, p] = 1
        blk[BL_PAGE, s + j] = p
    return evicted


@_jit
def cache_blocks(r, num_full_blocks, pg, page_of, blk, rb):  # pragma: no cover (compiled)
    """Enter ``r``'s blocks up to ``num_full_blocks`` in the cache (an id cached already keeps its page)."""
    s = rb[RB_START, r]
    for j in range(rb[RB_CACHED, r], num_full_blocks):
        p, b = blk[BL_PAGE, s + j], blk[BL_ID, s + j]
        if page_of[b] == NONE and pg[PG_BLOCK, p] == NONE:
            page_of[b] = p
            pg[PG_BLOCK, p] = b
    rb[RB_CACHED, r] = max(rb[RB_CACHED, r], num_full_blocks)


@_jit
def release(r, used, sentinel, pg, blk, rb):  # pragma: no cover (compiled)
    """Drop ``r``'s table of ``used`` pages, last first; ``(pages freed, of them holding a cached block)``."""
    s = rb[RB_START, r]
    freed = cached = 0
    for j in range(used - 1, -1, -1):
        p = blk[BL_PAGE, s + j]
        blk[BL_PAGE, s + j] = NONE
        pg[PG_REF, p] -= 1
        if pg[PG_REF, p] == 0:
            _append(p, pg, sentinel)
            freed += 1
            if pg[PG_BLOCK, p] != NONE:
                cached += 1
    rb[RB_CACHED, r] = 0
    return freed, cached
