"""``headway drill``: fault drills against gateway + engines, each with a designed outcome.

A drill is data (:mod:`headway.drill.catalog`): a stack to start, a load to offer, faults
at given times, and the outcomes that must follow. :mod:`headway.drill.run` carries it out
against a local stack (gateway + emulated engines, started here) or a user's deployment,
and judges what it observed. See ``docs/drills.md``.
"""
