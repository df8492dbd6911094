"""Training stage: the engine every run goes through. The Trainer and its one TrainStep, the recipe seam (what a
kind of run supplies: pretraining here, fine-tuning in burnout/finetune/), checkpoints and exact resume, metrics,
phases, schedules, optimizers, DDP/FSDP, hardware, and the memory and cost plan."""
