"""Output-length predictors: log-t regression on request features, a predictor of chosen quality,
and their evaluation (parameter R^2, quantile calibration).

Names load on first use (:mod:`kvlab._lazy`): the per-request distribution does not import the
regression's optimiser.
"""
from .._lazy import attach as _attach

__getattr__, __dir__, __all__ = _attach(__name__, {
    "LogTPredictive": "distribution",
    **dict.fromkeys(["DEFAULT_QUANTILES", "ParameterR2", "calibration_table", "holdout_indices", "parameter_r2",
                     "r2_score"], "evaluate"),
    **dict.fromkeys(["BASE_FEATURES", "LogTRegression", "design_matrix", "fit_logt_regression"], "logt_regression"),
    **dict.fromkeys(["RankedPrediction", "ranking_scores"], "ltr"),
    **dict.fromkeys(["SyntheticRequests", "oracle_predictive", "synthetic_requests"], "oracle"),
})
