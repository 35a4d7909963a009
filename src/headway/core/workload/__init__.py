"""The workload model: what arrives, how big it is, and what it was promised.

``spec`` holds the file format as types, ``validate`` the checks across sections,
``distributions`` and ``arrivals`` the random processes, and ``compile`` turns a spec and
a seed into a deterministic columnar stream of tasks and calls.
"""
