"""fedhet.models: each model module registers its architectures in `MODELS` (registry.py) when
imported, and importing this package imports every module in it."""

from fedhet.registry import import_all

import_all(__name__, __path__)
