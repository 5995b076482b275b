"""Output- and prompt-length distributions: percentiles, fits (log-t and scipy families),
bootstrap intervals and workload profiles (calibrated, fitted to traces, matched to means).

Names load on first use (:mod:`kvlab._lazy`): ``kvlab.lengths.logt`` alone does not import the
fits' SciPy optimisers.
"""
from .._lazy import attach as _attach

__getattr__, __dir__, __all__ = _attach(__name__, {
    **dict.fromkeys(["censoring_bias", "cdf_curves", "qq_points", "recommend_max_new_tokens",
                     "workload_sample"], "analysis"),
    **dict.fromkeys(["DEFAULT_FAMILIES", "FAMILIES", "family"], "families"),
    **dict.fromkeys(["FittedLength", "fit", "fit_binned", "fit_family", "percentile_ci", "percentiles"], "fit"),
    "LogT": "logt",
    "fit_profile": "profile_fit",
    **dict.fromkeys(["Marginal", "Profile", "calibrate", "list_profiles", "profile", "read_profile"], "profiles"),
})
