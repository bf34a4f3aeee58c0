"""The precision value, casting at boundaries, float32 master weights, the audit."""
