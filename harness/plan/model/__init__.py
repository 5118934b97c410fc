"""The model's shape: its tensors and transformer sizes, from a preset, the public catalogue, a
Hugging Face config or a traced model."""
