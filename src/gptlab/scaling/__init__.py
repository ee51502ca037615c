"""Scaling laws: sweeps of model sizes under FLOP budgets (sweep), and the laws fitted to their results (fit)."""
