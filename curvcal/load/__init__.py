"""Loaders: turn files named on the command line into tensors and modules, safely.

``checkpoint`` is the public entry point for model files; ``formats`` recognises a file without
unpickling it, ``architecture`` builds the module a state dict belongs to, and ``state_dict``
finds, renames and checks the weights.
"""
