"""Output- and prompt-length distributions: log-t, fits, workload profiles."""
from .families import DEFAULT_FAMILIES, FAMILIES, family
from .logt import LogT
from .profiles import Marginal, Profile, calibrate, list_profiles, profile

__all__ = ["DEFAULT_FAMILIES", "FAMILIES", "LogT", "Marginal", "Profile", "calibrate", "family",
           "list_profiles", "profile"]
