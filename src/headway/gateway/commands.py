"""The ``headway gateway`` verb: serve the gateway until SIGINT/SIGTERM.

``headway gateway --config gateway.yaml [--host H] [--port P]`` prints
``headway gateway: serving at http://HOST:PORT (N upstreams)`` first, then serves
(``docs/gateway.md``). SIGTERM or SIGINT drains (up to ``shutdown_timeout_s``), a second
one stops at once.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from pathlib import Path

from headway.flag_types import port_number
from headway.verbs import VERBS


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``gateway``."""
    p = subparsers.add_parser(
        "gateway",
        help=VERBS["gateway"].help,
        description="An OpenAI-compatible gateway that applies headway's admission, queue, "
        "fairness, routing and retry policies in front of engines. Prints its URL, serves "
        "until SIGINT/SIGTERM.",
    )
    p.add_argument("--config", type=Path, required=True, help="gateway.yaml")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=port_number, default=0, help="port (default 0: a free one)")
    p.add_argument("--redis", default=None, metavar="URL",
                   help="share tenant budgets with other instances through this Redis")  # fmt: skip
    p.set_defaults(handler=run)


async def _serve(args: argparse.Namespace) -> None:
    from headway.gateway.config import load_config
    from headway.gateway.server import GatewayServer

    config = load_config(args.config)
    server = GatewayServer(config, config_path=args.config, redis_url=args.redis)
    url = await server.start(args.host, args.port)
    print(  # noqa: T201 - the first line is the URL, for scripts and tests
        f"headway gateway: serving at {url} ({len(config.upstreams)} upstreams)", flush=True
    )
    signals = asyncio.Queue[int]()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, signals.put_nowait, sig)
    try:
        await signals.get()
        # Drain: refuse new work, let queued and in-flight requests finish; a second
        # signal stops at once.
        drain = asyncio.ensure_future(server.drain())
        second = asyncio.ensure_future(signals.get())
        await asyncio.wait((drain, second), return_when=asyncio.FIRST_COMPLETED)
        for task in (drain, second):
            task.cancel()
    finally:
        await server.stop()


def run(args: argparse.Namespace) -> int:
    """Serve until a signal; 0 on a clean stop."""
    from headway.gateway.config import load_config

    load_config(args.config)  # a config error exits 2 before anything starts
    import uvloop

    with contextlib.suppress(KeyboardInterrupt):
        uvloop.run(_serve(args))
    sys.stdout.flush()
    return 0
