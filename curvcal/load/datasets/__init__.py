"""Datasets of images and tensors: image folders, torchvision, tensor files, py: factories, labels and splits, preprocessing, batches, the loaded data and its provenance."""
