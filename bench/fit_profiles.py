"""Regenerate the shipped workload profiles fitted to real traces or matched to published means.

    python bench/fit_profiles.py [NAME ...]

Reads the traces from ``../shared/data/traces`` (or ``$KVLAB_SHARED_DATA/traces``), rewrites
``data/profiles/<name>.yaml`` and prints, per profile and marginal, the trace's percentiles, the
profile's sampled percentiles and the largest relative error among p10, p50, p90 and p99.
Fitting every candidate family to ~30k lengths takes a few minutes on one core.
"""
import sys
import time

import pandas as pd

from kvlab.lengths.profile_fit import regenerate

if __name__ == "__main__":
    t0 = time.perf_counter()
    table = regenerate(sys.argv[1:] or None)
    with pd.option_context("display.width", 200, "display.max_columns", 30):
        print(table.to_string(index=False))
    print(f"{time.perf_counter() - t0:.0f} s")
