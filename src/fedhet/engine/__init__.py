"""fedhet.engine."""
