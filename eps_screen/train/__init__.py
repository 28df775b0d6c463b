"""An adapter from examples: the training data, LoRA SFT, cells trained together in shared passes, and a
GPU job's training stages."""
