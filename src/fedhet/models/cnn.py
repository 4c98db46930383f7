"""Convolutional models of the seed papers. Added in a later commit."""
