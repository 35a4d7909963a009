"""The upstream pool behind the controller: fingerprint probes decide what is routable.

With a ``pool:`` section in ``gateway.yaml``, :class:`PoolSource` builds the
:class:`~headway.gateway.pool.UpstreamPool` (probes in a reserved lane, warm-up, metrics
scraping) from the gateway's ``upstreams`` and mirrors each pool upstream's verdict into
the controller's :class:`~headway.gateway.control.UpstreamState`: a warming, excluded
(wrong fingerprint) or unreachable upstream is not routed to; the engine's KV block count
replaces ``kv_blocks_per_upstream`` once scraped. It is the controller's
:class:`~headway.gateway.control.UpstreamSource`; everything else is unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from headway.gateway.config import GatewayFileConfig
from headway.gateway.control import UpstreamState
from headway.gateway.pool import Upstream, UpstreamPool, parse_pool_config

__all__ = ["PoolSource", "pool_config_data"]


def pool_config_data(config: GatewayFileConfig) -> dict[str, Any]:
    """The pool's config: the ``pool:`` section plus the gateway's upstreams."""
    assert config.pool is not None
    upstreams = []
    for up in config.upstreams:
        entry: dict[str, Any] = {"url": up.url}
        for name in ("revision", "fingerprint", "model", "served_model", "kv_blocks", "api_key"):
            value = getattr(up, name)
            if value is not None:
                entry[name] = value
        upstreams.append(entry)
    return {**config.pool, "upstreams": upstreams}


class PoolSource:
    """The controller's upstreams, routable as the pool's probes say."""

    def __init__(self, config: GatewayFileConfig, on_change: Callable[[], None]) -> None:
        self.pool = UpstreamPool(parse_pool_config(pool_config_data(config), "gateway pool"))
        self.on_change = on_change
        self.states: list[UpstreamState] = []
        self._by_url: dict[str, UpstreamState] = {}
        for up, u in zip(config.upstreams, self.pool.upstreams, strict=True):
            state = UpstreamState(
                url=u.url,
                revision=u.revision,
                route=up.route,
                slots=up.slots or config.slots_per_upstream,
                total_kv_blocks=up.kv_blocks or config.kv_blocks_per_upstream,
                api_key=up.api_key,
                healthy=u.ready,
            )
            self.states.append(state)
            self._by_url[u.url] = state
        self.pool.subscribe(self._changed)

    def _changed(self, u: Upstream) -> None:
        state = self._by_url.get(u.url)
        if state is None:
            return
        came_back = u.ready and not state.healthy
        state.healthy = u.ready or (u.draining and u.health in ("ready", "busy"))
        if came_back:  # back in rotation by its probes: the passive ejection ends too
            state.reachable_again()
        if u.kv_blocks_total:
            state.total_kv_blocks = u.kv_blocks_total
        self.on_change()

    async def reconfigure(self, config: GatewayFileConfig) -> None:
        """Apply a reloaded config: the pool keeps the state of upstreams that stay (a
        changed revision or fingerprint warms up again), new ones warm up, removed ones
        leave rotation (their in-flight requests finish)."""
        await self.pool.reconfigure(parse_pool_config(pool_config_data(config), "gateway pool"))
        states: list[UpstreamState] = []
        for up, u in zip(config.upstreams, self.pool.upstreams, strict=True):
            state = self._by_url.get(u.url)
            if state is None:  # a new upstream; those that stay keep an admin drain
                state = UpstreamState(url=u.url, api_key=up.api_key)
                self._by_url[u.url] = state
            state.revision = u.revision
            state.route = up.route
            state.slots = up.slots or config.slots_per_upstream
            state.total_kv_blocks = (
                u.kv_blocks_total or up.kv_blocks or config.kv_blocks_per_upstream
            )
            state.healthy = u.ready
            states.append(state)
        kept = {s.url for s in states}
        for url in [url for url in self._by_url if url not in kept]:
            del self._by_url[url]
        self.states[:] = states
        self.on_change()

    def upstreams(self) -> Sequence[UpstreamState]:
        """All of them (the controller routes only to the ready ones)."""
        return self.states

    async def start(self) -> None:
        """Start the probes and scrapes."""
        await self.pool.start()

    async def stop(self) -> None:
        """Stop them."""
        await self.pool.stop()
