"""Checkpoints into loaded models: weights into their architecture, programs, model folders, the files' metadata and digests, inspection without loading, the loaded model on its device and dtype."""
