"""The columns that several migrations create alike, each spelled once with its width.

A released migration must keep creating the same DDL, so nothing here may change: a
column of another type, width or nullability gets a helper of its own (or stays
written out in its migration). The widths are the limits of what the columns hold.
"""

from __future__ import annotations

import sqlalchemy as sa


def serial_id() -> sa.Column:
    """``id``: the row number of an append-only log (audit, failures, measurements)."""
    return sa.Column("id", sa.Integer(), autoincrement=True, nullable=False)


def timestamp(name: str, *, nullable: bool = False) -> sa.Column:
    """A point in time, stored with its zone."""
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def actor(name: str) -> sa.Column:
    """Who did something: a token's name (up to 100 characters)."""
    return sa.Column(name, sa.String(length=100), nullable=False)


def authored() -> list[sa.Column]:
    """``created_at`` and ``created_by``: when a revision was written, and by whom."""
    return [timestamp("created_at"), actor("created_by")]


def cluster() -> sa.Column:
    """``cluster``: a Kubernetes label value (at most 63 characters)."""
    return sa.Column("cluster", sa.String(length=63), nullable=False)


def node(*, nullable: bool) -> sa.Column:
    """``node``: a Kubernetes object name (a DNS subdomain, at most 253 characters)."""
    return sa.Column("node", sa.String(length=253), nullable=nullable)


def pod(*, nullable: bool) -> sa.Column:
    """``pod``: a Kubernetes object name, as ``node``."""
    return sa.Column("pod", sa.String(length=253), nullable=nullable)


def ulid(name: str) -> sa.Column:
    """A decision's or a report's id: a ULID (26 characters)."""
    return sa.Column(name, sa.String(length=26), nullable=False)


def content_id(name: str, *, nullable: bool = False) -> sa.Column:
    """The id of an answer or a shape: a hash of its content (24 characters)."""
    return sa.Column(name, sa.String(length=24), nullable=nullable)


def backend(*, nullable: bool = False) -> sa.Column:
    """``backend``: a backend's name (at most 32 characters)."""
    return sa.Column("backend", sa.String(length=32), nullable=nullable)


def choice() -> list[sa.Column]:
    """``backend`` and ``source``: what a decision chose, and what chose it."""
    return [backend(), sa.Column("source", sa.String(length=32), nullable=False)]


def content_addressed(text: str) -> list[sa.SchemaItem]:
    """A table that stores each distinct text once, by its hash (answers, shapes): ``id``
    and the text column, keyed by ``id``."""
    return [
        content_id("id"),
        sa.Column(text, sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    ]
