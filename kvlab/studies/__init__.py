"""Studies built from many simulations, the analyses behind notebooks 04 and 06.

:mod:`kvlab.studies.policy_study` (reservation policies across ``max_new_tokens``, the
overflow question, notebook 04's claims) and :mod:`kvlab.studies.prediction_study`
(reservation and queue order by predicted length, notebook 06's claims) and
:mod:`kvlab.studies.vllm_paper` (the vLLM paper's capacity comparison in its own set-up). All sit
above the simulator (:mod:`kvlab.sim`), which never imports them.
"""
from . import policy_study, prediction_study, vllm_paper

__all__ = ["policy_study", "prediction_study", "vllm_paper"]
