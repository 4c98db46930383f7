"""Placeholder: the fednnnn preset is added in a later commit."""
