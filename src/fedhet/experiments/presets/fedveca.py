"""Placeholder: the fedveca preset is added in a later commit."""
