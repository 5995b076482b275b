"""Where the project's built-in data and notebooks live (the repository's top-level folders).

kvlab is installed editable (``pip install -e .``), so the package finds ``data/`` and
``notebooks/`` beside itself.
"""
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA_DIR = ROOT / "data"
NOTEBOOK_DIR = ROOT / "notebooks"
