"""Placeholder: the fednova preset is added in a later commit."""
