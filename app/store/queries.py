"""What the store reads: calls by filter and page, a call with its turns, the turns of a time window
(for the overview), and what retention deletes."""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Select, delete, func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.store.records import CallRecord, TurnRecord
from app.store.rows import call_record, turn_record
from app.store.tables import Call, Turn


@dataclass(frozen=True)
class CallFilter:
    """Calls whose start lies in [since, until), of a transport and status, whose worst turn took at
    least min_v2v_ms from the caller's end of speech to the first reply audio."""

    since: dt.datetime | None = None
    until: dt.datetime | None = None
    transport: str | None = None
    status: str | None = None
    min_v2v_ms: float | None = None

    def apply(self, query: Select[Any]) -> Select[Any]:
        if self.since is not None:
            query = query.where(Call.started_at >= self.since)
        if self.until is not None:
            query = query.where(Call.started_at < self.until)
        if self.transport:
            query = query.where(Call.transport == self.transport)
        if self.status:
            query = query.where(Call.status == self.status)
        if self.min_v2v_ms is not None:
            query = query.where(Call.v2v_max_ms >= self.min_v2v_ms)
        return query


@dataclass(frozen=True)
class CallPage:
    calls: list[CallRecord]
    total: int  # calls that match the filter, on every page
    next_offset: int | None  # None on the last page


def _newest_first(query: Select[Any]) -> Select[Any]:
    return query.order_by(Call.started_at.desc(), Call.id.desc())


async def list_calls(sessions: async_sessionmaker[AsyncSession], filters: CallFilter, limit: int,
                     offset: int) -> CallPage:
    async with sessions() as session:
        query = _newest_first(filters.apply(select(Call))).limit(limit).offset(offset)
        rows: Sequence[Call] = (await session.scalars(query)).all()
        total = (await session.scalar(filters.apply(select(func.count()).select_from(Call)))) or 0
    calls = [call_record(row) for row in rows]
    following = offset + len(calls)
    return CallPage(calls, total, following if following < total and calls else None)


async def get_call(sessions: async_sessionmaker[AsyncSession],
                   call_id: str) -> tuple[CallRecord, list[TurnRecord]] | None:
    async with sessions() as session:
        row = await session.get(Call, call_id)
        if row is None:
            return None
        turns = await session.scalars(select(Turn).where(Turn.call_id == call_id).order_by(Turn.turn_id))
        return call_record(row), [turn_record(t) for t in turns]


async def calls_with_turns(sessions: async_sessionmaker[AsyncSession], filters: CallFilter,
                           page_size: int = 200) -> AsyncIterator[tuple[CallRecord, list[TurnRecord]]]:
    """Every matching call with its turns, newest first, read a page at a time (for exports). Paged by
    keyset (started_at, id), so calls arriving meanwhile neither repeat nor shift the pages."""
    after: tuple[dt.datetime, str] | None = None
    while True:
        query = _newest_first(filters.apply(select(Call)))
        if after is not None:
            query = query.where((Call.started_at < after[0]) | ((Call.started_at == after[0]) & (Call.id < after[1])))
        async with sessions() as session:
            calls: Sequence[Call] = (await session.scalars(query.limit(page_size))).all()
            if not calls:
                return
            ids = [c.id for c in calls]
            turns: dict[str, list[TurnRecord]] = {i: [] for i in ids}
            for t in await session.scalars(select(Turn).where(Turn.call_id.in_(ids)).order_by(Turn.turn_id)):
                turns[t.call_id].append(turn_record(t))
        for call in calls:
            yield call_record(call), turns[call.id]
        after = (calls[-1].started_at, calls[-1].id)


async def turns_between(sessions: async_sessionmaker[AsyncSession], since: dt.datetime, until: dt.datetime,
                        limit: int) -> list[TurnRecord]:
    """The turns of [since, until), oldest first, at most `limit` of them."""
    async with sessions() as session:
        rows = await session.scalars(
            select(Turn).where(Turn.at >= since, Turn.at < until).order_by(Turn.at).limit(limit))
        return [turn_record(r) for r in rows]


async def delete_calls_before(sessions: async_sessionmaker[AsyncSession], cutoff: dt.datetime,
                              batch: int = 500) -> tuple[int, list[str]]:
    """Delete calls started before `cutoff` (with their turns), a batch per transaction so the writer is
    never kept waiting long. Returns how many, and the recordings they had (paths relative to the data folder)."""
    deleted, recordings = 0, list[str]()
    while True:
        async with sessions.begin() as session:
            result = await session.execute(select(Call.id, Call.recording).where(Call.started_at < cutoff).limit(batch))
            found = [(call_id, path) for call_id, path in result]
            if not found:
                return deleted, recordings
            ids = [call_id for call_id, _ in found]
            await session.execute(delete(Turn).where(Turn.call_id.in_(ids)))
            await session.execute(delete(Call).where(Call.id.in_(ids)))
        deleted += len(ids)
        recordings += [path for _, path in found if path]
