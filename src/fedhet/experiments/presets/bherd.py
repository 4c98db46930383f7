"""Placeholder: the bherd preset is added in a later commit."""
