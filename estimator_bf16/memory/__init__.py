"""Memory: the planner, the measured peak, the levers and fitting a batch to a budget."""
