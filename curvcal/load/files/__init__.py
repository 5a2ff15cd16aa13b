"""File formats read safely: a checkpoint's container sniffed, pickles scanned and loaded weights-only, the globals a load may admit, state dicts, tensor files."""
