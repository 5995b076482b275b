"""What notebook 02 shows, as functions: workload samples, censoring bias, recommended caps,
CDF / QQ curves of fitted families (the seed essay's length claims are :mod:`kvlab.studies.seed_claims`)."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd

from .. import _validate as v
from .. import traces
from ..reservation import pages_for
from ..trace_window import trace_window
from .fit import fit_family, lengths_array
from .profiles import list_profiles, profile

def workload_sample(workload: str | Path, num_requests: int | None = None, seed: int = 0) -> tuple[pd.DataFrame, str]:
    """Requests of a workload: a profile name (sampled) or a trace path (loaded).

    Parameters
    ----------
    workload : str or Path
        A name from :func:`list_profiles`, or a trace file for :func:`kvlab.traces.load`.
    num_requests : int or None
        A trace: ``None`` for all its requests, N for its first N
        (:func:`kvlab.trace_window.trace_window`; ``ValueError`` when it holds fewer). A profile:
        the number of requests to sample (required).
    seed : int
        Seed of the profile's sampler.

    Returns
    -------
    (DataFrame, str)
        The length table (``prompt_tokens``, ``output_tokens``, ``censored``, ...) and a line
        saying where it comes from.
    """
    n = None if num_requests is None else v.positive_int(num_requests, "num_requests")
    if str(workload) in list_profiles():
        if n is None:
            raise ValueError(f"num_requests must be a positive integer for the profile {str(workload)!r} "
                             "(None means all requests, which only a trace has)")
        prof = profile(str(workload))
        return prof.sample(n, seed=seed), f"profile {prof.name}: {prof.source}"
    path = Path(workload)
    if not path.exists():
        raise ValueError(f"workload {str(workload)!r} is neither a profile ({', '.join(list_profiles())}) "
                         f"nor an existing trace file")
    df = traces.load(path)
    if n is None:
        return df, f"trace {path} ({df.attrs['format']}, {len(df):,} requests)"
    window = trace_window(df, n)
    out = window.requests
    out.attrs.update(df.attrs)
    return out, f"trace {path} ({df.attrs['format']}): {window.describe()}"


def censoring_bias(output_tokens: Any, max_new_tokens: int, *, censored: Any = None,
                   family: str = "log-t") -> pd.DataFrame:
    """Fit a sample, then the same sample capped at ``max_new_tokens``, naively and censored.

    The naive fit takes capped outputs at face value (as finished at the cap); the censored fit
    enters them as "at least the cap". Percentiles are compared with those of the uncapped sample.

    Returns
    -------
    DataFrame, rows ``uncapped``, ``capped, naive``, ``capped, censored``: ``n_censored``, the
    fitted parameters, fitted ``p50``/``p90``/``p99`` (tokens), and ``p90_error_frac``,
    ``p99_error_frac`` relative to the uncapped sample's empirical percentiles.
    """
    x = lengths_array(output_tokens, "output_tokens")
    cap = v.positive_int(max_new_tokens, "max_new_tokens")
    orig = np.zeros(x.size, dtype=bool) if censored is None else np.asarray(censored, dtype=bool)
    capped = np.minimum(x, cap)
    hit = (x >= cap) | orig
    emp90, emp99 = np.percentile(x, [90, 99])
    rows = []
    for label, data, cens in (("uncapped", x, orig), ("capped, naive", capped, None),
                              ("capped, censored", capped, hit)):
        f = fit_family(data, family, censored=cens)
        p50, p90, p99 = f.ppf([0.5, 0.9, 0.99])
        rows.append({"fit": label, "max_new_tokens": cap, "n_censored": f.n_censored, **f.params,
                     "p50": int(p50), "p90": int(p90), "p99": int(p99),
                     "p90_error_frac": p90 / emp90 - 1.0, "p99_error_frac": p99 / emp99 - 1.0})
    return pd.DataFrame(rows)


def recommend_max_new_tokens(output_tokens: Any, quantiles: Sequence[float] = (0.95, 0.99), *,
                             block_size: int = 16) -> pd.DataFrame:
    """``max_new_tokens`` at output-length quantiles, with the pages each reserves.

    Parameters
    ----------
    output_tokens : array of int
        Output lengths (tokens).
    quantiles : sequence of float
        Quantiles in (0, 1); the brief's recipe: p95 for light tails, p99 for heavy ones.
    block_size : int
        Tokens per page.

    Returns
    -------
    DataFrame: ``quantile``, ``max_new_tokens`` (the empirical quantile rounded up, tokens),
    ``decode_pages`` (``ceil(max_new_tokens / block_size)``), ``share_overrun`` (requests that
    would outgrow it), ``reserved_over_median`` (cap / median output).
    """
    x = lengths_array(output_tokens, "output_tokens")
    block_size = v.positive_int(block_size, "block_size")
    qs = [v.fraction(q, "quantiles", high_closed=False) for q in quantiles]
    median = float(np.median(x))
    rows = []
    for q in qs:
        cap = int(np.ceil(np.quantile(x, q)))
        rows.append({"quantile": q, "max_new_tokens": cap, "decode_pages": int(pages_for(cap, block_size)),
                     "share_overrun": float(np.mean(x > cap)), "reserved_over_median": cap / median})
    return pd.DataFrame(rows)


def cdf_curves(output_tokens: Any, fits: pd.DataFrame, *, num_points: int = 200) -> pd.DataFrame:
    """Empirical and fitted CDFs on a log-spaced grid of lengths, long format for plotting.

    ``fits`` is a table from :func:`kvlab.lengths.fit`. Returns ``output_tokens``, ``cdf``,
    ``curve`` (``"empirical"`` or the family name).
    """
    x = np.sort(lengths_array(output_tokens, "output_tokens"))
    grid = np.unique(np.geomspace(1, x[-1], v.positive_int(num_points, "num_points")).round().astype(np.int64))
    parts = [pd.DataFrame({"output_tokens": grid, "cdf": np.searchsorted(x, grid, side="right") / x.size,
                           "curve": "empirical"})]
    for name, f in zip(fits["family"], fits["fitted"]):
        parts.append(pd.DataFrame({"output_tokens": grid, "cdf": f.cdf(grid), "curve": name}))
    return pd.concat(parts, ignore_index=True)


def qq_points(output_tokens: Any, fits: pd.DataFrame, *, num_points: int = 99) -> pd.DataFrame:
    """Empirical against fitted quantiles at evenly spaced probabilities, long format.

    Returns ``prob``, ``empirical_tokens``, ``fitted_tokens``, ``family``; points on the
    diagonal mean the family reproduces the sample's quantiles.
    """
    x = lengths_array(output_tokens, "output_tokens")
    n = v.positive_int(num_points, "num_points")
    probs = (np.arange(1, n + 1) - 0.5) / n
    emp = np.quantile(x, probs)
    return pd.concat([pd.DataFrame({"prob": probs, "empirical_tokens": emp, "fitted_tokens": f.ppf(probs),
                                    "family": name})
                      for name, f in zip(fits["family"], fits["fitted"])], ignore_index=True)
