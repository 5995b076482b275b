"""The paged KV pool with a prefix cache: shared full blocks, reference counts, an LRU free queue.

The rules are vLLM V1's automatic prefix caching (``vllm/v1/core/kv_cache_manager.py``,
``block_pool.py`` and ``single_type_kv_cache_manager.py`` of vllm-project/vllm, read at commit
003df296 of ``main``, after v0.11):

* **Block identities.** Block ``j`` of request ``i`` (tokens ``[j*B, (j+1)*B)``, ``B`` =
  ``block_size``) has an integer id ``ids[start[i] + j]`` (:class:`BlockIds`, built by
  :mod:`kvlab.prefix_blocks`). Equal ids mean equal tokens *and* equal prefix (vLLM chains each
  block's hash to its parent's), so a cache hit is the longest run of leading blocks whose ids are
  cached. Ids are dense, ``0 .. num_ids - 1``.
* **Pages.** Each page is in one of three states: *in use* (``ref[p] > 0``: in the block table of
  ``ref[p]`` requests), *cached-free* (``ref[p] == 0`` and it holds block ``block_of[p] >= 0``:
  evictable, still hittable) or *free* (``ref[p] == 0``, no block). Every page with
  ``ref == 0`` is in one free queue, a doubly linked list over page ids (``next_``/``prev_``,
  sentinel ``num_pages``) that starts as ``0 .. num_pages - 1``. Conservation:
  free + cached-free + in use == ``num_pages``.
* **Hit** (:meth:`PrefixPool.match`, :meth:`PrefixPool.take_hits`): at (re)admission a request's
  hit is its longest cached prefix of full blocks, at most ``(context - 1) // B`` blocks so that
  at least one token is computed (``get_computed_blocks``: ``max_cache_hit_length =
  request.num_tokens - 1``). A hit page is appended to its block table with ``ref += 1``; a
  cached-free one leaves the free queue first (it now counts as in use, toward the hitter).
* **Allocation** (:meth:`PrefixPool.allocate`): a new page is the head of the free queue; if it
  holds a cached block, that block is evicted (its id is no longer cached): least recently freed
  first.
* **Caching** (:meth:`PrefixPool.cache_blocks`): when a chunk is scheduled, every block that the
  computed tokens plus the chunk fill is entered in the cache (``allocate_slots`` calls
  ``cache_blocks`` up to ``num_computed + num_new`` tokens), unless its id is cached already (the
  first page to cache an id keeps it; vLLM also keeps duplicates, kvlab does not).
* **Free** (:meth:`PrefixPool.release`): a request's pages are released in reverse order
  (``KVCacheManager.free``: "tail blocks are evicted first"); a page whose ``ref`` drops to 0
  goes to the tail of the free queue, keeping its block (a preempted request finds its own full
  blocks on return, if not evicted meanwhile). A page another request still references stays in use.
* **Commitment.** As :class:`kvlab.paged.BlockPool`, generalised to shared pages: committed =
  pages in use + sum over requests of ``max(0, reserved - used)``. With no sharing that is
  ``BlockPool``'s sum of ``max(reserved, used)``. Cached-free pages are uncommitted: allocation
  may evict them.

All state is flat int64 arrays (no Python object per page), so the same rules port to a compiled
loop: per page ``ref``, ``block_of``, ``next_``/``prev_`` (size ``num_pages + 1`` with the
sentinel); per block id ``page_of``; per request block slot ``page_at`` (CSR with
``BlockIds.start``); per request ``_used``, ``_cached``, ``_reserved``; scalars ``_num_in_use``,
``_num_table``, ``_slack``, ``_num_cached_free``. Each method is a loop over ints. Where the engine
calls them (:mod:`kvlab.sim.reference`): ``ReferenceEngine._match`` (before each admission check:
the cap ``(prompt + generated - 1) // block_size`` and the ``shared`` credit passed to
``_can_admit``), ``_take_hits`` (right after ``Request.admit``, before ``_reserve``: sets
``computed_tokens``), ``_allocate`` (``cache_blocks`` after the chunk's pages), and ``release`` on
finish, preemption and abort, as without caching. Errors are ``ValueError`` (allocating more pages than are free or unpromised) or
``AssertionError`` from :meth:`PrefixPool.check`.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import _validate as v

NONE = -1


@dataclass(frozen=True)
class BlockIds:
    """Block identities of every request, in one flat array (CSR).

    Attributes
    ----------
    ids : ndarray of int64
        Block ``j`` of request ``i`` is ``ids[start[i] + j]``, dense in ``[0, num_ids)``.
    start : ndarray of int64, shape (num_requests + 1,)
        Offsets; request ``i`` has ``start[i + 1] - start[i]`` blocks (enough for its longest context).
    num_ids : int
        Distinct ids.
    """

    ids: np.ndarray
    start: np.ndarray
    num_ids: int

    @property
    def num_requests(self) -> int:
        return int(self.start.size - 1)

    def of(self, i: int) -> np.ndarray:
        """Request ``i``'s block ids, in order."""
        return self.ids[self.start[i]:self.start[i + 1]]


class PrefixPool:
    """A KV pool of ``num_pages`` pages shared by the requests of ``blocks`` (see the module note).

    It answers :class:`kvlab.paged.BlockPool`'s counts and changes (``reserve``, ``allocate``,
    ``release``, ``used_pages``, ``num_uncommitted_pages``, ...) plus the prefix cache's own.
    """

    def __init__(self, *, num_pages: int, blocks: BlockIds) -> None:
        self.num_pages = n = v.positive_int(num_pages, "num_pages")
        self.blocks = blocks
        self.num_owners = blocks.num_requests
        self.ref = np.zeros(n, dtype=np.int64)  # requests referencing each page
        self.block_of = np.full(n, NONE, dtype=np.int64)  # cached block id each page holds
        self.page_of = np.full(blocks.num_ids, NONE, dtype=np.int64)  # page caching each block id
        self.next_ = np.append(np.arange(1, n + 1), 0).astype(np.int64)  # free queue: sentinel n
        self.prev_ = np.append(np.arange(-1, n), n - 1).astype(np.int64)
        self.prev_[0] = n
        self.page_at = np.full(blocks.ids.size, NONE, dtype=np.int64)  # block tables, CSR like blocks.ids
        self._used = np.zeros(self.num_owners, dtype=np.int64)  # block-table length per request
        self._cached = np.zeros(self.num_owners, dtype=np.int64)  # leading blocks entered in the cache
        self._reserved = np.zeros(self.num_owners, dtype=np.int64)
        self._num_in_use = 0
        self._num_table = 0  # sum of block-table lengths (shared pages counted per referencer)
        self._slack = 0  # sum over requests of max(0, reserved - used)
        self._num_cached_free = 0

    # ----------------------------------------------------------------- counts (pages)
    @property
    def num_free_pages(self) -> int:
        """Pages no request references, cached or not (pages)."""
        return self.num_pages - self._num_in_use

    @property
    def num_used_pages(self) -> int:
        """Distinct pages some request references (pages)."""
        return self._num_in_use

    @property
    def num_cached_free_pages(self) -> int:
        """Pages no request references that still hold a cached block (pages)."""
        return self._num_cached_free

    @property
    def num_shared_saved_pages(self) -> int:
        """Pages sharing saves now: block-table entries minus distinct pages in use (pages)."""
        return self._num_table - self._num_in_use

    @property
    def num_committed_pages(self) -> int:
        """Pages in use plus every request's reservation beyond its table (pages)."""
        return self._num_in_use + self._slack

    @property
    def num_uncommitted_pages(self) -> int:
        """Pages neither in use nor promised (cached-free pages included: allocation evicts them)."""
        return self.num_pages - self.num_committed_pages

    def used_pages(self, owner: int) -> int:
        """Length of request ``owner``'s block table (pages, shared ones included)."""
        return int(self._used[owner])

    def reserved_pages(self, owner: int) -> int:
        return int(self._reserved[owner])

    def block_table(self, owner: int) -> np.ndarray:
        """The pages of request ``owner``'s blocks, in block order."""
        s = int(self.blocks.start[owner])
        return self.page_at[s:s + int(self._used[owner])].copy()

    # ----------------------------------------------------------------- the prefix cache
    def match(self, owner: int, max_blocks: int) -> tuple[int, int]:
        """Request ``owner``'s cache hit if it were admitted now, without changing anything.

        Returns ``(blocks, shared)``: the longest run of its leading blocks, at most
        ``max_blocks``, whose ids are cached; and how many of those pages other requests hold
        (they cost the pool nothing more).
        """
        s, e = int(self.blocks.start[owner]), int(self.blocks.start[owner + 1])
        hit = shared = 0
        for j in range(min(max(max_blocks, 0), e - s)):
            p = self.page_of[self.blocks.ids[s + j]]
            if p == NONE:
                break
            hit += 1
            shared += int(self.ref[p] > 0)
        return hit, shared

    def take_hits(self, owner: int, num_blocks: int) -> None:
        """Append request ``owner``'s first ``num_blocks`` cached blocks to its (empty) block table."""
        assert self._used[owner] == 0 and self._reserved[owner] == 0, owner
        s = int(self.blocks.start[owner])
        for j in range(num_blocks):
            p = int(self.page_of[self.blocks.ids[s + j]])
            assert p != NONE, (owner, j)
            if self.ref[p] == 0:
                self._unlink(p)
                self._num_in_use += 1
                self._num_cached_free -= 1
            self.ref[p] += 1
            self.page_at[s + j] = p
        self._used[owner] = self._cached[owner] = num_blocks
        self._num_table += num_blocks

    def cache_blocks(self, owner: int, num_full_blocks: int) -> None:
        """Enter request ``owner``'s blocks up to ``num_full_blocks`` (those its scheduled tokens fill) in the cache."""
        s = int(self.blocks.start[owner])
        for j in range(int(self._cached[owner]), num_full_blocks):
            p, b = int(self.page_at[s + j]), int(self.blocks.ids[s + j])
            if self.page_of[b] == NONE and self.block_of[p] == NONE:
                self.page_of[b] = p
                self.block_of[p] = b
        self._cached[owner] = max(int(self._cached[owner]), num_full_blocks)

    # ----------------------------------------------------------------- changes
    def reserve(self, owner: int, pages: int) -> None:
        """Set request ``owner``'s reservation to ``pages`` (0 clears it); ``ValueError`` if it over-commits."""
        pages = v.nonnegative_int(pages, "pages")
        used = int(self._used[owner])
        delta = max(0, pages - used) - max(0, int(self._reserved[owner]) - used)
        if self.num_committed_pages + delta > self.num_pages:
            raise ValueError(f"reserving {pages} pages for request {owner} would commit "
                             f"{self.num_committed_pages + delta} pages of a {self.num_pages}-page pool")
        self._reserved[owner] = pages
        self._slack += delta

    def allocate(self, owners: list[int], counts: list[int]) -> np.ndarray:
        """Give ``counts[i]`` new pages (the free queue's head, evicting what they cache) to ``owners[i]``."""
        total = int(sum(counts))
        if total > self.num_free_pages:
            raise ValueError(f"cannot allocate {total} pages: only {self.num_free_pages} of "
                             f"{self.num_pages} are free")
        extra = sum(max(0, c - max(0, int(self._reserved[o]) - int(self._used[o]))) for o, c in zip(owners, counts))
        if self.num_committed_pages + extra > self.num_pages:
            raise ValueError(f"cannot allocate {total} pages: {extra} of them lie beyond the requests' "
                             f"reservations and only {self.num_uncommitted_pages} pages are unpromised")
        out = []
        for owner, count in zip(owners, counts):
            s, used, res = int(self.blocks.start[owner]), int(self._used[owner]), int(self._reserved[owner])
            if s + used + count > int(self.blocks.start[owner + 1]):
                raise ValueError(f"request {owner} would hold more blocks than its block ids cover")
            for j in range(count):
                p = int(self.next_[self.num_pages])
                self._unlink(p)
                b = int(self.block_of[p])
                if b != NONE:  # evict the least recently freed cached block
                    self.page_of[b] = NONE
                    self.block_of[p] = NONE
                    self._num_cached_free -= 1
                self.ref[p] = 1
                self.page_at[s + used + j] = p
                out.append(p)
            self._used[owner] = used + count
            self._slack += max(0, res - used - count) - max(0, res - used)
            self._num_in_use += count
            self._num_table += count
        return np.asarray(out, dtype=np.int64)

    def release(self, owner: int) -> int:
        """Drop request ``owner``'s block table (last block first) and reservation; return its length.

        A page whose last referencer this was goes to the tail of the free queue, keeping its
        cached block.
        """
        s, used = int(self.blocks.start[owner]), int(self._used[owner])
        for j in range(used - 1, -1, -1):
            p = int(self.page_at[s + j])
            self.page_at[s + j] = NONE
            self.ref[p] -= 1
            if self.ref[p] == 0:
                self._append(p)
                self._num_in_use -= 1
                self._num_cached_free += int(self.block_of[p] != NONE)
        self._num_table -= used
        self._slack -= max(0, int(self._reserved[owner]) - used)
        self._used[owner] = self._cached[owner] = self._reserved[owner] = 0
        return used

    # ----------------------------------------------------------------- the free queue
    def _unlink(self, p: int) -> None:
        nxt, prv = self.next_[p], self.prev_[p]
        self.next_[prv], self.prev_[nxt] = nxt, prv
        self.next_[p] = self.prev_[p] = NONE

    def _append(self, p: int) -> None:
        tail = self.prev_[self.num_pages]
        self.next_[tail], self.prev_[p] = p, tail
        self.next_[p], self.prev_[self.num_pages] = self.num_pages, p

    def free_queue(self) -> np.ndarray:
        """The pages no request references, head (next to be allocated) first."""
        out, p = [], int(self.next_[self.num_pages])
        while p != self.num_pages:
            out.append(p)
            p = int(self.next_[p])
        return np.asarray(out, dtype=np.int64)

    def check(self) -> None:
        """Recount everything from the page arrays; ``AssertionError`` if a counter or rule disagrees."""
        queue = self.free_queue()
        assert np.unique(queue).size == queue.size, "a page is twice in the free queue"
        assert (self.ref[queue] == 0).all(), "a referenced page is in the free queue"
        assert int((self.ref > 0).sum()) == self._num_in_use, "in-use count disagrees with the reference counts"
        assert queue.size + self._num_in_use == self.num_pages, "pages not conserved"
        cached = self.block_of != NONE
        assert int((cached & (self.ref == 0)).sum()) == self._num_cached_free, "cached-free count disagrees"
        assert (self.page_of[self.block_of[cached]] == np.flatnonzero(cached)).all(), "cache maps disagree"
        refs = np.zeros(self.num_pages, dtype=np.int64)
        for i in range(self.num_owners):
            table = self.block_table(i)
            assert (table != NONE).all() and np.unique(table).size == table.size, f"request {i}'s table"
            np.add.at(refs, table, 1)
        assert (refs == self.ref).all(), "reference counts disagree with the block tables"
        assert int(self._used.sum()) == self._num_table
        assert int(np.maximum(self._reserved - self._used, 0).sum()) == self._slack
        assert self.num_committed_pages <= self.num_pages, "pool over-committed"
