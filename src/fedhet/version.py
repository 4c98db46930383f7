"""fedhet's version (`fedhet.__version__`), kept apart from the package's surface so a module of
fedhet that records or compares it imports nothing else."""

__version__ = "0.1.0"
