"""Memory of a rank: the analytic peak (model states, activations, buffers) and the frameworks' fitted overheads."""
