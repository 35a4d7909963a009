"""The drills: seed 003's list plus Redis outage, retry storm, rolling restart, config
reload and a 10× soak, each with the behaviour the design promises and the figures that
show it. ``docs/drills.md`` explains each one; ``headway drill --list`` prints them.

Sizes are for the local stack (3 emulated Llama-3-8B/H100 engines, ``max_num_seqs`` 4,
real-time speed: about 25 calls/s of the default shape), kept short so ``headway drill
all`` runs in a few minutes on two cores.
"""

from __future__ import annotations

from typing import Final

from headway.drill.spec import Drill, Expect, Fault, LoadSpec, StackSpec

__all__ = ["DRILLS", "drill_names"]

A: Final = "sk-drill-a"
B: Final = "sk-drill-b"
HEAVY: Final = "sk-drill-heavy"

NOTHING_LOST = Expect(
    figure="lost", op="==", value=0, why="every call ends in one terminal state; none hangs"
)
NO_5XX = Expect(
    figure="server_errors",
    op="==",
    value=0,
    why="no 5xx except designed refusals (429/503 with a reason and Retry-After)",
)
BALANCED = Expect(
    figure="accounting_mismatch",
    op="==",
    value=0,
    why="the clients' outcomes match the gateways' counters call for call",
)
RETRY_AFTER = Expect(
    figure="sheds_missing_retry_after",
    op="==",
    value=0,
    why="every 429/503 refusal says when to come back (but a budget's that has no turn left)",
)
ENGINES_IDLE = Expect(
    figure="engine_running_after",
    op="==",
    value=0,
    why="nothing is left running in an engine once the clients are gone",
)
ALL_READY = Expect(
    figure="upstreams_not_ready_after",
    op="==",
    value=0,
    why="the faulted engine is back in rotation after its probes pass",
)

_DRILLS: Final = [
    Drill(
        name="kill-prefill",
        title="Kill one engine during prefill",
        seed_text="Kill one worker during prefill.",
        designed=(
            "Retry: a call whose engine dies before answering has sent nothing to its client, "
            "so the gateway moves it to another engine (within the retry budget) and ejects "
            "the dead one; the engine is restarted and rejoins after its probes pass."
        ),
        load=LoadSpec(
            rate_per_s=8, duration_s=7, stream_fraction=0.0, prompt_words=2500, max_tokens=16
        ),
        faults=[
            Fault(at_s=3.0, action="kill_engine", engine=0),
            Fault(at_s=4.5, action="restart_engine", engine=0),
        ],
        expect=[
            Expect(
                figure="ok_fraction",
                op="==",
                value=1.0,
                why="every call the dead engine held is retried on another",
            ),
            Expect(
                figure="gateway_upstream_errors_faulted",
                op=">=",
                value=1,
                why="the gateway's metrics name the engine that failed",
            ),
            Expect(
                figure="gateway_upstream_retries",
                op="<=",
                value=8,
                why="retries are bounded: at most one per call the engine held (4) "
                "plus connection failures before it is ejected",
            ),
            NOTHING_LOST,
            NO_5XX,
            BALANCED,
            ALL_READY,
        ],
    ),
    Drill(
        name="kill-decode",
        title="Kill one engine during decode",
        seed_text="Kill ... another during decode.",
        designed=(
            "Fail the few, spare the rest: streams already under way on the dead engine end "
            "without [DONE] (a retry would duplicate what the client has), calls not yet "
            "answered are retried elsewhere, new calls avoid the engine until it is back."
        ),
        load=LoadSpec(rate_per_s=6, duration_s=8, stream_fraction=1.0, max_tokens=160),
        faults=[
            Fault(at_s=4.0, action="kill_engine", engine=1),
            Fault(at_s=5.5, action="restart_engine", engine=1),
        ],
        expect=[
            Expect(
                figure="cut",
                op="<=",
                value=4,
                why="only streams running on the dead engine (max_num_seqs 4) are cut",
            ),
            Expect(
                figure="gateway_upstream_errors_faulted",
                op=">=",
                value=1,
                why="the gateway's metrics name the engine that failed",
            ),
            Expect(figure="ok_fraction", op=">=", value=0.9, why="everyone else is served"),
            NOTHING_LOST,
            NO_5XX,
            ALL_READY,
        ],
    ),
    Drill(
        name="slow-client",
        title="Slow streaming clients",
        seed_text="Slow a streaming client.",
        designed=(
            "Isolation: a client that reads slowly holds only its own connection; the gateway "
            "relays with back-pressure and other clients' first tokens are not delayed."
        ),
        load=LoadSpec(
            rate_per_s=10,
            duration_s=6,
            stream_fraction=1.0,
            max_tokens=48,
            slow_reader_fraction=0.3,
            slow_read_pause_s=0.05,
        ),
        expect=[
            Expect(
                figure="ok_fraction",
                op="==",
                value=1.0,
                why="slow readers and fast ones all get whole answers",
            ),
            Expect(
                figure="ttft_p99_s",
                op="<=",
                value=1.0,
                why="first tokens are not held up behind slow readers",
            ),
            NOTHING_LOST,
            NO_5XX,
            BALANCED,
            ENGINES_IDLE,
        ],
    ),
    Drill(
        name="corrupt-fingerprint",
        title="Corrupt a readiness fingerprint",
        seed_text="Corrupt a readiness fingerprint.",
        designed=(
            "Fail closed: the probe's greedy answer no longer matches the revision's "
            "fingerprint, so the engine leaves rotation within one probe interval (wrong, "
            "not busy); when the artifact is fixed it warms up and rejoins."
        ),
        load=LoadSpec(rate_per_s=8, duration_s=7, stream_fraction=0.5),
        faults=[
            Fault(at_s=2.0, action="engine_faults", engine=2, params={"corrupt_fingerprint": True}),
            Fault(at_s=4.5, action="clear_engine_faults", engine=2),
        ],
        expect=[
            Expect(
                figure="excluded_within_s",
                op="<=",
                value=0.75,
                why="out of rotation within one probe interval (0.5 s) plus the probe",
            ),
            Expect(
                figure="ok_fraction",
                op="==",
                value=1.0,
                why="the other engines serve every call meanwhile",
            ),
            NOTHING_LOST,
            NO_5XX,
            BALANCED,
            ALL_READY,
        ],
    ),
    Drill(
        name="bad-deploy-rollback",
        title="A bad deploy and its rollback",
        seed_text=(
            "Rollback restores the full serving fingerprint (model revision, tokenizer/template "
            "id, engine version, scheduler config)."
        ),
        designed=(
            "Rollback: an engine redeployed with the wrong revision fails its fingerprint "
            "probe and takes no traffic; rolled back, it serves the same fingerprint as its "
            "peers (revision, tokenizer, engine version, scheduler settings) and rejoins."
        ),
        load=LoadSpec(rate_per_s=8, duration_s=9, stream_fraction=0.5),
        faults=[
            Fault(at_s=2.0, action="redeploy_engine", engine=0, params={"revision": "r2"}),
            Fault(at_s=5.0, action="redeploy_engine", engine=0, params={"revision": "r1"}),
        ],
        expect=[
            Expect(
                figure="excluded_within_s",
                op="<=",
                value=3.0,
                why="the bad revision never enters rotation (restart plus one probe)",
            ),
            Expect(
                figure="serving_fingerprints_distinct",
                op="==",
                value=1,
                why="after the rollback every engine serves the same full fingerprint",
            ),
            Expect(
                figure="ok_fraction",
                op="==",
                value=1.0,
                why="the deploy is invisible to clients: drained, then excluded",
            ),
            NOTHING_LOST,
            NO_5XX,
            ALL_READY,
        ],
        stack=StackSpec(gateway={"retries": {"max_attempts": 3}}),
    ),
    Drill(
        name="bad-release-route-back",
        title="A bad release routed back to the last good one",
        seed_text="if error_rate_spikes: route to the previous release fingerprint",
        designed=(
            "Route back: a canary of release r2 beside two engines of r1 passes its "
            "readiness probe but fails real traffic (its prompts over 20 tokens); the "
            "gateway sees r2's error rate spike against r1's within its window and moves "
            "unpinned calls to r1 with no manual step (an event in the log, a metric); "
            "the attempts that failed before it are retried on r1 within the retry budget."
        ),
        load=LoadSpec(rate_per_s=12, duration_s=8, stream_fraction=0.5),
        faults=[
            Fault(
                at_s=2.0,
                action="engine_faults",
                engine=2,
                params={"fail_prompts_over_tokens": 20},
            ),
        ],
        expect=[
            Expect(
                figure="route_back_within_s",
                op="<=",
                value=3.0,
                why=(
                    "the window judges r2 after 10 attempts on it (about 4 calls/s reach "
                    "it) and the metric is read every 10 ms"
                ),
            ),
            Expect(
                figure="errors_after_route_back",
                op="<=",
                value=4,
                why="only the calls already on r2 when it was routed back (its 4 slots)",
            ),
            Expect(
                figure="server_errors",
                op="<=",
                value=10,
                why=(
                    "only attempts before the route-back fail: the 10 the window needs "
                    "to judge r2 at most, less those retried on r1 within the retry budget"
                ),
            ),
            NOTHING_LOST,
        ],
        stack=StackSpec(
            revisions=["r1", "r1", "r2"],
            gateway={
                "retries": {"max_attempts": 3},
                "release_guard": {"window_s": 5.0, "min_attempts": 10, "hold_s": 60.0},
            },
        ),
    ),
    Drill(
        name="queue-exhaustion",
        title="Exhaust the request queue, not device memory",
        seed_text="Exhaust the request queue without exhausting device memory.",
        designed=(
            "Reject early: at about 5× capacity the bounded queues fill and further calls are "
            "refused at arrival (429 queue_full, or 503 when the deadline cannot be met) with "
            "a truthful Retry-After; engines never preempt and queued calls past their "
            "deadline expire without reaching an engine."
        ),
        load=LoadSpec(
            rate_per_s=70,
            duration_s=5,
            stream_fraction=0.3,
            retry="none",
            deadline_ms=2500,
            max_tokens=96,
        ),
        stack=StackSpec(
            max_num_seqs=2,
            gateway={"queues": {"interactive": {"max_queued_requests": 16, "max_wait_s": 2.0}}},
        ),
        expect=[
            Expect(figure="overload_factor", op=">=", value=3, why="the queue really fills"),
            Expect(
                figure="gateway_sheds",
                op=">=",
                value=50,
                why="overload is refused at the gateway, not queued without bound",
            ),
            Expect(
                figure="engine_preemptions",
                op="==",
                value=0,
                why="device memory is never exhausted: the engines never preempt",
            ),
            Expect(
                figure="engine_kv_usage_peak", op="<", value=1.0, why="KV use stays below the pool"
            ),
            RETRY_AFTER,
            NOTHING_LOST,
            NO_5XX,
            BALANCED,
            ENGINES_IDLE,
        ],
    ),
    Drill(
        name="long-contexts",
        title="Fill cache blocks with long contexts",
        seed_text="Fill cache blocks with long contexts.",
        designed=(
            "Token-aware admission: the gateway projects each call's KV blocks from its prompt "
            "and max_tokens and holds back what would not fit, so engines with a small KV pool "
            "run full without preempting (recomputing) anyone."
        ),
        load=LoadSpec(
            rate_per_s=6,
            duration_s=6,
            stream_fraction=0.5,
            prompt_words=1500,
            max_tokens=200,
            deadline_ms=8000,
        ),
        stack=StackSpec(num_kv_blocks=700, gateway={"kv_blocks_per_upstream": 700}),
        expect=[
            Expect(
                figure="engine_preemptions",
                op="==",
                value=0,
                why="the KV projection keeps engines from preempting",
            ),
            Expect(
                figure="engine_kv_usage_peak",
                op=">=",
                value=0.5,
                why="the drill really fills the cache (else it shows nothing)",
            ),
            RETRY_AFTER,
            NOTHING_LOST,
            NO_5XX,
            BALANCED,
            ENGINES_IDLE,
        ],
    ),
    Drill(
        name="cancel-half",
        title="Cancel half the active requests",
        seed_text="Cancel half the active requests.",
        designed=(
            "Reclaim: a client that goes away cancels its call wherever it is; a queued one "
            "leaves the line and never reaches an engine, one in flight is aborted in its "
            "engine (slot and KV blocks freed) within 100 ms."
        ),
        load=LoadSpec(rate_per_s=14, duration_s=5, stream_fraction=0.5, max_tokens=200),
        faults=[Fault(at_s=3.0, action="cancel_in_flight", params={"fraction": 0.5})],
        expect=[
            Expect(figure="cancelled_calls", op=">=", value=4, why="the drill cancelled calls"),
            Expect(
                figure="cancel_free_s",
                op="<=",
                value=0.1,
                why="engines abort every cancelled call within 100 ms",
            ),
            NOTHING_LOST,
            NO_5XX,
            BALANCED,
            ENGINES_IDLE,
        ],
    ),
    Drill(
        name="deadline-expires",
        title="Deadlines that pass in flight",
        seed_text="if deadline_expires: cancel scheduler state and release blocks",
        designed=(
            "Cancel at the deadline: calls whose 1.5 s deadline passes while an engine "
            "decodes them (400 tokens each, about 10 s) are cancelled there by the gateway "
            "at their deadline (the upstream call closed: the engine aborts the sequence "
            "and frees its blocks) and answered 504 deadline_exceeded, or a last error "
            "event on a stream; the engines end idle and the counts balance."
        ),
        load=LoadSpec(
            rate_per_s=4, duration_s=4, stream_fraction=0.5, max_tokens=400, deadline_ms=1500
        ),
        # Admission would refuse them at arrival (their service alone outlasts the
        # deadline): the drill is about deadlines that pass in flight.
        stack=StackSpec(gateway={"admission": {"check_deadlines": False}}),
        expect=[
            Expect(
                figure="timed_out_calls",
                op=">=",
                value=8,
                why="calls past their deadline are cancelled, not left to run late",
            ),
            Expect(
                figure="gateway_deadline_cancels",
                op=">=",
                value=8,
                why="the gateway counts each cancel at a deadline",
            ),
            NOTHING_LOST,
            NO_5XX,
            BALANCED,
            ENGINES_IDLE,
        ],
    ),
    Drill(
        name="slow-rank",
        title="Delay one distributed rank",
        seed_text="Delay one distributed rank.",
        designed=(
            "Route around: a slow rank slows its whole tensor-parallel group (here: every step "
            "of one engine takes 4× longer); least-outstanding routing sends it less work, and "
            "the gateway's per-upstream TTFT names the slow engine."
        ),
        load=LoadSpec(rate_per_s=12, duration_s=7, stream_fraction=0.5),
        faults=[
            Fault(at_s=1.0, action="engine_faults", engine=0, params={"slowdown_factor": 4.0}),
            Fault(at_s=6.5, action="clear_engine_faults", engine=0),
        ],
        expect=[
            Expect(
                figure="faulted_ttft_ratio",
                op=">=",
                value=1.5,
                why="metrics name the boundary: the slow engine's TTFT stands out",
            ),
            Expect(
                figure="faulted_share",
                op="<",
                value=1 / 3,
                why="routing gives the slow engine less than its even share",
            ),
            Expect(figure="ok_fraction", op="==", value=1.0, why="every call is served"),
            NOTHING_LOST,
            NO_5XX,
            BALANCED,
        ],
    ),
    Drill(
        name="redis-outage",
        title="Redis outage under load",
        seed_text="Redis killed and restarted under load: no request lost, budgets restored.",
        designed=(
            "Degrade, then restore: two gateways share tenant budgets through Redis; when it "
            "dies they keep serving on conservative local shares and say so in their metrics; "
            "when it returns the shared budgets are rebuilt and enforced again."
        ),
        load=LoadSpec(
            rate_per_s=16,
            duration_s=10,
            stream_fraction=0.3,
            max_tokens=32,
            tenants={A: 1.0, HEAVY: 3.0},
        ),
        faults=[Fault(at_s=3.0, action="kill_redis"), Fault(at_s=5.5, action="start_redis")],
        stack=StackSpec(
            gateways=2,
            redis=True,
            gateway={
                "tenants": {HEAVY: {"name": "heavy", "token_rate_per_s": 1500.0, "burst_s": 1.0}},
                "shared": {"expected_instances": 2, "lease_ttl_s": 3.0, "reconnect_max_s": 0.5},
            },
        ),
        expect=[
            Expect(
                figure="shared_budgets_unhealthy_samples",
                op=">=",
                value=1,
                why="the gateways' metrics say when they serve on local shares",
            ),
            Expect(
                figure="budget_sheds_after_return",
                op=">=",
                value=1,
                why="after Redis returns the heavy tenant's budget is enforced again",
            ),
            Expect(
                figure=f"ok_fraction_{A}",
                op="==",
                value=1.0,
                why="the tenant within its budget is served throughout",
            ),
            NOTHING_LOST,
            NO_5XX,
            BALANCED,
        ],
    ),
    Drill(
        name="retry-storm",
        title="Retry storm",
        seed_text="Bounded retries do not duplicate expensive work indefinitely.",
        designed=(
            "Refuse cheaply: at about 4× capacity, clients that retry at once, ignoring "
            "Retry-After, are refused at the gateway in microseconds; engines see each "
            "admitted call once, so their work is not amplified, and the gateway's own "
            "retries stay within the budget."
        ),
        load=LoadSpec(
            rate_per_s=50,
            duration_s=5,
            stream_fraction=0.3,
            retry="storm",
            max_attempts=5,
            max_tokens=96,
        ),
        stack=StackSpec(
            max_num_seqs=2, gateway={"queues": {"interactive": {"max_queued_requests": 16}}}
        ),
        expect=[
            Expect(
                figure="overload_factor", op=">=", value=2.5, why="the storm meets a full house"
            ),
            Expect(
                figure="work_amplification",
                op="<=",
                value=1.1,
                why="engines generate what the served calls asked for, not more",
            ),
            Expect(
                figure="gateway_upstream_retries",
                op="==",
                value=0,
                why="healthy engines: the gateway itself never retries",
            ),
            Expect(figure="engine_preemptions", op="==", value=0, why="no memory pressure"),
            RETRY_AFTER,
            NOTHING_LOST,
            NO_5XX,
            BALANCED,
        ],
    ),
    Drill(
        name="rolling-restart",
        title="Rolling restart",
        seed_text="Drain: stop admitting, finish in-flight within the deadline.",
        designed=(
            "Drain: each engine in turn is drained at the gateway (no new calls, in-flight "
            "ones finish), restarted, probed and put back; clients never notice."
        ),
        load=LoadSpec(rate_per_s=8, duration_s=12, stream_fraction=0.5),
        faults=[Fault(at_s=1.0, action="rolling_restart")],
        expect=[
            Expect(
                figure="rolling_restart_done", op="==", value=1, why="every engine was restarted"
            ),
            Expect(figure="ok_fraction", op="==", value=1.0, why="no call fails or is cut"),
            NOTHING_LOST,
            NO_5XX,
            BALANCED,
            ALL_READY,
        ],
    ),
    Drill(
        name="config-reload",
        title="Config reload under load",
        seed_text="Config reload without dropping requests.",
        designed=(
            "Reload in place: new tenant budgets, queue bounds and retry settings apply to the "
            "next decision; queued and running calls keep their places; nothing is dropped."
        ),
        load=LoadSpec(rate_per_s=12, duration_s=8, stream_fraction=0.5, tenants={A: 1.0, B: 1.0}),
        faults=[
            Fault(
                at_s=2.0,
                action="reload_config",
                params={
                    "tenants": {B: {"name": "b", "token_rate_per_s": 300.0, "burst_s": 1.0}},
                    "queues": {"interactive": {"max_queued_requests": 64}},
                    "retries": {"max_attempts": 2},
                },
            ),
            Fault(at_s=5.0, action="reload_config", params={"tenants": {A: {"weight": 2.0}}}),
        ],
        expect=[
            Expect(figure="reload_config_done", op="==", value=2, why="both reloads ran"),
            Expect(figure="reload_failures", op="==", value=0, why="each reload answered 200"),
            Expect(
                figure="reload_needs_restart",
                op="==",
                value=0,
                why="budgets, queues and retries reload live",
            ),
            Expect(
                figure="gateway_sheds_tenant_token_rate",
                op=">=",
                value=1,
                why="the new budget is in force after the reload",
            ),
            Expect(
                figure=f"ok_fraction_{A}",
                op="==",
                value=1.0,
                why="calls of the tenant whose budget did not shrink are all served",
            ),
            NOTHING_LOST,
            NO_5XX,
            BALANCED,
        ],
    ),
    Drill(
        name="soak",
        title="Soak at 10× overload",
        seed_text="A soak test at 10× overload: memory bounded, accounting balanced.",
        designed=(
            "Steady under siege: at 10× capacity the gateway refuses most calls at arrival, "
            "serves the rest at capacity, keeps its memory flat and accounts for every call."
        ),
        load=LoadSpec(
            rate_per_s=125,
            duration_s=20,
            stream_fraction=0.3,
            max_tokens=96,
            retry="obey",
            max_attempts=2,
            tenants={A: 1.0, B: 1.0, HEAVY: 4.0},
        ),
        stack=StackSpec(max_num_seqs=2),
        expect=[
            Expect(figure="overload_factor", op=">=", value=8, why="10× the served rate"),
            Expect(
                figure="rss_growth",
                op="<=",
                value=1.25,
                why="memory does not grow with the number of calls refused or served",
            ),
            Expect(figure="gateway_sheds", op=">=", value=1, why="the overload was real"),
            RETRY_AFTER,
            NOTHING_LOST,
            NO_5XX,
            BALANCED,
            ENGINES_IDLE,
        ],
        settle_s=5.0,
    ),
]

DRILLS: Final[dict[str, Drill]] = {d.name: d for d in _DRILLS}


def drill_names() -> list[str]:
    """The drills in the order ``all`` runs them."""
    return list(DRILLS)
