"""The precision value, per-op precision facts, rounding, casting at boundaries, float32 specs."""
