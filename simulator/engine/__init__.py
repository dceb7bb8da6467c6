"""The discrete-event engine: tasks on streams, rendezvous, the flow network. It knows nothing of GPUs or strategies."""
