"""What every stage above the models shares: the device and precision a run computes in, checkpoints
(save, list, resolve, load, RNG state), `load_model` (the one way from a checkpoint to a model), Hugging Face
import and export, and the ChatML template that makes a checkpoint a chat model."""
