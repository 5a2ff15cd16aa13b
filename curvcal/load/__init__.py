"""Loaders: checkpoints, datasets and logits files into tensors and modules."""
