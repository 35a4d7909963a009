"""The engine model: what one replica of an inference engine does with its requests.

Written once and driven by every front end: the simulator advances it on a virtual clock,
the emulator on the wall clock. See ``docs/engine-model.md``.
"""
