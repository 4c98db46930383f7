"""fedhet: federated learning on non-IID data with heterogeneous local work."""

__version__ = "0.1.0"
