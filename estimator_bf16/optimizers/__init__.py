"""Optimizers by name, and the ones TensorFlow 1 does not ship (Adafactor, AdamW)."""
