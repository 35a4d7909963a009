"""Routing calls to replicas and stepping the replicas on virtual time.

A replica is stepped one engine step at a time, or, when its next steps are identical
decode steps, as one pending *decode run* that ends with a single event; anything that
touches the replica inside the run first *materializes* the steps that started before it
(see :mod:`headway.sim.simulator`).
"""

from __future__ import annotations

from typing import cast

from headway.core.engine.kv import expand_block_hashes
from headway.core.engine.replica import ReplicaModel
from headway.core.engine.scheduler import EngineRequest
from headway.core.policy.routing import Router, RouteRequest
from headway.sim.driver import IDLE, RUN, STEP, ReplicaDriver
from headway.sim.events import EV_BOUNDARY
from headway.sim.kernel import BOUNDARY
from headway.sim.pools import RoutePools
from headway.sim.recording import Recording


class ReplicaStepping(Recording):
    """The simulator's replicas: route a call, add it, step, skip identical decode steps."""

    def _init_routing(
        self,
        router: Router,
        replicas: list[ReplicaModel],
        *,
        skip_decode: bool,
        check_invariants: bool,
    ) -> None:
        """The router's shortcuts, per-replica outstanding counts, and the stepping knobs."""
        self._needs_kv = router.kind == "kv_aware"
        self._skip_decode = skip_decode
        self._paranoid = check_invariants
        self._block_size = replicas[0].config.block_size
        self._outstanding = [0] * len(replicas)
        self._least_outstanding = router.kind == "least_outstanding_requests"
        """Route with ``Router.route_all_eligible`` over ``_outstanding``: valid because the
        simulator never marks a replica unready nor pins a revision, so every replica is
        always eligible (with ``check_invariants`` the full ``route`` decides and the two
        are checked against each other)."""

    def _init_pools(self, pools: RoutePools | None, router: Router, call_route: list[int]) -> None:
        """Per call, the pool of its route, and a router per pool (no pools: empty)."""
        self._pool_lo = []
        self._pool_hi = []
        self._pool_routers = []
        self._call_pool = []
        self._call_route = []
        self._pools = pools
        if pools is None:
            return
        for lo, hi in pools.bounds:
            self._pool_lo.append(lo)
            self._pool_hi.append(hi)
            self._pool_routers.append(Router(kind=router.kind))
        self._call_pool = [pools.route_pool[r] for r in call_route]
        self._call_route = list(call_route)

    def _route(self, j: int, now: float) -> int:
        """The replica the router picks for call ``j`` at ``now`` (disaggregated: among
        the prefill replicas; with pools: among its route's pool)."""
        if self._num_prefill:
            return self._route_pool(j, now, 0, self._num_prefill, self.router)
        if self._pool_lo:
            p = self._call_pool[j]
            choice = self._route_pool(
                j, now, self._pool_lo[p], self._pool_hi[p], self._pool_routers[p]
            )
            if choice < 0 and self._pools is not None and self._pools.fallback is not None:
                q = self._pools.fallback_pool(now, self._call_route[j], self._pool_health)
                if q >= 0:
                    choice = self._route_pool(
                        j, now, self._pool_lo[q], self._pool_hi[q], self._pool_routers[q]
                    )
                    if choice >= 0:
                        self._fell_back[j] = True
            return choice
        prompt, output = self._call_in[j], self._call_out[j]
        if self._least_outstanding and self._all_eligible and not self._paranoid:
            choice = self.router.route_all_eligible(self._outstanding)
        else:
            request = RouteRequest(
                prompt_tokens=prompt,
                expected_output_tokens=output,
                projected_kv_blocks=-(-(prompt + output) // self._block_size),
            )
            if self._needs_kv:
                for d in self.drivers:
                    self._materialize(d, now)
            picked = self.router.route(now, request, self.drivers)
            if picked is None:
                return -1  # every replica is lost, starting or draining
            if (
                self._least_outstanding
                and self._all_eligible
                and picked != self.router.route_all_eligible(self._outstanding)
            ):
                raise RuntimeError(f"call {j}: the router picked {picked}, the shortcut not")
            choice = picked
        return choice

    def _pool_health(self, p: int) -> float:
        """Pool ``p``'s routable share of its replicas (the fallback policy's health)."""
        lo, hi = self._pool_lo[p], self._pool_hi[p]
        return sum(1 for d in self.drivers[lo:hi] if d.ready) / (hi - lo)

    def _route_pool(self, r: int, now: float, lo: int, hi: int, router: Router) -> int:
        """The replica in ``lo..hi - 1`` (a pool, or a disaggregated phase's replicas) that
        ``router`` picks for row ``r``: over the outstanding counts while every replica is
        eligible, else over their load views (a lost replica is not routable)."""
        if self._least_outstanding and self._all_eligible and not self._paranoid:
            return lo + router.route_all_eligible(self._outstanding[lo:hi])
        prompt, output = self._call_in[r], self._call_out[r]
        request = RouteRequest(
            prompt_tokens=prompt,
            expected_output_tokens=output,
            projected_kv_blocks=-(-(prompt + output) // self._block_size),
        )
        pool = self.drivers[lo:hi]
        if self._needs_kv:
            for d in pool:
                self._materialize(d, now)
        picked = router.route(now, request, pool)
        if picked is None:
            return -1
        if (
            self._least_outstanding
            and self._all_eligible
            and picked != router.route_all_eligible(self._outstanding[lo:hi])
        ):
            raise RuntimeError(f"row {r}: the router picked {lo + picked}, the shortcut not")
        return lo + picked

    def _send(self, j: int, choice: int, now: float) -> None:
        """Add call ``j`` to replica ``choice`` at ``now`` (disaggregated: to a prefill
        replica, for its first token only)."""
        prompt, output = self._call_in[j], self._call_out[j]
        driver = self.drivers[choice]
        self._materialize(driver, now)
        req = EngineRequest(
            j,
            num_prompt_tokens=prompt,
            max_output_tokens=1 if self._num_prefill else output,
            priority=self._call_prio[j],
            block_hashes=self._block_hashes(j),
        )
        driver.model.add_request(req, now)
        driver.outstanding_requests += 1
        self._outstanding[choice] += 1
        driver.outstanding_tokens += prompt + (1 if self._num_prefill else output)
        self._dispatch_s[j] = now
        self._replica_enter_s[j] = now
        self._replica[j] = choice
        if driver.state == IDLE:
            driver.state = STEP
            driver.step_result = None
            driver.version += 1
            self.events.push(now, BOUNDARY, EV_BOUNDARY, choice, driver.version)

    def _block_hashes(self, j: int) -> list[int]:
        """Prefix-block hashes of call ``j`` at the engine's block size: from its replayed
        trace row's ``hash_ids`` (Mooncake), so calls sharing a prefix share KV blocks;
        none for calls without them (their blocks get request-unique hashes)."""
        row = self._call_prefix_row[j]
        if row < 0:
            return []
        ids, block_tokens = self.w.prefix_hash_ids[row]
        return expand_block_hashes(
            ids.tolist(),
            self._call_in[j],
            block_size=self._block_size,
            source_block_tokens=block_tokens,
        )

    def _materialize(self, driver: ReplicaDriver, now: float) -> None:
        """Apply the steps of a pending decode run that started before ``now``."""
        if driver.state != RUN:
            return
        start_s, num_steps = driver.run_start_s, driver.run_steps
        # The run's first step started when it was planned; a later step that starts
        # exactly at `now` has not (its boundary would come after this dispatch).
        m = driver.model.decode_steps_starting_before(start_s, now, num_steps)
        m = min(max(m, 1), num_steps)
        applied = driver.model.advance_decode_steps(start_s, m)
        self._record_run(applied)
        driver.busy_s += applied.end_s - applied.start_s
        self._num_skipped += m - 1
        driver.state = STEP
        driver.step_result = None
        driver.pending_finished = cast("tuple[int, ...]", applied.finished_ids)
        driver.version += 1
        self.events.push(applied.end_s, BOUNDARY, EV_BOUNDARY, driver.index, driver.version)

    def _boundary(self, driver: ReplicaDriver, now: float) -> None:
        """A step or run ended at ``now``: deliver it, then start the next."""
        model = driver.model
        if driver.state == RUN:
            run = model.advance_decode_steps(driver.run_start_s, driver.run_steps)
            self._record_run(run)
            driver.busy_s += run.end_s - run.start_s
            self._num_skipped += run.num_steps - 1
            finished = cast("tuple[int, ...]", run.finished_ids)
        elif driver.step_result is not None:
            finished = cast("tuple[int, ...]", driver.step_result.finished_ids)
        else:
            finished = driver.pending_finished
        driver.state = STEP  # nothing pending: a cancellation below must not re-apply
        driver.step_result = None
        driver.pending_finished = ()
        for j in finished:
            self._call_finished(j, now, driver)
        if self._paranoid:
            model.check_invariants()
        if not model.scheduler.has_unfinished_requests:
            driver.state = IDLE
            if driver.draining and driver.alive:
                driver.alive = False
                driver.stopped_s = now
                self._provisioned_changed(now)
            return
        if driver.pending_loss is not None and self._strike_pending_loss(
            driver, now, prefill=model.max_identical_decode_steps() < 1
        ):
            return
        steps = model.max_identical_decode_steps() if self._skip_decode else 0
        driver.version += 1
        if steps >= 2:
            driver.state = RUN
            driver.run_start_s = now
            driver.run_steps = steps
            end_s = model.decode_run_end_s(now, steps)
            self.events.push(end_s, BOUNDARY, EV_BOUNDARY, driver.index, driver.version)
            return
        result = model.step(now)
        self._num_steps += 1
        self._record_step(result)
        driver.busy_s += result.end_s - result.start_s
        driver.state = STEP
        driver.step_result = result
        if result.is_empty and not model.num_running:
            # Nothing can run until something changes (a cancellation or an arrival).
            driver.state = IDLE
            return
        self.events.push(result.end_s, BOUNDARY, EV_BOUNDARY, driver.index, driver.version)
