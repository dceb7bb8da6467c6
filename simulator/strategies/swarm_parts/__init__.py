"""Helpers of the ``swarm`` strategy kind (simulator/strategies/swarm.py): seeded preemptions and the
compile-time dispatcher that routes micro-batches over the peers."""
