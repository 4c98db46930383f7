"""fedhet.experiments."""
