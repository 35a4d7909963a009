"""``headway calibrate``: fit a step-time profile from a live OpenAI-compatible endpoint.

:mod:`.plan` designs the probes, :mod:`.probe` sends them and times the streams,
:mod:`.fit` fits the step-time model, :mod:`.profile` reads and writes the profile file
that ``simulate`` (cluster ``profile:``) and ``emulate --profile`` accept.
"""
