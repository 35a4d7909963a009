"""Capacity planning: the analytic plan now; simulated sweeps build on it."""
