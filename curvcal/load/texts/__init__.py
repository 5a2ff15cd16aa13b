"""Text data: tokenizers, texts and text pairs, multiple-choice data."""
