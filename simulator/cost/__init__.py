"""Cost models: compute (roofline and calibrated curves), collectives, topology, interference, jitter, host floors, and the fit of a hardware profile from microbenchmarks."""
