"""Exploration: layout search, sweeps over scenario fields (local processes or Dask), scaling curves."""
