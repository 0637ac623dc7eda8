"""ApproxLib: the ATP host library of NetApprox."""
