"""Offline knowledge: instance types and GPUs, images, one price table, model architectures."""
