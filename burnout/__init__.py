"""GPUburnout: train language models from scratch, stage by stage."""

__version__ = "0.1.0"
