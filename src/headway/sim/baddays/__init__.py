"""Bad days: seed 002's "Inject bad days" list as named, composable scenarios, and the
matrix of gateway presets × scenarios that ``headway simulate --bad-days`` prints.

:mod:`~headway.sim.baddays.scenario` is the value and :func:`compose`;
:mod:`~headway.sim.baddays.transforms`, what each bad day changes;
:mod:`~headway.sim.baddays.catalogue`, the named scenarios and :func:`get_scenario`;
:mod:`~headway.sim.baddays.cell`, one simulated (scenario, preset) cell and its cost;
:mod:`~headway.sim.baddays.matrix`, :func:`run_bad_days`;
:mod:`~headway.sim.baddays.table`, the terminal table; and
:mod:`~headway.sim.baddays.commands`, the command line. The names below are the
package's public API (``headway.sim.baddays.run_bad_days`` and the rest).
"""

from headway.sim.baddays.catalogue import DEFAULT_SCENARIOS, SCENARIOS, get_scenario
from headway.sim.baddays.cell import BadDayCell, price_per_replica_hour, replica_seconds
from headway.sim.baddays.matrix import PRESETS, SCHEMA, BadDayMatrix, ScenarioInfo, run_bad_days
from headway.sim.baddays.scenario import Scenario, compose
from headway.sim.baddays.table import matrix_table
from headway.sim.baddays.transforms import (
    mean_rate_per_s,
    reference_autoscaler,
    scale_distribution,
    storm_timeout_s,
    tenant_rates_per_s,
)

__all__ = [
    "DEFAULT_SCENARIOS",
    "PRESETS",
    "SCENARIOS",
    "SCHEMA",
    "BadDayCell",
    "BadDayMatrix",
    "Scenario",
    "ScenarioInfo",
    "compose",
    "get_scenario",
    "matrix_table",
    "mean_rate_per_s",
    "price_per_replica_hour",
    "reference_autoscaler",
    "replica_seconds",
    "run_bad_days",
    "scale_distribution",
    "storm_timeout_s",
    "tenant_rates_per_s",
]
