"""Policies: the registry, each reservation formula on a hand example, SGLang's exact ratio."""
from __future__ import annotations

from fractions import Fraction
from types import SimpleNamespace

import numpy as np
import pytest

from kvlab.policies import Policy, PolicyName, create_policy, policy_names, register
from kvlab.sim.request import RequestStatus

REQUIRED = ["reserve_max", "orca_oracle", "orca_pow2", "orca_max", "tgi", "vllm", "sglang", "predicted"]


def bound(name, *, max_new_tokens=100, block_size=16, num_pages=50, output=(30,), **params) -> Policy:
    p = create_policy(name, **params)
    p.bind(output_tokens=np.asarray(output), max_new_tokens=max_new_tokens, block_size=block_size,
           num_pages=num_pages, seed=0)
    return p


def req(prompt=20, output=30, generated=0, index=0):
    return SimpleNamespace(index=index, prompt_tokens=prompt, output_tokens=output, generated_tokens=generated)


def test_registry_has_the_required_policies_in_enum_order():
    assert policy_names() == REQUIRED
    assert [p.value for p in PolicyName] == REQUIRED


def test_unknown_policy_lists_the_known_ones():
    with pytest.raises(ValueError, match="expected one of reserve_max, orca_oracle"):
        create_policy("fcfs")
    with pytest.raises(ValueError, match="bad parameters for policy 'vllm'"):
        create_policy("vllm", watermark=0.1)
    with pytest.raises(ValueError, match="watermark_frac"):
        create_policy("vllm", watermark_frac=1.5)


def test_duplicate_registration_raises():
    class Again(Policy):
        name = PolicyName.VLLM

        def reservation_tokens(self, req):
            return 0

    with pytest.raises(ValueError, match="already registered"):
        register(Again)


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
    assert p.can_admit(req(prompt=1000, output=30), free_pages=128, running=())
    assert not p.can_admit(req(prompt=1000, output=30), free_pages=127, running=())
    # beyond the maximum (outside the source's set-up): 60 + min(30, 100) = 90 > 64 so it can finish
    assert bound("orca_max", max_model_len=64).reservation_tokens(req(prompt=60, output=30)) == 90


def test_orca_pow2_is_capped_at_the_maximum():
    # true final 20 + 70 = 90 -> 128 > 20 + 100
    assert bound("orca_pow2", output=(70,)).reservation_tokens(req(output=70)) == 120


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
    assert p.can_admit(r, free_pages=7, running=()) and not p.can_admit(r, free_pages=6, running=())


def test_sglang_ratio_decays_linearly_then_jumps_on_retraction():
    p = bound("sglang", max_new_tokens=100, decay_steps=4)
    step = (Fraction(7, 10) - Fraction(7, 10) * Fraction(14, 100)) / 4
    for k in range(1, 7):
        p.end_schedule(num_preempted=0, running=[])
        assert p.ratio == max(Fraction(7, 10) - k * step, Fraction(98, 1000))
    running = [req(generated=10), req(generated=30)]
    p.end_schedule(num_preempted=1, running=running)
    assert p.ratio == Fraction(10 + 30 + 20 * 2, 200)
    p.end_schedule(num_preempted=2, running=[req(generated=95)])
    assert p.ratio == 1


def test_sglang_admission_charges_running_requests():
    p = bound("sglang", max_new_tokens=100, block_size=4)  # ratio 7/10
    running = [req(generated=50)]  # charges min(50, 4096) x 0.7
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
