"""Reporting: the result and its table, Chrome traces, figures, and a measured trace set beside the simulated step."""
