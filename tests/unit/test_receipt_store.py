"""The receipt stores' state machine, each step on a real store (a SQLite file, a real
`redis-server`): a receipt is claimed by one claimer at a time, a lapsed claim is taken
over, a result is written once and only under the current claim, and retention expires
and then deletes it."""

from __future__ import annotations

import asyncio
import stat
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest

from binaries import RedisServer
from headway.gateway.receipt_redis import RedisReceipts
from headway.gateway.receipt_store import Receipt, ReceiptStore, SQLiteReceipts

T0 = 1_000_000.0
LEASE_S = 10.0


@pytest.fixture(params=["sqlite", "redis"])
def make_store(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[Callable[[], ReceiptStore]]:
    if request.param == "sqlite":
        yield lambda: SQLiteReceipts(tmp_path / "r.sqlite3")
    else:
        with RedisServer() as redis:
            yield lambda: RedisReceipts(redis.url)


def _receipt(receipt_id: str = "rcpt_a", created_s: float = T0) -> Receipt:
    return Receipt(id=receipt_id, tenant="t", path="/v1/completions", body=b'{"prompt":"x"}',
                   state="queued", created_s=created_s, expires_s=created_s + 100.0)  # fmt: skip


def _run(store: ReceiptStore, steps: Callable[[ReceiptStore], Awaitable[None]]) -> None:
    async def go() -> None:
        try:
            await steps(store)
        finally:
            await store.close()

    asyncio.run(go())


def test_one_claimer_at_a_time_and_a_lapsed_claim_is_taken_over(
    make_store: Callable[[], ReceiptStore],
) -> None:
    async def steps(store: ReceiptStore) -> None:
        await store.submit(_receipt())
        (first,) = await store.claim("a", T0, LEASE_S, 8)
        assert not first.reclaimed
        assert first.receipt.attempts == 1
        assert first.receipt.body == b'{"prompt":"x"}'
        assert await store.claim("b", T0 + 1, LEASE_S, 8) == []  # held: nobody else
        assert await store.renew("rcpt_a", first.token, T0 + 15)
        assert await store.claim("b", T0 + 12, LEASE_S, 8) == []  # renewed past 12
        (second,) = await store.claim("b", T0 + 16, LEASE_S, 8)  # lapsed: "a" died
        assert second.reclaimed
        assert second.receipt.attempts == 2
        assert second.token != first.token
        # The dead claimer's result is refused; the holder's is written once.
        assert not await store.finish("rcpt_a", first.token, "completed", 200, b"{}", T0 + 17)
        assert not await store.renew("rcpt_a", first.token, T0 + 30)
        assert await store.finish("rcpt_a", second.token, "completed", 200, b'{"ok":1}', T0 + 18)
        assert not await store.finish("rcpt_a", second.token, "completed", 200, b"{}", T0 + 19)
        done = await store.get("rcpt_a")
        assert done is not None
        assert (done.state, done.status, done.result) == ("completed", 200, b'{"ok":1}')
        assert not done.body  # the prompt is not kept past its run
        assert await store.result_counts() == {"rcpt_a": 1}
        assert await store.claim("c", T0 + 100, LEASE_S, 8) == []

    _run(make_store(), steps)


def test_release_queues_it_again_and_claims_go_oldest_first(
    make_store: Callable[[], ReceiptStore],
) -> None:
    async def steps(store: ReceiptStore) -> None:
        await store.submit(_receipt("rcpt_new", T0 + 1))
        await store.submit(_receipt("rcpt_old", T0))
        (claim,) = await store.claim("a", T0 + 2, LEASE_S, 1)
        assert claim.receipt.id == "rcpt_old"
        assert await store.depth() == {"queued": 1, "running": 1}
        assert await store.release("rcpt_old", claim.token)
        assert not await store.release("rcpt_old", claim.token)
        ids = [c.receipt.id for c in await store.claim("b", T0 + 3, LEASE_S, 8)]
        assert sorted(ids) == ["rcpt_new", "rcpt_old"]

    _run(make_store(), steps)


def test_retention_expires_then_deletes(make_store: Callable[[], ReceiptStore]) -> None:
    async def steps(store: ReceiptStore) -> None:
        await store.submit(_receipt("rcpt_q"))
        await store.submit(_receipt("rcpt_done"))
        claims = {c.receipt.id: c for c in await store.claim("a", T0, LEASE_S, 8)}
        claim = claims["rcpt_done"]
        assert await store.release("rcpt_q", claims["rcpt_q"].token)  # queued when it expires
        assert await store.finish("rcpt_done", claim.token, "completed", 200, b"{}", T0 + 1)
        assert await store.expire(T0 + 99, retention_s=100.0) == 0
        assert await store.expire(T0 + 100, retention_s=100.0) == 2
        gone = await store.get("rcpt_q")
        assert gone is not None
        assert (gone.state, gone.body or None, gone.result) == ("expired", None, None)
        assert await store.claim("b", T0 + 101, LEASE_S, 8) == []  # never run once expired
        assert await store.expire(T0 + 200, retention_s=100.0) == 0
        assert await store.get("rcpt_q") is None
        assert await store.get("rcpt_done") is None

    _run(make_store(), steps)


def test_the_sqlite_file_is_private(tmp_path: Path) -> None:
    store = SQLiteReceipts(tmp_path / "r.sqlite3")
    _run(store, lambda s: s.submit(_receipt()))
    assert stat.S_IMODE((tmp_path / "r.sqlite3").stat().st_mode) == 0o600  # it holds prompts
