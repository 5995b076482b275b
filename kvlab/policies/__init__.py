"""Admission and reservation policies, one module per system they model.

``create_policy(name, **params)`` builds one by name; ``policy_names()`` lists them. Every module
of this package is imported here in name order (so policies register in that order): a new
module's ``@register``-ed policy is known without further edits.
"""
import importlib
import pkgutil

from .base import CompiledForm, Policy, Requests, create_policy, policy_class, policy_names, register

_MODULES = {name: importlib.import_module(f"{__name__}.{name}")
            for name in sorted(m.name for m in pkgutil.iter_modules(__path__))
            if name != "base" and not name.startswith("_")}
QUEUE_ORDERS = _MODULES["predicted"].QUEUE_ORDERS
realized_length_predictive = _MODULES["predicted"].realized_length_predictive

__all__ = ["CompiledForm", "Policy", "Requests", "QUEUE_ORDERS", "create_policy", "policy_class", "policy_names",
           "realized_length_predictive", "register"]
