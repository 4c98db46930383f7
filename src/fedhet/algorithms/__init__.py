"""fedhet.algorithms."""
