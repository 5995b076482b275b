"""Output-length predictors: log-t regression on request features, a predictor of chosen quality,
and their evaluation (parameter R^2, quantile calibration)."""
from .distribution import LogTPredictive
from .evaluate import (DEFAULT_QUANTILES, ParameterR2, calibration_table, holdout_indices,
                       parameter_r2, r2_score)
from .logt_regression import BASE_FEATURES, LogTRegression, design_matrix, fit_logt_regression
from .ltr import RankedPrediction, ranking_scores
from .oracle import SyntheticRequests, oracle_predictive, synthetic_requests

__all__ = ["BASE_FEATURES", "DEFAULT_QUANTILES", "LogTPredictive", "LogTRegression", "ParameterR2",
           "RankedPrediction", "SyntheticRequests", "calibration_table", "design_matrix", "fit_logt_regression",
           "holdout_indices", "oracle_predictive", "parameter_r2", "r2_score", "ranking_scores", "synthetic_requests"]
