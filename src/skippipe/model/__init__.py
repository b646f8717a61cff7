"""The LLaMA-style model: configs and presets, stage modules, checkpoints, Hugging Face interop."""
