"""The simulator's event kinds: what each event is and what its two arguments ``a``, ``b`` mean.

Events are ``(time, priority, seq, kind, a, b)`` entries of the
:class:`~headway.sim.kernel.EventQueue`; ``Simulator.run`` dispatches on ``kind``.
"""

from typing import Final

EV_TASK_ARRIVAL: Final = 0  # a: task
EV_STEP_DISPATCH: Final = 1  # a: task, b: step
EV_BOUNDARY: Final = 2  # a: replica, b: version
EV_GATEWAY_EXPIRY: Final = 4  # a queued call's deadline: the gateway expires what is past it
EV_RETRY: Final = 5  # a: call; its client offers it again after a shed
EV_PATIENCE: Final = 6  # a: call; its client's patience runs out (cancel if no token yet)
EV_ATTEMPT_TIMEOUT: Final = 7  # a: call, b: attempt; the client's per-attempt timeout fires
EV_FAULT: Final = 8  # a: index into the faults; b: 1 when a slowdown ends
EV_AUTOSCALE: Final = 9  # the autoscaler evaluates its signals
EV_REPLICA_READY: Final = 10  # a: replica; a started replica becomes ready
EV_TOOL_CALL: Final = 11  # a: call whose step's tool calls run, b: index of the tool call
EV_DUPLICATE: Final = 12  # a: call; its client, still waiting, may submit it again
EV_TOOL_FAILED: Final = 13  # a: call, b: tool call code; the agent sees its tool call time out
EV_KV_ARRIVED: Final = 14  # a: call row, b: transfer number; its prompt KV reached decode
EV_CALL_DEADLINE: Final = 15  # a: call, b: attempt; its deadline passes: the gateway cancels it
EV_CANCEL_LOSERS: Final = 16  # a: task, b: step; its losing branches' delay is over

ATTEMPT_CODES: Final = 128
"""A queued gateway item is ``call * ATTEMPT_CODES + attempt`` (``max_attempts`` <= 100),
so that an entry left behind by an abandoned attempt is told from its retry's; a tool call
code is likewise ``index * ATTEMPT_CODES + attempt``."""
