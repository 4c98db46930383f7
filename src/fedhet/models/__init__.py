"""fedhet.models: each model module registers its architectures in `MODELS` (registry.py) when
imported, and importing this package imports them all."""

from fedhet.models import cnn, linear, mlp, moon  # noqa: F401  (imported for their registrations)
