"""Speed of kvlab.lengths.fit: all six families on 1,000,000 integer lengths (target < 10 s on one
core), against scipy's own ``rv_continuous.fit`` on ``CensoredData`` (interval-censored, the same
likelihood) on a smaller sample, and kvlab.traces.load on a 1,000,000-row Azure-format CSV.

Run: ``python bench/bench_fit.py [num_lengths]``. Threads are pinned to one before NumPy loads.
"""
import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from scipy import stats  # noqa: E402

from kvlab import lengths, traces  # noqa: E402

TARGET_S = 10.0


def _timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def main(n: int = 1_000_000) -> None:
    df = lengths.profile("azure-2023-code").sample(n, seed=0)
    x = df["output_tokens"].to_numpy()
    cap = int(np.percentile(x, 95))
    capped, cens = np.minimum(x, cap), x >= cap
    print(f"{n:,} output lengths (azure-2023-code profile), {np.unique(x).size:,} distinct values")

    table, t_all = _timed(lambda: lengths.fit(x))
    print(f"fit, 6 families, uncensored:      {t_all:6.2f} s  (target < {TARGET_S:.0f} s: "
          f"{'met' if t_all < TARGET_S else 'MISSED'}, {TARGET_S / t_all:.1f}x margin)")
    _, t_cens = _timed(lambda: lengths.fit(capped, censored=cens))
    print(f"fit, 6 families, {cens.mean():.0%} censored:     {t_cens:6.2f} s")
    print(table[["family", "aic", "ks", "p50", "p90", "p99"]].to_string(index=False))

    # scipy's generic path on the same likelihood, on a subsample it can finish.
    m = 20_000
    sub = x[:m]
    lo = np.where(sub == 1, 0.0, sub - 0.5)
    data = stats.CensoredData(interval=np.column_stack([lo, sub + 0.5]))
    (s, _, scale), t_scipy = _timed(lambda: stats.lognorm.fit(data, floc=0))
    ours, t_ours = _timed(lambda: lengths.fit_family(sub, "log-normal"))
    print(f"log-normal on {m:,} lengths: scipy CensoredData fit {t_scipy:.2f} s, kvlab {t_ours:.3f} s "
          f"({t_scipy / t_ours:.0f}x); sigma {s:.4f} vs {ours.params['sigma']:.4f}, "
          f"median {scale:.2f} vs {np.exp(ours.params['mu']):.2f} tokens")
    print(f"  scipy on {n:,} lengths, extrapolated linearly (not run): ~{t_scipy * n / m:.0f} s for one family")

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "azure.csv"
        stamps = pd.Timestamp("2023-11-16 18:15:46") + pd.to_timedelta(np.arange(n) * 0.05, unit="s")
        pd.DataFrame({"TIMESTAMP": stamps.strftime("%Y-%m-%d %H:%M:%S.%f") + "0",
                      "ContextTokens": df["prompt_tokens"], "GeneratedTokens": x}).to_csv(path, index=False)
        loaded, t_load = _timed(lambda: traces.load(path))
        print(f"traces.load of a {n:,}-row Azure CSV: {t_load:.2f} s ({n / t_load:,.0f} rows/s)")
        assert len(loaded) == n


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000)
