"""Time, cost and energy to train, and goodput under failures."""
