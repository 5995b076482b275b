"""kvlab: how much KV-cache memory a serving configuration wastes, and what to run instead.

``import kvlab`` loads nothing else: every public name below (``kvlab.simulate``,
``kvlab.sweep``, ``kvlab.crossover``, the submodules ``kvlab.sim``, ``kvlab.lengths``, ...) is
imported on first use (:mod:`kvlab._lazy`), so NumPy, pandas and SciPy load only when something
that needs them is first read. ``bench/bench_import.py`` measures it.
"""
from ._lazy import attach as _attach

__version__ = "0.1.0"

__getattr__, __dir__, __all__ = _attach(__name__, {
    **dict.fromkeys(["crossover", "crossover_table", "preemption_costs"], "preemption_cost"),
    **dict.fromkeys(["create_policy", "policy_names"], "policies"),
    **dict.fromkeys(["SimResult", "simulate"], "sim"),
    **dict.fromkeys(["pool_pages", "real_pool_table", "reservation_table", "reservation_waste"], "reservation"),
    "sweep": "sweep",
    **dict.fromkeys(["SLO", "CapacityResult", "ServingConfig", "capacities", "capacity", "capacity_table"],
                    "capacity"),
    "pipeline_cost": "pipeline",
    **dict.fromkeys(["preset", "preset_names"], "presets"),
    "Recommendation": "recommend",
}, submodules=("arrivals", "backend", "calibrate", "claims", "costmodel", "lengths", "measure", "paged", "pipeline",
               "plots", "policies", "predict", "preemption_cost", "presets", "recommend", "report", "sim", "specs",
               "studies", "swap", "trace_window", "traces", "validate"))
