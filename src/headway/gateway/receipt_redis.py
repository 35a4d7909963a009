"""Receipts in Redis (``--redis URL``): the :class:`~headway.gateway.receipt_store.ReceiptStore`
state machine, each step one Lua script (atomic in Redis, so two instances never both
claim, and a result is written only under the current claim).

Keys, under ``headway:receipts:``: ``r:{id}`` a hash per receipt; ``queued`` (by
acceptance time) and ``running`` (by lease expiry) sorted sets of ids; ``expiry`` (by
``expires_s``) of every stored id; ``results`` a hash counting results written per id (the
run log). Durability is Redis's: run it with ``appendonly yes`` and ``appendfsync
always`` for a receipt to survive a Redis crash too (a gateway crash loses nothing
either way).
"""

from __future__ import annotations

from typing import Final

import redis.asyncio as aioredis

from headway.gateway.receipt_store import Claim, Receipt, ReceiptState, claim_token

__all__ = ["RedisReceipts"]

_P: Final = "headway:receipts:"
_FIELDS: Final = (  # the order of _CLAIM's HMGET
    "tenant", "path", "body", "state", "created_s", "expires_s", "attempts", "status",
    "result", "finished_s",
)  # fmt: skip

_CLAIM: Final = """
local p, now, lease, limit = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local out = {}
local function take(id, reclaimed)
  local token = ARGV[5 + #out]
  local k = p .. 'r:' .. id
  redis.call('HSET', k, 'state', 'running', 'claim', token, 'lease_until_s', now + lease)
  redis.call('HINCRBY', k, 'attempts', 1)
  redis.call('ZREM', p .. 'queued', id)
  redis.call('ZADD', p .. 'running', now + lease, id)
  local row = redis.call('HMGET', k, 'tenant', 'path', 'body', 'state', 'created_s',
                        'expires_s', 'attempts', 'status', 'result', 'finished_s')
  out[#out + 1] = {id, reclaimed, token, row}
end
for _, id in ipairs(redis.call('ZRANGEBYSCORE', p .. 'running', '-inf', '(' .. ARGV[2],
                               'LIMIT', 0, limit)) do
  take(id, 1)
end
if #out < limit then
  for _, id in ipairs(redis.call('ZRANGE', p .. 'queued', 0, limit - #out - 1)) do
    take(id, 0)
  end
end
return out
"""

_RENEW: Final = """
local p, id, token, untils = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local k = p .. 'r:' .. id
local v = redis.call('HMGET', k, 'state', 'claim')
if v[1] ~= 'running' or v[2] ~= token then return 0 end
redis.call('HSET', k, 'lease_until_s', untils)
redis.call('ZADD', p .. 'running', untils, id)
return 1
"""

_RELEASE: Final = """
local p, id, token = ARGV[1], ARGV[2], ARGV[3]
local k = p .. 'r:' .. id
local v = redis.call('HMGET', k, 'state', 'claim', 'created_s')
if v[1] ~= 'running' or v[2] ~= token then return 0 end
redis.call('HSET', k, 'state', 'queued')
redis.call('HDEL', k, 'claim', 'lease_until_s')
redis.call('ZREM', p .. 'running', id)
redis.call('ZADD', p .. 'queued', v[3], id)
return 1
"""

_FINISH: Final = """
local p, id, token = ARGV[1], ARGV[2], ARGV[3]
local k = p .. 'r:' .. id
local v = redis.call('HMGET', k, 'state', 'claim')
if v[1] ~= 'running' or v[2] ~= token then return 0 end
redis.call('HSET', k, 'state', ARGV[4], 'status', ARGV[5], 'result', ARGV[6],
           'finished_s', ARGV[7])
redis.call('HDEL', k, 'body', 'claim', 'lease_until_s')
redis.call('ZREM', p .. 'running', id)
redis.call('HINCRBY', p .. 'results', id, 1)
return 1
"""

_EXPIRE: Final = """
local p, now, retention = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local n = 0
for _, id in ipairs(redis.call('ZRANGEBYSCORE', p .. 'expiry', '-inf', now)) do
  local k = p .. 'r:' .. id
  local v = redis.call('HMGET', k, 'state', 'expires_s')
  if v[1] == false then
    redis.call('ZREM', p .. 'expiry', id)
  elseif v[1] == 'expired' then
    if tonumber(v[2]) + retention <= now then
      redis.call('DEL', k)
      redis.call('ZREM', p .. 'expiry', id)
    end
  else
    redis.call('HSET', k, 'state', 'expired')
    redis.call('HDEL', k, 'body', 'result', 'claim', 'lease_until_s')
    redis.call('ZREM', p .. 'queued', id)
    redis.call('ZREM', p .. 'running', id)
    n = n + 1
  end
end
return n
"""


def _receipt(receipt_id: str, row: list[bytes | None]) -> Receipt:
    v = dict(zip(_FIELDS, row, strict=True))

    def num(name: str) -> float | None:
        raw = v[name]
        return None if raw is None else float(raw)

    status = num("status")
    state: ReceiptState = (v["state"] or b"queued").decode()  # type: ignore[assignment]
    return Receipt(
        id=receipt_id,
        tenant=(v["tenant"] or b"").decode(),
        path=(v["path"] or b"").decode(),
        body=v["body"],
        state=state,
        created_s=num("created_s") or 0.0,
        expires_s=num("expires_s") or 0.0,
        attempts=int(num("attempts") or 0),
        status=None if status is None else int(status),
        result=v["result"],
        finished_s=num("finished_s"),
    )


class RedisReceipts:
    """Receipts in one Redis (module docstring); every instance on it shares them."""

    def __init__(self, redis_url: str) -> None:
        self.redis = aioredis.Redis.from_url(redis_url, socket_timeout=5.0)
        self._claim = self.redis.register_script(_CLAIM)
        self._renew = self.redis.register_script(_RENEW)
        self._release = self.redis.register_script(_RELEASE)
        self._finish = self.redis.register_script(_FINISH)
        self._expire = self.redis.register_script(_EXPIRE)

    async def submit(self, receipt: Receipt) -> None:
        r = receipt
        key = f"{_P}r:{r.id}"
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(key, mapping={
                "tenant": r.tenant, "path": r.path, "body": r.body or b"", "state": r.state,
                "created_s": repr(r.created_s), "expires_s": repr(r.expires_s),
                "attempts": r.attempts,
            })  # fmt: skip
            pipe.zadd(f"{_P}queued", {r.id: r.created_s})
            pipe.zadd(f"{_P}expiry", {r.id: r.expires_s})
            await pipe.execute()

    async def claim(self, instance: str, now_s: float, lease_s: float, limit: int) -> list[Claim]:
        tokens = [claim_token(instance) for _ in range(limit)]
        rows = await self._claim(args=[_P, repr(now_s), repr(lease_s), limit, *tokens])
        return [
            Claim(_receipt(rid.decode(), row), token.decode(), reclaimed=bool(reclaimed))
            for rid, reclaimed, token, row in rows
        ]

    async def renew(self, receipt_id: str, token: str, until_s: float) -> bool:
        return bool(await self._renew(args=[_P, receipt_id, token, repr(until_s)]))

    async def release(self, receipt_id: str, token: str) -> bool:
        return bool(await self._release(args=[_P, receipt_id, token]))

    async def finish(
        self, receipt_id: str, token: str, state: ReceiptState, status: int, result: bytes,
        now_s: float,
    ) -> bool:  # fmt: skip
        args: list[str | int | bytes] = [_P, receipt_id, token, state, status, result, repr(now_s)]
        return bool(await self._finish(args=args))

    async def get(self, receipt_id: str) -> Receipt | None:
        row: list[bytes | None] = await self.redis.hmget(f"{_P}r:{receipt_id}", list(_FIELDS))  # type: ignore[assignment]
        return None if row[3] is None else _receipt(receipt_id, row)

    async def expire(self, now_s: float, retention_s: float) -> int:
        return int(await self._expire(args=[_P, repr(now_s), repr(retention_s)]))

    async def depth(self) -> dict[str, int]:
        queued = await self.redis.zcard(f"{_P}queued")
        running = await self.redis.zcard(f"{_P}running")
        return {"queued": int(queued), "running": int(running)}

    async def result_counts(self) -> dict[str, int]:
        counts: dict[bytes, bytes] = await self.redis.hgetall(f"{_P}results")  # type: ignore[assignment]
        return {k.decode(): int(v) for k, v in counts.items()}

    async def close(self) -> None:
        await self.redis.aclose()
