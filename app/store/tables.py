"""The database tables (SQLAlchemy 2 declarative). Nothing outside app/store sees these classes:
app/store/rows.py turns them into records. A change here needs a migration in migrations/versions."""

from __future__ import annotations

import datetime as dt
from typing import Any, ClassVar

from sqlalchemy import JSON, DateTime, Float, ForeignKey, Index, Integer, String, Text, TypeDecorator
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from app.store.records import as_utc


class UtcDateTime(TypeDecorator[dt.datetime]):
    """A timestamp always stored as UTC and read back timezone-aware. SQLite keeps datetimes as text
    without their offset, so every value is converted to UTC before it is written and compared."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: dt.datetime | None, dialect: Dialect) -> dt.datetime | None:
        if value is None:
            return None
        utc = as_utc(value)
        return utc.replace(tzinfo=None) if dialect.name == "sqlite" else utc

    def process_result_value(self, value: dt.datetime | None, dialect: Dialect) -> dt.datetime | None:
        return None if value is None else as_utc(value)


class Base(DeclarativeBase):
    type_annotation_map: ClassVar[dict[Any, Any]] = {dt.datetime: UtcDateTime, dict[str, Any]: JSON, str: String}


class Call(Base):
    __tablename__ = "calls"

    id: Mapped[str] = mapped_column(String(128), primary_key=True)
    transport: Mapped[str] = mapped_column(String(32))
    started_at: Mapped[dt.datetime]
    ended_at: Mapped[dt.datetime | None]
    end_reason: Mapped[str | None] = mapped_column(String(200))
    end_error: Mapped[str | None] = mapped_column(Text)  # the error the call ended with, if it did
    status: Mapped[str] = mapped_column(String(16))
    fingerprint: Mapped[str] = mapped_column(String(64))
    settings: Mapped[dict[str, Any]] = mapped_column(JSON)
    caller: Mapped[str | None] = mapped_column(String(200))
    turns_count: Mapped[int] = mapped_column(Integer, default=0)
    interruptions: Mapped[int] = mapped_column(Integer, default=0)
    errors: Mapped[int] = mapped_column(Integer, default=0)
    v2v_median_ms: Mapped[float | None] = mapped_column(Float)
    v2v_max_ms: Mapped[float | None] = mapped_column(Float)
    recording: Mapped[str | None] = mapped_column(String(500))

    __table_args__ = (
        Index("ix_calls_started_at", "started_at"),
        Index("ix_calls_transport_started_at", "transport", "started_at"),
        Index("ix_calls_status_started_at", "status", "started_at"),
        Index("ix_calls_v2v_max_ms", "v2v_max_ms"),
    )


class Turn(Base):
    __tablename__ = "turns"

    call_id: Mapped[str] = mapped_column(String(128), ForeignKey("calls.id", ondelete="CASCADE"), primary_key=True)
    turn_id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    at: Mapped[dt.datetime]
    offset_s: Mapped[float] = mapped_column(Float)
    user_text: Mapped[str] = mapped_column(Text)
    generated_text: Mapped[str] = mapped_column(Text)
    sent_text: Mapped[str] = mapped_column(Text)
    heard_text: Mapped[str] = mapped_column(Text)
    status: Mapped[str] = mapped_column(String(16))
    latency_ms: Mapped[dict[str, Any]] = mapped_column(JSON)
    voice_to_voice_ms: Mapped[float | None] = mapped_column(Float)
    spec: Mapped[dict[str, Any] | None] = mapped_column(JSON(none_as_null=True))
    error: Mapped[str | None] = mapped_column(Text)
    barge_in: Mapped[bool] = mapped_column(default=False)
    dtmf: Mapped[str | None] = mapped_column(String(200))
    deadline_missed: Mapped[bool] = mapped_column(default=False)
    underruns: Mapped[int] = mapped_column(Integer, default=0)
    tool_calls: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON(none_as_null=True), nullable=True)

    __table_args__ = (Index("ix_turns_at", "at"),)
