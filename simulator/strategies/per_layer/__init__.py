"""Per-layer parallelism: each layer's split, the reshards and halos between layers, bursts.

``config`` (the schema), ``sharding`` (sizes, per-device work, layouts, reshard algebra),
``halo`` (spatial halo exchange), ``cost`` (the planners' oracle: ``layer_cost_s``,
``reshard_cost_s``), ``kind`` (the strategy kind: plan and memory).
"""
