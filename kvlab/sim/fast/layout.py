"""The compiled loop's array layout: every slot, column and code it shares with its Python side.

The loop (:mod:`.loop`, Numba) and its Python side (:mod:`.compiled`) read and write the same
int64 and float64 arrays; the index of each slot, column and row, and the code of each event
and rule, is defined once here, in a module that imports no Numba, so that a process running
the ahead-of-time compiled loop (:mod:`.aot`) never imports it. Read the loop's note for what
each array holds.
"""
from __future__ import annotations

from .state import ABORT_REASONS

# ---- scalar state: S (int64) and F (float64) slots
(K, ARRIVED, COMMITTED, USED_PAGES, CPU_USED, IDLE, NROWS, WQ_HEAD, WQ_LEN, SW_HEAD, SW_LEN, NRUN, NSTALE,
 NLIMBO, STAGE, BUDGET, NSCHED, NPREEMPTED, SWAP_PAGES, NABORTED, CURSOR, NUM_DEC, NUM_OTHER, CUR_R, CUR_CHUNK,
 HAS_ANSWER, ANSWER, ASK_R, ASK_FREE, ASK_TOKENS, ASK_PAIRS, ASK_KV, STATE0, STATE1, TABLE, CACHED_FREE,
 NFIN, ADMIT_BUSY, JOINED, JOINED_LAST) = range(40)
NUM_INT_STATE = 40  # under prefix caching USED_PAGES counts distinct pages, TABLE block-table entries; NFIN:
# requests finished in the previous iteration still holding pages and slots (async scheduling, ids in fin);
# ADMIT_BUSY: the chunked admission phase began with requests running; JOINED: this iteration admitted a waiting
# request beside running ones; JOINED_LAST: the previous one did (chunked_alternating)
NOW, START, ANSWER_S, PREV_START = 0, 1, 2, 3  # PREV_START: start of the iteration that ran into NOW (async), or -1
NUM_FLOAT_STATE = 4
# ---- stages of an iteration (S[STAGE])
BETWEEN, WHOLE, RUNNING_PHASE, SWAPPED_PHASE, CHUNKED, END_SCHEDULE, EXECUTE, PREFILLS_PHASE, PREFILL_ADMIT = range(9)
# ---- configuration: C (int64)
BLOCK_SIZE, NUM_PAGES, MNBT, MAX_SEQS, SCHED, ON_DEMAND, MODE, CPU_POOL, SHIFT, ADMISSION, VICTIM, \
    STATE_RULE, ORDERED, MAX_NEW, CLIP, FLOOR_NUM, FLOOR_DEN, STEP_NUM, STEP_DEN, CACHING, EVERY_COLUMN, \
    ASYNC, AS_RANK, FIRST_CHUNK = range(24)
NUM_CONFIG = 24  # SCHED: the scheduler (SCHED_* below); AS_RANK: a data-parallel rank (:mod:`kvlab.sim.data_parallel`):
# RANK_IDLE instead of a clock jump, and every iteration's whole duration asked (ASK_COST); FIRST_CHUNK: the policy
# reserves_first_chunk (vLLM V1's admission)
SCHED_CHUNKED, SCHED_PREFILL_FIRST, SCHED_PREFILL_FIRST_CHUNKED, SCHED_MIXED_WHOLE, SCHED_CHUNKED_ALTERNATING = \
    range(5)  # SchedulerKind's
MODE_RECOMPUTE, MODE_SWAP, MODE_REJECT = 0, 1, 2
# compiled forms of the policy's rules (ASK: hand the question back to Python)
ASK, OWN_PAGES, FUTURE_CHARGE, NEWEST, NO_STATE, RATIO_DECAY = 0, 1, 2, 3, 4, 5
COST_ASK = -1  # cost_kind of a cost model without a compiled form
# ---- per-request state: Q (int64 columns; the fields an iteration touches share a cache line or two),
# T (float64: last token, largest token gap, admitted, first token, finish; seconds), E (int64 iterations)
PROMPT, GEN, COMP, RES, USED, TARGET, MAX_USED, MAX_RES, STATUS, OUTPUT, CPU, NPRE, NSWAP, ABORT, HIT, SAVED = \
    range(16)  # HIT, SAVED: prefix_hit_tokens, saved_prefill_tokens
NUM_REQUEST_INTS = 16  # rows of 128 bytes start on cache lines (large arrays are page-aligned)
LAST_S, MAX_TBT, ADM_S, FT_S, FIN_S = range(5)
ADM_ITER, FT_ITER, FIN_ITER = range(3)
# ---- the policy's facts per request: Fct (int64)
F_RES_PAGES, F_ADM_PAGES, F_FITS, F_GEN, F_RES_TOKENS, F_RANK = range(6)
NUM_FACTS = 6
# ---- events
CONTINUE, DONE, ROWS_FULL, STALE, NO_PROGRESS, ASK_ADMIT, ASK_VICTIM, ASK_END_SCHEDULE, ASK_COST, RANK_IDLE = \
    range(-1, 9)
EXCEEDS_POOL, EXCEEDS_TOKEN_BUDGET, KV_EXCEEDS_POOL, PREEMPTED_REJECTED = (
    ABORT_REASONS.index(reason) for reason in ("exceeds_pool", "exceeds_token_budget", "kv_exceeds_pool",
                                               "preempted_rejected"))
# ---- iteration rows: R (int64, one row per column) and RT (start, duration)
R_K, R_BATCH, R_PREFILL, R_DECODE, R_RUNNING, R_WAITING, R_SWAPPED, R_PREEMPTED, R_USED, R_RESERVED, R_FREE, \
    R_CPU, R_MOVED, R_CACHED, R_SHARED_SAVED = range(15)
NUM_ROW_INTS = 15  # the last two under prefix caching only; R_BATCH, R_DECODE, R_USED, R_RESERVED (the
# summary's, :data:`kvlab.sim.metrics.SUMMARY_ITERATION_COLUMNS`) always, the others when C[EVERY_COLUMN]

# ---- the prefix cache's pool (:mod:`.prefix`): rows of pg, blk and rb
PG_REF, PG_BLOCK, PG_NEXT, PG_PREV = range(4)
BL_ID, BL_PAGE = range(2)
RB_START, RB_CACHED = range(2)
