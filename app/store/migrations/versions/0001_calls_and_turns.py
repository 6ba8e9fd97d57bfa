"""calls and turns

Revision ID: 0001
Revises:
Create Date: 2025-01-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "calls",
        sa.Column("id", sa.String(128), primary_key=True),
        sa.Column("transport", sa.String(32), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("end_reason", sa.String(200), nullable=True),
        sa.Column("end_error", sa.Text(), nullable=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("fingerprint", sa.String(64), nullable=False),
        sa.Column("settings", sa.JSON(), nullable=False),
        sa.Column("caller", sa.String(200), nullable=True),
        sa.Column("turns_count", sa.Integer(), nullable=False),
        sa.Column("interruptions", sa.Integer(), nullable=False),
        sa.Column("errors", sa.Integer(), nullable=False),
        sa.Column("v2v_median_ms", sa.Float(), nullable=True),
        sa.Column("v2v_max_ms", sa.Float(), nullable=True),
        sa.Column("recording", sa.String(500), nullable=True),
    )
    op.create_index("ix_calls_started_at", "calls", ["started_at"])
    op.create_index("ix_calls_transport_started_at", "calls", ["transport", "started_at"])
    op.create_index("ix_calls_status_started_at", "calls", ["status", "started_at"])
    op.create_index("ix_calls_v2v_max_ms", "calls", ["v2v_max_ms"])
    op.create_table(
        "turns",
        sa.Column("call_id", sa.String(128), sa.ForeignKey("calls.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("turn_id", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("offset_s", sa.Float(), nullable=False),
        sa.Column("user_text", sa.Text(), nullable=False),
        sa.Column("generated_text", sa.Text(), nullable=False),
        sa.Column("sent_text", sa.Text(), nullable=False),
        sa.Column("heard_text", sa.Text(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("latency_ms", sa.JSON(), nullable=False),
        sa.Column("voice_to_voice_ms", sa.Float(), nullable=True),
        sa.Column("spec", sa.JSON(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("barge_in", sa.Boolean(), nullable=False),
        sa.Column("dtmf", sa.String(200), nullable=True),
        sa.Column("deadline_missed", sa.Boolean(), nullable=False),
        sa.Column("underruns", sa.Integer(), nullable=False),
    )
    op.create_index("ix_turns_at", "turns", ["at"])


def downgrade() -> None:
    op.drop_index("ix_turns_at", table_name="turns")
    op.drop_table("turns")
    for name in ("ix_calls_v2v_max_ms", "ix_calls_status_started_at", "ix_calls_transport_started_at",
                 "ix_calls_started_at"):
        op.drop_index(name, table_name="calls")
    op.drop_table("calls")
