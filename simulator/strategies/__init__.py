"""Training strategies, one kind per module, registered by name (``registry.py``).

A kind owns its config (a pydantic model in the scenario's ``strategy:`` block, told apart
by ``kind``) and compiles the scenario's workload onto its cluster into per-actor task lists
for the engine. ``spmd/`` is the synchronous data/tensor/pipeline/context/expert-parallel
family with ZeRO (the default kind); the others change how steps relate to each other.
"""
