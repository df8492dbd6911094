"""Training stage: the training loop, phases, schedules, optimizers, metrics, DDP/FSDP, hardware and plan."""
