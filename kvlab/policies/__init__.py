"""Admission and reservation policies, one module per system they model.

``create_policy(name, **params)`` builds one by name; ``policy_names()`` lists them.
"""
from . import orca, predicted, sglang, tensorrt_llm, tgi, vllm  # noqa: F401  (registers them)
from .base import Policy, PolicyName, RequestView, create_policy, policy_names, register
from .predicted import QUEUE_ORDERS, realized_length_predictive

__all__ = ["Policy", "PolicyName", "RequestView", "QUEUE_ORDERS", "create_policy", "policy_names",
           "realized_length_predictive", "register"]
