"""Local training: the flat-vector model, mini-batch streams, SGD and evaluation."""
