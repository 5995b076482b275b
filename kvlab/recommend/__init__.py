"""``kvlab recommend``: which setting of your server to run at your real load, its capacity and
how sure that is (:mod:`kvlab.recommend.core`); what each server lets you set and its flags
(:mod:`kvlab.recommend.systems`, facts in one profile per system and version family:
:mod:`kvlab.recommend.servers`); the seed essay's recipe checked (:mod:`kvlab.recommend.recipe`)."""
from .core import (DECISIONS, DEFAULT_ARRIVALS, DEFAULT_NUM_WINDOWS, DEFAULT_SLO, DEFAULT_WINDOW_REQUESTS,
                   LATENCY_COLUMNS, TABLE_COLUMNS, ContextFit, Recommendation, fit_to_context, grid_start,
                   output_percentiles, recommend, render_text, serving_config, what_binds)
from .recipe import recipe_claims
from .systems import (OVERFLOW_MODES, RESERVATION, SYSTEMS, Setting, command_line, default_settings, launch,
                      settings, write_files)

__all__ = ["DECISIONS", "DEFAULT_ARRIVALS", "DEFAULT_NUM_WINDOWS", "DEFAULT_SLO", "DEFAULT_WINDOW_REQUESTS",
           "LATENCY_COLUMNS", "OVERFLOW_MODES", "RESERVATION", "SYSTEMS", "TABLE_COLUMNS", "ContextFit",
           "Recommendation", "Setting", "command_line", "default_settings", "fit_to_context", "grid_start",
           "output_percentiles", "recipe_claims", "recommend", "render_text", "serving_config", "settings",
           "what_binds", "write_files", "launch"]
