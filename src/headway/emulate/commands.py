"""The ``headway emulate`` verb: build one replica and serve it until SIGINT/SIGTERM.

``headway emulate [--model M] [--gpu G] [--tp N] [--cluster FILE] [--profile FILE]
[--host H] [--port P] [--speedup F] [--fault NAME=VALUE ...]`` prints the bound URL on its
first line of output, then serves (``docs/emulate.md``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import math
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from headway.calibrate.profile import read_profile
from headway.core.engine.catalog import get_gpu, get_model
from headway.core.errors import ConfigError
from headway.data import load_efficiency_table
from headway.emulate.faults import FaultState, FaultUpdate, ScaledStepTime, parse_fault_flag
from headway.files.workload import read_yaml
from headway.flag_types import port_number, positive_int
from headway.sim.cluster import ClusterSpec, build_replica, parse_cluster, step_time_model
from headway.verbs import VERBS

if TYPE_CHECKING:
    from headway.emulate.server import EmulatorServer

ADMIN_TOKEN_ENV = "HEADWAY_EMULATOR_ADMIN_TOKEN"
"""Where ``--admin-token`` defaults from (an environment variable keeps it out of ``ps``)."""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``emulate``."""
    p = subparsers.add_parser(
        "emulate",
        help=VERBS["emulate"].help,
        description="An OpenAI-compatible server whose engine is headway's replica model, "
        "advanced on the wall clock. Prints its URL, serves until SIGINT/SIGTERM.",
    )
    p.add_argument("--model", default=None, help="catalog model (default llama-3-8b)")
    p.add_argument("--gpu", default=None, help="catalog GPU (default h100)")
    p.add_argument("--tp", type=positive_int, default=None, help="tensor-parallel GPUs (default 1)")
    p.add_argument("--cluster", type=Path, default=None, help="a cluster file (one replica)")
    p.add_argument("--profile", type=Path, default=None, help="a profile from `calibrate`")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=port_number, default=0, help="port (default 0: a free one)")
    p.add_argument("--speedup", type=float, default=1.0,
                   help="engine seconds per wall second (default 1; >1 for tests)")  # fmt: skip
    p.add_argument("--served-model-name", action="append", default=[],
                   help="name clients use in `model` (repeatable; default the model)")  # fmt: skip
    p.add_argument("--revision", default="r1", help="model revision: sets the output tokens")
    p.add_argument("--default-max-tokens", type=positive_int, default=128,
                   help="mean output length without max_tokens (default 128)")  # fmt: skip
    p.add_argument("--max-num-seqs", type=positive_int, default=None, help="engine max_num_seqs")
    p.add_argument("--max-num-batched-tokens", type=positive_int, default=None,
                   help="engine max_num_batched_tokens")  # fmt: skip
    p.add_argument(
        "--num-kv-blocks", type=positive_int, default=None, help="KV pool size in blocks"
    )
    p.add_argument("--max-model-len", type=positive_int, default=None,
                   help="longest prompt + output accepted (default: the model's context "
                   "length, at most the KV pool), as vLLM's --max-model-len")  # fmt: skip
    p.add_argument("--prefix-caching", action="store_true",
                   help="hash prompt blocks so equal prefixes (and cache_salt) hit the prefix "
                   "cache, as vLLM does (default: off, every prompt block is new)")  # fmt: skip
    p.add_argument("--fault", action="append", default=[], metavar="NAME=VALUE",
                   help="a fault knob at start, e.g. slowdown_factor=3 (repeatable)")  # fmt: skip
    p.add_argument("--admin-token", default=os.environ.get(ADMIN_TOKEN_ENV),
                   help="bearer token that /admin/faults requires (default: the "
                   f"{ADMIN_TOKEN_ENV} environment variable; unset: /admin/faults is "
                   "open)")  # fmt: skip
    p.add_argument("--header-timeout-s", type=float, default=10.0,
                   help="a request's headers must arrive in this (408; default 10)")  # fmt: skip
    p.add_argument("--body-timeout-s", type=float, default=30.0,
                   help="its body within this after them (408; default 30)")  # fmt: skip
    p.add_argument("--max-connections", type=positive_int, default=1000,
                   help="open client connections; one more gets 503 (default 1000)")  # fmt: skip
    p.set_defaults(handler=_emulate)


def cluster_for(args: argparse.Namespace) -> ClusterSpec:
    """The one-replica cluster the flags describe (flags override the cluster file)."""
    data: dict[str, object] = {}
    source = "<flags>"
    if args.cluster is not None:
        loaded = read_yaml(args.cluster)
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"{args.cluster}: a cluster file is a mapping", path="$")
        data = dict(loaded or {})
        source = str(args.cluster)
    for key, value in (("model", args.model), ("gpu", args.gpu), ("tensor_parallel", args.tp),
                       ("num_kv_blocks", args.num_kv_blocks)):  # fmt: skip
        if value is not None:
            data[key] = value
    engine = dict(data.get("engine") or {})  # type: ignore[call-overload]
    if args.max_num_seqs is not None:
        engine["max_num_seqs"] = args.max_num_seqs
    if args.max_num_batched_tokens is not None:
        engine["max_num_batched_tokens"] = args.max_num_batched_tokens
    if engine:
        data["engine"] = engine
    if args.profile is not None:
        profile = read_profile(args.profile)
        data["profile"] = msgspec.to_builtins(profile.step_time)
        data["step_time"] = "profile"
    spec = parse_cluster(data, source)
    if spec.replicas != 1:
        sys.stderr.write(
            f"headway emulate: {source} has {spec.replicas} replicas; serving one of them "
            "(start one emulator per replica for the whole cluster)\n"
        )
    return spec


def build_server(args: argparse.Namespace) -> tuple[EmulatorServer, list[FaultUpdate]]:
    """The server the flags describe (not started) and its start-up faults."""
    # aiohttp loads only for this verb: other verbs start faster without it.
    from headway.emulate.server import (
        MAX_BODY_BYTES,
        EmulatorServer,
        EmulatorSettings,
        served_names,
    )
    from headway.http_boundary import BoundaryLimits

    if not (args.speedup > 0):
        raise ConfigError(f"--speedup must be > 0 (got {args.speedup})", path="--speedup")
    spec = cluster_for(args)
    faults = FaultState()
    updates = [parse_fault_flag(text) for text in args.fault]
    try:  # what only the engine model can judge (heads per GPU, a pool that fits)
        step_time = step_time_model(spec, load_efficiency_table())
        replica = build_replica(spec, ScaledStepTime(step_time, faults))
    except ValueError as error:
        source = "--cluster" if args.cluster is not None else "--model/--gpu/--tp/--num-kv-blocks"
        raise ConfigError(f"{source}: {error}", path=source) from None
    model = get_model(spec.model)
    settings = EmulatorSettings(
        served_model_names=served_names(spec.model, args.served_model_name),
        revision=args.revision,
        vocab_size=model.vocab_size,
        max_model_len=args.max_model_len or model.max_position_embeddings,
        default_max_tokens=args.default_max_tokens,
        hardware=f"{spec.tensor_parallel}x {get_gpu(spec.gpu).name}",
        step_time=str(args.profile) if args.profile is not None else spec.step_time,
        prefix_caching=args.prefix_caching,
    )
    for flag, value in (("--header-timeout-s", args.header_timeout_s),
                        ("--body-timeout-s", args.body_timeout_s)):  # fmt: skip
        if not (value > 0 and math.isfinite(value)):
            raise ConfigError(f"{flag} must be a number of seconds > 0 (got {value})", path=flag)
    limits = BoundaryLimits(
        header_timeout_s=args.header_timeout_s, body_timeout_s=args.body_timeout_s,
        max_connections=args.max_connections, max_body_bytes=MAX_BODY_BYTES,
    )  # fmt: skip
    if args.admin_token is not None and not args.admin_token.strip():
        raise ConfigError("--admin-token must not be empty; omit it to leave /admin/faults "
                          "open", path="--admin-token")  # fmt: skip
    server = EmulatorServer(
        replica, settings, speedup=args.speedup, faults=faults, admin_token=args.admin_token,
        limits=limits,
    )  # fmt: skip
    return server, updates


async def serve(
    server: EmulatorServer, host: str, port: int, faults: Sequence[FaultUpdate] = ()
) -> None:
    """Start ``server``, print its URL, serve until SIGINT or SIGTERM, stop cleanly."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    url = await server.start(host, port)
    for update in faults:
        server.apply_faults(update)
    s = server.settings
    sys.stdout.write(
        f"headway emulate: serving {s.served_model_names[0]} at {url} "
        f"(speedup {server.engine.speedup:g}, max_model_len {server.max_model_len})\n"
    )
    sys.stdout.flush()
    try:
        await stop.wait()
    finally:
        await server.stop()
        with contextlib.suppress(BrokenPipeError):  # the reader of our output may be gone
            sys.stdout.write("headway emulate: stopped\n")
            sys.stdout.flush()


def _emulate(args: argparse.Namespace) -> int:
    server, faults = build_server(args)
    logging.basicConfig(level=logging.WARNING, format="headway emulate: %(message)s")
    asyncio.run(serve(server, args.host, args.port, faults))
    return 0


__all__ = ["build_server", "cluster_for", "register", "serve"]
