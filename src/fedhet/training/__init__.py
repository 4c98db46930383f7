"""Local training: the flat-vector model, mini-batch streams, SGD and evaluation.

It offers nothing to the layers above the engine (tests/test_architecture.py): the engine and
the algorithms, below them, import its modules by their paths.
"""

__all__: list[str] = []
