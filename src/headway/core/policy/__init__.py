"""Overload and placement policies: pure functions of ``now`` and a load snapshot.

The simulator and the live gateway call the very same objects.
"""
