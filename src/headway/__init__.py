"""headway: LLM serving capacity as a queue.

The package is one pure core (``headway.core``: workload model, engine model, policies,
queueing arithmetic) driven by several front ends (``planner``, ``trace``, the CLI, and
later the simulator, emulator, bench and gateway). See ``DESIGN`` in the docs.
"""

from importlib.metadata import PackageNotFoundError, version

from headway import native

native.install()  # before any compiled module is imported: stale builds use the sources

try:
    __version__ = version("headway")
except PackageNotFoundError:  # running from a source tree without an install
    __version__ = "0.0.0+unknown"

__all__ = ["__version__"]
