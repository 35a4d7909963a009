"""Durable storage of asynchronous receipts: the record, the store's contract, SQLite.

A receipt moves through one state machine, each step a compare-and-set in the store:
``queued`` → ``running`` (a *claim*: a fresh token and a lease expiry, taken by one
instance) → ``completed`` or ``failed`` (the result, written once, only by the holder of
the current claim) → ``expired`` (past its retention: prompt and result deleted) → gone.
A claim whose lease lapsed (its instance was killed) is taken again by the next
:meth:`ReceiptStore.claim`: that run produced no result, so running it again is not a
duplicate; a result from a lapsed claim is refused by the compare-and-set, so a receipt
never has two. Each written result also appends one row to a run log (``results``), the
count an operator, or a test, checks for duplicates.

:class:`SQLiteReceipts` is the default store: stdlib ``sqlite3`` in WAL mode with
``synchronous=FULL`` (every commit fsync'd before it returns), the file created ``0600``
(it holds prompts), every call on one worker thread so the event loop never waits on the
disk. :mod:`~headway.gateway.receipt_redis` is the one for ``--redis``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import os
import secrets
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal, Protocol, TypeAlias, TypeVar

__all__ = [
    "Claim",
    "Receipt",
    "ReceiptState",
    "ReceiptStore",
    "SQLiteReceipts",
    "claim_token",
]

ReceiptState: TypeAlias = Literal["queued", "running", "completed", "failed", "expired"]
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Receipt:
    """One deferred request as stored (``body``: the request as the client sent it)."""

    id: str
    tenant: str
    path: str
    body: bytes | None
    state: ReceiptState
    created_s: float
    """Accepted at (Unix seconds: receipts outlive processes, so never a monotonic clock)."""
    expires_s: float
    attempts: int = 0
    """Runs started (a run cut short by a crash counts; its claim lapsed)."""
    status: int | None = None
    """The HTTP status of the result (completed: 2xx)."""
    result: bytes | None = None
    finished_s: float | None = None


@dataclass(frozen=True, slots=True)
class Claim:
    """A receipt taken to run: only the holder of ``token`` may renew it or finish it."""

    receipt: Receipt
    token: str
    reclaimed: bool
    """It was running under a claim whose lease lapsed (its instance died)."""


def claim_token(instance: str) -> str:
    """A fresh claim token of ``instance`` (unguessable, so no other holder forges it)."""
    return f"{instance}/{secrets.token_urlsafe(12)}"


class ReceiptStore(Protocol):
    """Where receipts live (the module docstring's state machine)."""

    async def submit(self, receipt: Receipt) -> None:
        """Store a new ``queued`` receipt (durable when it returns)."""

    async def claim(self, instance: str, now_s: float, lease_s: float, limit: int) -> list[Claim]:
        """Take up to ``limit`` receipts to run, oldest first: queued ones, and running
        ones whose lease lapsed before ``now_s``."""

    async def renew(self, receipt_id: str, token: str, until_s: float) -> bool:
        """Extend a claim's lease; False when the claim is no longer held."""

    async def release(self, receipt_id: str, token: str) -> bool:
        """Give a claim back (queued again, to be run by anyone); False when not held."""

    async def finish(
        self, receipt_id: str, token: str, state: ReceiptState, status: int, result: bytes,
        now_s: float,
    ) -> bool:  # fmt: skip
        """Write the result once (compare-and-set on the claim); False when the claim was
        lost, and then nothing is written."""

    async def get(self, receipt_id: str) -> Receipt | None:
        """The receipt, or None (never stored, or gone)."""

    async def expire(self, now_s: float, retention_s: float) -> int:
        """Expire receipts past ``expires_s`` (prompt and result deleted) and delete
        expired ones ``retention_s`` later; the number newly expired."""

    async def depth(self) -> dict[str, int]:
        """Receipts ``queued`` and ``running``."""

    async def result_counts(self) -> dict[str, int]:
        """Results written per receipt id (the run log; more than 1 would be a duplicate)."""

    async def close(self) -> None:
        """Release the connection."""


_SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS receipts (
    id TEXT PRIMARY KEY, tenant TEXT NOT NULL, path TEXT NOT NULL, body BLOB,
    state TEXT NOT NULL, created_s REAL NOT NULL, expires_s REAL NOT NULL,
    claim TEXT, lease_until_s REAL, attempts INTEGER NOT NULL DEFAULT 0,
    status INTEGER, result BLOB, finished_s REAL
);
CREATE INDEX IF NOT EXISTS receipts_work ON receipts (state, created_s);
CREATE TABLE IF NOT EXISTS results (id TEXT NOT NULL, claim TEXT NOT NULL, at_s REAL NOT NULL);
"""

_COLUMNS: Final = (
    "id, tenant, path, body, state, created_s, expires_s, attempts, status, result, finished_s"
)


def _receipt(row: tuple[object, ...]) -> Receipt:
    return Receipt(*row)  # type: ignore[arg-type]


class SQLiteReceipts:
    """Receipts in one SQLite file (module docstring); several processes may share it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="receipts")
        self._db: sqlite3.Connection | None = None

    def _open(self) -> sqlite3.Connection:
        if self._db is None:
            if not self.path.exists():
                os.close(os.open(self.path, os.O_CREAT | os.O_WRONLY, 0o600))
            db = sqlite3.connect(self.path, isolation_level=None, timeout=30.0,
                                 check_same_thread=False)  # fmt: skip
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")
            db.executescript(_SCHEMA)
            self._db = db
        return self._db

    async def _call(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, self._in_transaction, fn)

    def _in_transaction(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """``fn`` in one write transaction (``BEGIN IMMEDIATE``: other processes on the
        file wait for it), committed, and so fsync'd, before it returns."""
        db = self._open()
        db.execute("BEGIN IMMEDIATE")
        try:
            out = fn(db)
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")
        return out

    async def submit(self, receipt: Receipt) -> None:
        def insert(db: sqlite3.Connection) -> None:
            r = receipt
            db.execute(
                f"INSERT INTO receipts ({_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                (r.id, r.tenant, r.path, r.body, r.state, r.created_s, r.expires_s,
                 r.attempts, r.status, r.result, r.finished_s),
            )  # fmt: skip

        await self._call(insert)

    async def claim(self, instance: str, now_s: float, lease_s: float, limit: int) -> list[Claim]:
        def take(db: sqlite3.Connection) -> list[Claim]:
            rows = db.execute(
                f"SELECT {_COLUMNS} FROM receipts WHERE (state = 'queued' AND expires_s > ?)"
                " OR (state = 'running' AND lease_until_s < ?) ORDER BY created_s LIMIT ?",
                (now_s, now_s, limit),
            ).fetchall()
            claims = []
            for row in rows:
                old = _receipt(row)
                token = claim_token(instance)
                db.execute(
                    "UPDATE receipts SET state = 'running', claim = ?, lease_until_s = ?, "
                    "attempts = attempts + 1 WHERE id = ?",
                    (token, now_s + lease_s, old.id),
                )
                fresh = dataclasses.replace(old, state="running", attempts=old.attempts + 1)
                claims.append(Claim(fresh, token, reclaimed=old.state == "running"))
            return claims

        return await self._call(take)

    async def renew(self, receipt_id: str, token: str, until_s: float) -> bool:
        def extend(db: sqlite3.Connection) -> bool:
            cursor = db.execute(
                "UPDATE receipts SET lease_until_s = ? WHERE id = ? AND claim = ? "
                "AND state = 'running'",
                (until_s, receipt_id, token),
            )
            return cursor.rowcount == 1

        return await self._call(extend)

    async def release(self, receipt_id: str, token: str) -> bool:
        def give_back(db: sqlite3.Connection) -> bool:
            cursor = db.execute(
                "UPDATE receipts SET state = 'queued', claim = NULL, lease_until_s = NULL "
                "WHERE id = ? AND claim = ? AND state = 'running'",
                (receipt_id, token),
            )
            return cursor.rowcount == 1

        return await self._call(give_back)

    async def finish(
        self, receipt_id: str, token: str, state: ReceiptState, status: int, result: bytes,
        now_s: float,
    ) -> bool:  # fmt: skip
        def write_once(db: sqlite3.Connection) -> bool:
            cursor = db.execute(
                "UPDATE receipts SET state = ?, status = ?, result = ?, finished_s = ?, "
                "body = NULL, claim = NULL, lease_until_s = NULL "
                "WHERE id = ? AND claim = ? AND state = 'running'",
                (state, status, result, now_s, receipt_id, token),
            )
            if cursor.rowcount != 1:
                return False
            db.execute("INSERT INTO results (id, claim, at_s) VALUES (?, ?, ?)",
                       (receipt_id, token, now_s))  # fmt: skip
            return True

        return await self._call(write_once)

    async def get(self, receipt_id: str) -> Receipt | None:
        def read(db: sqlite3.Connection) -> Receipt | None:
            row = db.execute(
                f"SELECT {_COLUMNS} FROM receipts WHERE id = ?", (receipt_id,)
            ).fetchone()
            return None if row is None else _receipt(row)

        return await self._call(read)

    async def expire(self, now_s: float, retention_s: float) -> int:
        def sweep(db: sqlite3.Connection) -> int:
            db.execute(
                "DELETE FROM receipts WHERE state = 'expired' AND expires_s + ? <= ?",
                (retention_s, now_s),
            )
            cursor = db.execute(
                "UPDATE receipts SET state = 'expired', body = NULL, result = NULL, "
                "claim = NULL, lease_until_s = NULL WHERE state != 'expired' AND expires_s <= ?",
                (now_s,),
            )
            return cursor.rowcount

        return await self._call(sweep)

    async def depth(self) -> dict[str, int]:
        def count(db: sqlite3.Connection) -> dict[str, int]:
            rows = db.execute(
                "SELECT state, COUNT(*) FROM receipts WHERE state IN ('queued', 'running') "
                "GROUP BY state"
            ).fetchall()
            return {"queued": 0, "running": 0, **{s: int(n) for s, n in rows}}

        return await self._call(count)

    async def result_counts(self) -> dict[str, int]:
        def count(db: sqlite3.Connection) -> dict[str, int]:
            rows = db.execute("SELECT id, COUNT(*) FROM results GROUP BY id").fetchall()
            return {str(i): int(n) for i, n in rows}

        return await self._call(count)

    async def close(self) -> None:
        def shut() -> None:
            if self._db is not None:
                self._db.close()
                self._db = None

        await asyncio.get_running_loop().run_in_executor(self._pool, shut)
        self._pool.shutdown(wait=True)
