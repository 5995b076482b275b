"""kvlab: how much KV-cache memory a serving configuration wastes, and what to run instead."""
from . import backend, claims, costmodel, report, specs
from . import lengths, traces
from . import predict
from . import swap, preemption_cost
from .preemption_cost import crossover, crossover_table, preemption_costs
from . import arrivals, paged, policies, sim
from .policies import create_policy, policy_names
from .sim import SimResult, simulate
from .reservation import pool_pages, real_pool_table, reservation_table, reservation_waste
from .sweep import sweep
from . import pipeline, presets
from .capacity import SLO, CapacityResult, ServingConfig, capacities, capacity, capacity_table
from .pipeline import pipeline_cost
from .presets import preset, preset_names
from . import recommend
from .recommend import Recommendation

__all__ = [
    "backend", "claims", "costmodel", "report", "specs",
    "lengths", "traces",
    "predict",
    "swap", "preemption_cost", "crossover", "crossover_table", "preemption_costs",
    "arrivals", "paged", "policies", "sim", "create_policy", "policy_names", "SimResult", "simulate",
    "pool_pages", "real_pool_table", "reservation_table", "reservation_waste",
    "sweep",
    "pipeline", "presets", "SLO", "CapacityResult", "ServingConfig", "capacities", "capacity", "capacity_table", "pipeline_cost",
    "preset", "preset_names",
    "recommend", "Recommendation",
]
__version__ = "0.1.0"
