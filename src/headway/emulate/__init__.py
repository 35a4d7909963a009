"""``headway emulate``: an OpenAI-compatible engine emulator without a GPU.

The core :class:`~headway.core.engine.replica.ReplicaModel` (the simulator's engine model)
advanced on the wall clock behind HTTP: :mod:`.clock` paces it, :mod:`.openai_api` reads
and writes the OpenAI wire format, :mod:`.server` serves it, :mod:`.faults` holds the drill
knobs; its metrics are declared in :mod:`headway.metrics_catalog`. ``docs/emulate.md`` is
the user's guide.
"""
