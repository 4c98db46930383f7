"""fedhet.models: each model module registers its architectures in `MODELS` (registry.py) when
imported, and importing this package imports every module in it.

What it offers the layers above (runs, reports, papers, deploy, the CLI) is the list below; every other
name in the package is internal to it (tests/test_architecture.py).
"""

from fedhet.models.registry import MODELS, build_model
from fedhet.registry import import_all

import_all(__name__, __path__)

__all__ = [
    "MODELS",
    "build_model",
]
