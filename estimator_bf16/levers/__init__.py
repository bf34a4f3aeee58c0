"""Memory levers beyond bfloat16, put on an unmodified model_fn: gradient accumulation and recompute."""
