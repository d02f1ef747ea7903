"""What every row shares: the declarative base with its naming convention, the id/created/updated columns, the status
column, and UTC moments (now, and a stored moment read back as UTC)."""

from __future__ import annotations

from datetime import datetime, timezone

from sqlalchemy import DateTime, Enum, Integer, MetaData
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from jobs.db.status import Status

NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def as_utc(moment: datetime) -> datetime:
    """A stored moment as an aware UTC datetime: SQLite hands DateTime(timezone=True) back naive, and every value
    reelbatch stores is UTC."""
    return moment.replace(tzinfo=timezone.utc) if moment.tzinfo is None else moment.astimezone(timezone.utc)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


class Timestamps:
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow, onupdate=utcnow)


StatusColumn = Enum(Status, native_enum=False, length=16, values_callable=lambda e: [m.value for m in e],
                    validate_strings=True, name="status")
