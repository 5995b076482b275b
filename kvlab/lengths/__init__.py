"""Output- and prompt-length distributions: percentiles, fits (log-t and scipy families),
bootstrap intervals and workload profiles (calibrated, fitted to traces, matched to means)."""
from .analysis import (censoring_bias, cdf_curves, length_claims, qq_points,
                       recommend_max_new_tokens, workload_sample)
from .families import DEFAULT_FAMILIES, FAMILIES, family
from .fit import FittedLength, fit, fit_family, percentile_ci, percentiles
from .logt import LogT
from .profile_fit import fit_profile
from .profiles import Marginal, Profile, calibrate, list_profiles, profile, read_profile

__all__ = ["censoring_bias", "cdf_curves", "length_claims", "qq_points", "recommend_max_new_tokens",
           "workload_sample", "DEFAULT_FAMILIES", "FAMILIES", "FittedLength", "LogT", "Marginal", "Profile",
           "calibrate", "family", "fit", "fit_family", "fit_profile", "list_profiles", "percentile_ci", "percentiles",
           "profile", "read_profile"]
