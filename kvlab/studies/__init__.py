"""Studies built from many simulations, the analyses behind notebooks 04 and 06.

:mod:`kvlab.studies.policy_study` (reservation policies across ``max_new_tokens``, the
overflow question, notebook 04's claims) and :mod:`kvlab.studies.prediction_study`
(reservation and queue order by predicted length, notebook 06's claims),
:mod:`kvlab.studies.vllm_paper` (the vLLM paper's capacity comparison in its own set-up),
:mod:`kvlab.studies.preemption_claims` (notebook 03's claims: Fig. 19 and the seed essay's rules) and
:mod:`kvlab.studies.seed_claims` (notebooks 01 and 02: the seed essay's reservation and length figures). All sit
above the simulator (:mod:`kvlab.sim`), which never imports them.
"""
from . import policy_study, preemption_claims, prediction_study, seed_claims, vllm_paper

__all__ = ["policy_study", "preemption_claims", "prediction_study", "seed_claims", "vllm_paper"]
