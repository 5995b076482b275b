"""Policies: the registry, each rule on a hand example, array rules equal to scalar rules, SGLang's exact ratio."""
from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from kvlab.policies import Policy, Requests, create_policy, policy_class, policy_names, register
from kvlab.policies.orca import next_power_of_two
from kvlab.sim.request import RequestStatus


def bound(name, *, max_new_tokens=100, block_size=16, num_pages=50, output=(30,), **params) -> Policy:
    p = create_policy(name, **params)
    p.bind(output_tokens=np.asarray(output), max_new_tokens=max_new_tokens, block_size=block_size,
           num_pages=num_pages, seed=0)
    return p


def req(prompt=20, output=30, generated=0, index=0):
    return Requests.one(index, prompt, output, generated)


def batch(*reqs: Requests) -> Requests:
    cols = np.array([(r.index, r.prompt_tokens, r.output_tokens, r.generated_tokens) for r in reqs],
                    dtype=np.int64).reshape(-1, 4).T
    return Requests(*cols)


def test_registry_names_each_class_once_by_its_module():
    names = policy_names()
    assert len(names) == len(set(names)) and names
    for name in names:
        cls = policy_class(name)
        assert cls.name == name and cls.__module__.startswith("kvlab.policies.")
        assert isinstance(create_policy(name), cls)


def test_unknown_policy_lists_the_known_ones():
    with pytest.raises(ValueError, match="expected one of " + ", ".join(policy_names())):
        create_policy("fcfs")
    with pytest.raises(ValueError, match="bad parameters for policy 'vllm'"):
        create_policy("vllm", watermark=0.1)
    with pytest.raises(ValueError, match="watermark_frac"):
        create_policy("vllm", watermark_frac=1.5)


def test_duplicate_registration_and_bad_names_raise():
    class Again(Policy):
        name = "vllm"

        def reservation_tokens(self, reqs):
            return reqs.prompt_tokens

    with pytest.raises(ValueError, match="already registered"):
        register(Again)

    class Nameless(Again):
        name = ""

    with pytest.raises(ValueError, match="non-empty str name"):
        register(Nameless)


def test_fits_empty_pool_is_derived_not_overridden():
    with pytest.raises(TypeError, match="fits_empty_pool"):
        class Bad(Policy):
            name = "bad"

            def reservation_tokens(self, reqs):
                return reqs.prompt_tokens

            def fits_empty_pool(self, reqs):
                return True


def test_traits_follow_what_a_class_overrides():
    vllm, sglang, tgi = (policy_class(n) for n in ("vllm", "sglang", "tgi"))
    assert vllm.admits_on_own_pages and not vllm.keeps_state and vllm.on_demand
    assert not sglang.admits_on_own_pages and sglang.keeps_state and sglang.on_demand
    assert tgi.admits_on_own_pages and not tgi.keeps_state and not tgi.on_demand


@pytest.mark.parametrize("name,params,tokens", [
    ("reserve_max", {}, 20 + 100),
    ("orca_oracle", {}, 20 + 30),
    ("orca_pow2", {}, 64),                # next power of two of 50
    ("orca_max", {}, 2048),
    ("orca_max", {"max_model_len": 64}, 64),   # the maximum in total, not 20 + 100
    ("tgi", {}, 20 + 100),
    ("tgi", {"cap_tokens": 10}, 20 + 10),
    ("vllm", {}, 20),
    ("sglang", {}, 20),
])
def test_reservation_formulas(name, params, tokens):
    assert bound(name, **params).reservation_tokens(req()) == tokens


def test_orca_max_reserves_the_maximum_sequence_length_in_total():
    # OPT's 2,048: a 1,000-token prompt reserves 2,048 tokens in all (not 1,000 + 2,048 = 3,048),
    # ceil(2048 / 16) = 128 pages.
    p = bound("orca_max", max_new_tokens=2048, num_pages=1000)
    assert p.reservation_tokens(req(prompt=1000, output=30)) == 2048
    assert p.can_admit(req(prompt=1000, output=30), free_pages=128, running=None)
    assert not p.can_admit(req(prompt=1000, output=30), free_pages=127, running=None)
    # beyond the maximum (outside the source's set-up): 60 + min(30, 100) = 90 > 64 so it can finish
    assert bound("orca_max", max_model_len=64).reservation_tokens(req(prompt=60, output=30)) == 90


def test_orca_pow2_is_capped_at_the_maximum():
    # true final 20 + 70 = 90 -> 128 > 20 + 100
    assert bound("orca_pow2", output=(70,)).reservation_tokens(req(output=70)) == 120


@given(st.integers(1, 2**40))
def test_next_power_of_two_against_bit_length(x):
    expected = 1 << (x - 1).bit_length()
    assert next_power_of_two(x) == expected
    assert next_power_of_two(np.array([x], dtype=np.int64)).tolist() == [expected]


def test_tgi_rereserves_after_requeue():
    # 25 tokens generated: prompt + generated + min(75, 10)
    assert bound("tgi", cap_tokens=10).reservation_tokens(req(generated=25)) == 20 + 25 + 10


def test_predicted_reserves_the_quantile_of_each_request():
    class Pred:
        def ppf(self, q):
            assert q == 0.75
            return np.array([12.2, 500.0, np.inf])

    p = bound("predicted", output=(5, 6, 7), quantile=0.75, prediction=Pred())
    assert p.predicted_tokens.tolist() == [13, 100, 100]  # ceil, capped at max_new_tokens
    assert p.reservation_tokens(req(index=0)) == 20 + 13
    assert p.reservation_tokens(req(index=0, generated=40)) == 20 + 40
    with pytest.raises(ValueError, match="ppf"):
        create_policy("predicted", prediction=object())


def test_vllm_watermark_arithmetic():
    p = bound("vllm", num_pages=100, watermark_frac=0.05)  # watermark 5 pages
    r = req(prompt=32)  # 2 pages
    assert p.can_admit(r, free_pages=7, running=None) and not p.can_admit(r, free_pages=6, running=None)
    assert p.admission_pages(r) == 2 + 5 and p.fits_empty_pool(req(prompt=95 * 16))
    assert not p.fits_empty_pool(req(prompt=95 * 16 + 1))


def test_sglang_ratio_decays_linearly_then_jumps_on_retraction():
    p = bound("sglang", max_new_tokens=100, decay_steps=4)
    step = (Fraction(7, 10) - Fraction(7, 10) * Fraction(14, 100)) / 4
    for k in range(1, 7):
        p.end_schedule(num_preempted=0, running=Requests.empty())
        assert p.ratio == max(Fraction(7, 10) - k * step, Fraction(98, 1000))
    running = batch(req(generated=10), req(generated=30))
    p.end_schedule(num_preempted=1, running=running)
    assert p.ratio == Fraction(10 + 30 + 20 * 2, 200)
    p.end_schedule(num_preempted=2, running=batch(req(generated=95)))
    assert p.ratio == 1
    # several iterations at once decay as many steps
    p.end_schedule(num_preempted=0, running=Requests.empty(), num_iterations=3)
    assert p.ratio == 1 - 3 * step


def test_sglang_admission_charges_running_requests():
    p = bound("sglang", max_new_tokens=100, block_size=4)  # ratio 7/10
    running = batch(req(generated=50))  # charges min(50, 4096) x 0.7
    # new: 20 + ceil((100 + 50) x 0.7) = 20 + 105 = 125 tokens = 31.25 pages
    assert p.can_admit(req(), free_pages=32, running=running)
    assert not p.can_admit(req(), free_pages=31, running=running)
    assert p.fits_empty_pool(req(prompt=200)) and not p.fits_empty_pool(req(prompt=201))


def test_request_status_order_trick_is_pinned():
    finished = {s for s in RequestStatus if s.is_finished()}
    assert finished == {RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH_CAPPED,
                        RequestStatus.FINISHED_ABORTED}
    assert all(s > RequestStatus.SWAPPED for s in finished)
    assert all(s <= RequestStatus.SWAPPED for s in set(RequestStatus) - finished)


def _state(p: Policy) -> dict:
    return {k: v for k, v in vars(p).items() if not k.startswith("_")}


@pytest.mark.parametrize("name", policy_names())
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_array_rules_equal_scalar_rules(name, data):
    """Each rule on arrays of requests answers what it answers for each request alone (as the reference asks)."""
    n = data.draw(st.integers(1, 12), label="n")
    def ints(lo: int, hi: int) -> np.ndarray:
        return np.array(data.draw(st.lists(st.integers(lo, hi), min_size=n, max_size=n)), dtype=np.int64)
    bs, mnt = data.draw(st.sampled_from([1, 2, 4, 16])), data.draw(st.integers(1, 300))
    num_pages = data.draw(st.integers(1, 200))
    prompt, output, free = ints(1, 500), ints(1, 400), ints(0, 220)
    gen = ints(0, 10**6) % np.minimum(output, mnt)  # fewer than the request's target
    p = create_policy(name)
    p.bind(output_tokens=output, max_new_tokens=mnt, block_size=bs, num_pages=num_pages, seed=0)
    reqs = Requests(np.arange(n), prompt, output, gen)
    ones = [Requests.one(i, int(prompt[i]), int(output[i]), int(gen[i])) for i in range(n)]
    m = data.draw(st.integers(0, n), label="running")
    running = None if p.admits_on_own_pages else Requests(np.arange(m), prompt[:m], output[:m], gen[:m])
    for rule in (p.reservation_tokens, p.admission_pages, p.fits_empty_pool, p.queue_rank):
        on_array = np.broadcast_to(np.asarray(rule(reqs)), (n,)).tolist()
        assert on_array == [np.asarray(rule(one)).item() for one in ones], rule.__name__
    on_array = np.asarray(p.can_admit(reqs, free_pages=free, running=running)).tolist()
    assert on_array == [bool(p.can_admit(one, free_pages=int(f), running=running)) for one, f in zip(ones, free)]
    assert (np.asarray(p.reservation_tokens(reqs)) >= prompt + gen).all()
    if running is not None and running.size:
        assert 0 <= p.choose_victim(running) < running.size
    if p.keeps_state and m:  # L iterations at once = L single iterations of decoding requests
        many, single = create_policy(name), create_policy(name)
        for q in (many, single):
            q.bind(output_tokens=output, max_new_tokens=mnt, block_size=bs, num_pages=num_pages, seed=0)
        L = data.draw(st.integers(1, 20), label="iterations")
        run = Requests(np.arange(m), prompt[:m], output[:m], gen[:m])
        many.end_schedule(num_preempted=0, running=run, num_iterations=L)
        for i in range(L):
            single.end_schedule(num_preempted=0, running=Requests(run.index, run.prompt_tokens, run.output_tokens,
                                                                  run.generated_tokens + i))
        assert _state(many) == _state(single)
