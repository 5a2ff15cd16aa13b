"""Scores with labels (logits, probabilities, log-probabilities) from tensor files and tables (.csv, .parquet)."""
