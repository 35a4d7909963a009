"""``headway bench``: an open-loop load generator for OpenAI-compatible endpoints.

One schedule from one seed (the compiled workload), sent on a monotonic clock over a
pre-opened keep-alive pool; per-call records; lateness, achieved rate, goodput and the
knee. See ``docs/bench.md``.
"""
