"""What every stage above the models shares: the device and precision a run computes in, checkpoints
(save, list, resolve, load, RNG state) and `load_model`, the one way from a checkpoint to a model."""
