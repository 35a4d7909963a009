"""The discrete-event simulator: the core's engine model and policies on a virtual clock."""
