"""A real vLLM for tests and benchmarks: its venv, a tiny locally built model, its server.

:mod:`~headway.realengine.install` puts vLLM's CPU build in a venv of its own,
:mod:`~headway.realengine.model` builds the tiny Llama-shaped model it serves, and
:mod:`~headway.realengine.server` runs the server on a loopback port. ``python -m
headway.realengine`` does the first two (what ``.ci/run`` does before the real-engine tier).
"""
