"""Training that fails safely: the graph audit, numeric guards, activation range, preemption, checkpoints."""
