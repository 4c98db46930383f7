"""Datasets, generators and partitioners."""
