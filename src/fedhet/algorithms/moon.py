"""Placeholder: implemented in a later commit."""
