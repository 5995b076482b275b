"""Where the project's built-in data and notebooks live (the repository's top-level folders).

kvlab is installed editable (``pip install -e .``), so the package finds ``data/`` and
``notebooks/`` beside itself.
"""
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA_DIR = ROOT / "data"
NOTEBOOK_DIR = ROOT / "notebooks"

#: Public measured data and real traces kept beside the project, never copied into it:
#: ``../shared/data`` from the repository root (CI has it there), or ``$KVLAB_SHARED_DATA``.
SHARED_DATA_DIR = Path(os.environ.get("KVLAB_SHARED_DATA", ROOT.parent / "shared" / "data"))
