"""fedhet.models."""
