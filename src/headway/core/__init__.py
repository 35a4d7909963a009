"""The pure core of headway.

Nothing under ``headway.core`` does I/O, reads the wall clock or touches a global random
number generator: time comes in as an argument (``now``), randomness as an injected
``numpy.random.Generator`` derived from one run seed (:mod:`headway.core.seeding`), and
files are read by the drivers around the core. ``tests/unit/test_layering.py`` keeps it so.
"""
