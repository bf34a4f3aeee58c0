"""Training that fails safely: numeric guards, activation range, preemption, checkpoints."""
