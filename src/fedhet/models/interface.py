"""The models layer (the models and their registry) as the layers above see it.

`fedhet.experiments`, `fedhet.deploy` and `fedhet.cli` import this layer only from here, as a
user's code imports fedhet only from `fedhet/__init__.py`; every other name in
`fedhet.models` is internal to it (tests/test_architecture.py).
"""

from fedhet.models.registry import MODELS, build_model

__all__ = [
    "MODELS",
    "build_model",
]
