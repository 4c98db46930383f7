"""Placeholder: the fedsr preset is added in a later commit."""
