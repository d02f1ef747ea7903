"""The rows around runs (SQLAlchemy 2.0 typed models): teams and their API tokens, schedules and their firings, and
a finished run's notifications and their attempts. A run's own rows are jobs.db.rows."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, Boolean, DateTime, Float, ForeignKey, Index, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from jobs.db.base import Base, Timestamps


class Team(Timestamps, Base):
    """Who owns runs (jobs.db.teams): its share of idle capacity, and its quotas (None: no limit)."""

    __tablename__ = "teams"

    name: Mapped[str] = mapped_column(String(64), unique=True)
    share: Mapped[float] = mapped_column(Float, default=1.0, server_default="1")
    max_gpus: Mapped[int | None] = mapped_column(Integer)  # batches running at once
    monthly_micro_usd: Mapped[int | None] = mapped_column(BigInteger)  # a calendar month's (UTC) charges
    # Where its runs over the API may write: a canonical output URI (jobs.manifest.outputs); None: the service's
    # output with the team's name as a prefix (jobs.usecases.teams.output_root).
    output: Mapped[str | None] = mapped_column(Text)


class Token(Timestamps, Base):
    """A team's API token: only the SHA-256 of its secret is kept, so the table cannot be replayed if read."""

    __tablename__ = "tokens"

    team_id: Mapped[int] = mapped_column(ForeignKey("teams.id", ondelete="CASCADE"), index=True)
    secret_sha256: Mapped[str] = mapped_column(String(64), unique=True)
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class Schedule(Timestamps, Base):
    """A manifest rendered on a cron schedule by `reelbatch beat`."""

    __tablename__ = "schedules"

    name: Mapped[str] = mapped_column(String(128), unique=True)
    manifest: Mapped[str] = mapped_column(Text)  # a path or an s3:// URI, read at each firing
    cron: Mapped[str] = mapped_column(String(128))
    notify_url: Mapped[str | None] = mapped_column(Text)  # each run's webhook, over the manifest's own `notify`


class Firing(Timestamps, Base):
    """One firing of a schedule. The unique (schedule, fire time) makes a second beat's firing a no-op."""

    __tablename__ = "schedule_firings"
    __table_args__ = (UniqueConstraint("schedule_id", "fire_time"),)

    schedule_id: Mapped[int] = mapped_column(ForeignKey("schedules.id", ondelete="CASCADE"), index=True)
    fire_time: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    ok: Mapped[bool] = mapped_column(Boolean)
    run_id: Mapped[int | None] = mapped_column(ForeignKey("runs.id", ondelete="SET NULL"))
    errors: Mapped[str | None] = mapped_column(Text)


class Notification(Timestamps, Base):
    """One run's finish, to be POSTed to its webhook (jobs.notify). The unique (run, round) lets exactly one caller
    open it, however many notice the finish at once; `key` is the idempotency key receivers see. `body` is signed
    and sent unchanged on every attempt. Sending is held like a work unit: a lease (owner, expiry, a token that grows
    with every claim), so two sweepers never send at once."""

    __tablename__ = "notifications"
    __table_args__ = (UniqueConstraint("run_id", "round"), Index("ix_notifications_due", "state", "next_attempt_at"))

    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    round: Mapped[int] = mapped_column(Integer, default=0)
    key: Mapped[str] = mapped_column(String(36), unique=True)  # a UUID: the Reelbatch-Delivery header
    url: Mapped[str] = mapped_column(Text)
    body: Mapped[str] = mapped_column(Text)
    # pending (next attempt due at next_attempt_at), delivered (a 2xx came back), gave_up (24 hours of failures).
    state: Mapped[str] = mapped_column(String(16), default="pending")
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    give_up_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    delivered_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    lease_owner: Mapped[str | None] = mapped_column(String(255))
    lease_token: Mapped[int] = mapped_column(BigInteger, default=0)
    lease_expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class NotificationAttempt(Timestamps, Base):
    """One POST of a notification: when, by whom, what came back (a status code, or the error), how long it took."""

    __tablename__ = "notification_attempts"
    __table_args__ = (UniqueConstraint("notification_id", "number"),)

    notification_id: Mapped[int] = mapped_column(ForeignKey("notifications.id", ondelete="CASCADE"), index=True)
    number: Mapped[int] = mapped_column(Integer)  # 1, 2, ... in the order they were made
    sender: Mapped[str] = mapped_column(String(255))  # host:pid
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    duration_s: Mapped[float] = mapped_column(Float)
    status_code: Mapped[int | None] = mapped_column(Integer)
    error: Mapped[str | None] = mapped_column(Text)
    accepted: Mapped[bool] = mapped_column(Boolean)


class EnvelopeRow(Timestamps, Base):
    """A model's measured memory envelope on one device (engine.models.envelope, jobs.db.envelopes): the line through
    its peaks, what the process holds once it is loaded, and the out-of-memory errors that shrank it since."""

    __tablename__ = "envelopes"
    __table_args__ = (UniqueConstraint("model", "device"),)

    model: Mapped[str] = mapped_column(String(128))
    device: Mapped[str] = mapped_column(String(255))
    memory_bytes: Mapped[int] = mapped_column(BigInteger)
    resident_bytes: Mapped[int] = mapped_column(BigInteger)
    fixed_bytes: Mapped[float] = mapped_column(Float)
    per_token_bytes: Mapped[float] = mapped_column(Float)
    per_pixel_bytes: Mapped[float] = mapped_column(Float)
    spare: Mapped[float] = mapped_column(Float)
    ooms: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    last_oom: Mapped[str | None] = mapped_column(Text)
    # The measured points (JSON: a list of engine.models.envelope.Point) and what measured them (torch, the guidance).
    points: Mapped[str] = mapped_column(Text)
    measured_with: Mapped[str] = mapped_column(Text)
