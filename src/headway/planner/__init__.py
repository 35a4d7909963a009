"""Capacity planning: the analytic plan, then simulated stages that check it (``plan``)."""
