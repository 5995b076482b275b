"""kvlab: how much KV-cache memory a serving configuration wastes, and what to run instead."""
from . import backend, claims, costmodel, report, specs
from . import lengths
from .reservation import pool_pages, real_pool_table, reservation_table, reservation_waste

__all__ = [
    "backend", "claims", "costmodel", "report", "specs",
    "lengths",
    "pool_pages", "real_pool_table", "reservation_table", "reservation_waste",
]
__version__ = "0.1.0"
