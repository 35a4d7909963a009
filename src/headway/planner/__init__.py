"""Capacity planning: the analytic plan, then simulated stages that check it (``plan``)."""

STEADY_POINT_DURATION_S = 180.0
"""Simulated seconds of each steady point of the plan's searches (``--point-duration-s``);
here, not in the simulated stages' module, so that parsing the command line stays light."""

STAGES = ("replicas", "knee", "bursts", "bad-days")
"""The simulated stages of a plan, in the order they run (``plan --stages``)."""
