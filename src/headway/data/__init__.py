"""Data files shipped with headway, and their loaders (I/O lives here, outside the core).

``efficiency.json`` holds the roofline efficiency profiles that ``scripts/fit_efficiency.py``
fitted to public GPU timing measurements; :func:`load_efficiency_table` reads and validates
it with the pure :func:`headway.core.engine.efficiency.parse_efficiency_table`.
"""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources

from headway.core.engine.efficiency import EfficiencyTable, parse_efficiency_table

__all__ = ["EFFICIENCY_FILE", "load_efficiency_table"]

EFFICIENCY_FILE = "efficiency.json"
"""Name of the efficiency file inside this package."""


@lru_cache(maxsize=1)
def load_efficiency_table() -> EfficiencyTable:
    """The shipped efficiency table (read once per process)."""
    text = resources.files("headway.data").joinpath(EFFICIENCY_FILE).read_text(encoding="utf-8")
    return parse_efficiency_table(json.loads(text))
