"""The verbs of the ``headway`` command: the module that registers each, and its line in
``headway --help``.

Kept apart from the verbs" modules, so that ``headway --help`` (and a mistyped verb) lists
them without importing any: a verb"s module loads what it runs (scipy, the simulator, an
HTTP stack) and takes up to a second to import.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["VERBS", "Verb"]


@dataclass(frozen=True)
class Verb:
    module: str
    """The module whose ``register(subparsers)`` adds the verb"s parser."""
    help: str
    """Its line in ``headway --help``."""


VERBS: dict[str, Verb] = {
    "plan": Verb(
        "headway.planner.commands",
        "how many replicas, where is the knee, what does a burst do",
    ),
    "report": Verb(
        "headway.report.commands",
        "re-render report.html from a plan.json, without re-running",
    ),
    "simulate": Verb(
        "headway.sim.commands",
        "simulate a workload on a cluster: goodput, tails, KV occupancy",
    ),
    "sweep": Verb(
        "headway.sim.commands",
        "scale offered load and find the knee",
    ),
    "trace": Verb(
        "headway.trace.commands",
        "read and describe request traces",
    ),
    "workload": Verb(
        "headway.files.commands",
        "check workload files",
    ),
    "emulate": Verb(
        "headway.emulate.commands",
        "serve an OpenAI-compatible engine emulator (no GPU): the simulator's engine model",
    ),
    "calibrate": Verb(
        "headway.calibrate.commands",
        "probe an OpenAI-compatible endpoint and fit a step-time profile",
    ),
    "check": Verb(
        "headway.check.commands",
        "the endpoint contract: tokenizer, chat template, greedy ids, EOS, stop, logprobs, "
        "usage; the first mismatch against a reference",
    ),
    "bench": Verb(
        "headway.bench.commands",
        "open-loop load test of an OpenAI-compatible endpoint: goodput, tails, knee",
    ),
    "gateway": Verb(
        "headway.gateway.commands",
        "serve an admission-control gateway in front of OpenAI-compatible engines",
    ),
    "drill": Verb(
        "headway.drill.commands",
        "run fault drills (kill engines, corrupt fingerprints, Redis outage, ...) against "
        "gateway + engines and judge the designed outcome",
    ),
}
