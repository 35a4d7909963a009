"""headway: LLM serving capacity as a queue.

The package is one pure core (``headway.core``: workload model, engine model, policies,
the gateway's decisions, the request lifecycle, queueing arithmetic) driven by several
drivers: ``planner`` (``plan``), ``sim`` (``simulate``, ``sweep``), ``trace``, ``bench``,
``calibrate``, ``emulate``, ``gateway`` and ``drill``, with ``realengine`` to install and
start a real vLLM beside them. See ``DESIGN`` in the docs.
"""

from importlib.metadata import PackageNotFoundError, version

from headway import native

native.install()  # before any compiled module is imported: stale builds use the sources

try:
    __version__ = version("headway")
except PackageNotFoundError:  # running from a source tree without an install
    __version__ = "0.0.0+unknown"

__all__ = ["__version__"]
