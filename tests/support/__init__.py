"""What the tests share: small models and checkpoints, the simulated and virtual-time devices,
the broken variants gpu-check puts back, the pipelines the runner tests use."""
