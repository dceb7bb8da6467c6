"""Builders of the layer graph for networks other than decoder transformers (one module per family)."""
