"""Memory before and after running: the planner, the measured peak, XLA's figures, fitting a batch to a budget."""
