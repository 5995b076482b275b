"""A notebook's JSON sidecar: written atomically by the notebook, read by tests and the summary page.

The keys every notebook writes (``question``, ``answer``, ``what_to_do``, ``setup``, ``figures``,
``claims``) are listed in the project's conventions; :func:`verdict_counts` is how the summary page
counts a notebook's claims verdicts.
"""
from __future__ import annotations

import collections
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from ._files import public_file


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, Mapping):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return [_jsonable(v) for v in obj.tolist()]
    if isinstance(obj, (np.bool_, bool)):
        return bool(obj)
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, (np.floating, float)):
        f = float(obj)
        return f if math.isfinite(f) else None
    if hasattr(obj, "to_dict") and callable(obj.to_dict):  # pandas DataFrame / Series
        try:
            return _jsonable(obj.to_dict(orient="records"))
        except TypeError:
            return _jsonable(obj.to_dict())
    return obj


def write_results(path: str | os.PathLike, results: Mapping[str, Any]) -> None:
    """Write a notebook's key numbers to the JSON sidecar ``path``, atomically.

    NumPy scalars and arrays, DataFrames (as records) and non-finite floats (as null) are
    converted. The file is written to a temporary name and renamed, so readers never see half
    a file; it is readable by others as the umask allows (0644 under umask 022). Returns nothing,
    so a notebook's last cell shows no output.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(_jsonable(dict(results)), fh, indent=2, sort_keys=True)
        public_file(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_results(path: str | os.PathLike) -> dict:
    """Read a JSON sidecar written by :func:`write_results`."""
    with open(path) as fh:
        return json.load(fh)


def verdict_counts(claims: Any) -> dict[str, int]:
    """How many of ``claims`` (records of :func:`kvlab.claims.table`) have each verdict ``kind``, most common first.

    The kind is the structured field each row carries (:data:`kvlab.claims.KINDS`), never parsed
    from the verdict's words; a record without one counts as ``unclassified``.
    """
    if not isinstance(claims, list):
        return {}
    kinds = [str(c.get("kind") or "unclassified") for c in claims if isinstance(c, Mapping)]
    return dict(collections.Counter(kinds).most_common())
