"""The synchronous SPMD strategy (dp, tp, pp, cp, ep, ZeRO): the layout, the pipeline schedules and the planner."""
