"""A run's rows (SQLAlchemy 2.0 typed models): the run, its videos, their work units, and what the work cost: the
worker sessions whose time is charged and the cost records charged to videos. The rows around runs (teams and tokens,
schedules, notifications) are jobs.db.service_rows; the base they share is jobs.db.base. Rows stay in jobs/; other
packages get plain values."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    false,
    true,
)
from sqlalchemy.orm import Mapped, mapped_column, relationship

from jobs.db.base import Base, StatusColumn, Timestamps, utcnow
from jobs.db.status import Status


class Run(Timestamps, Base):
    __tablename__ = "runs"

    name: Mapped[str] = mapped_column(String(128), unique=True)
    model: Mapped[str] = mapped_column(String(128))
    # The URI prefix videos are stored under: `{output}{name}/{video id}.mp4`.
    output: Mapped[str] = mapped_column(Text)
    priority: Mapped[int] = mapped_column(Integer, default=0)
    source: Mapped[str] = mapped_column(Text)
    # Hash of the validated content: submitting the same content again returns this run.
    content_sha256: Mapped[str] = mapped_column(String(64), index=True)
    # Set by `reelbatch cancel`: running batches stop at their next step boundary.
    cancelled_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # How every video is encoded (storage.codecs); the defaults are what reelbatch encoded before they existed.
    codec: Mapped[str] = mapped_column(String(16), default="h264", server_default="h264")
    crf: Mapped[int] = mapped_column(Integer, default=18, server_default="18")
    preset: Mapped[str] = mapped_column(String(16), default="medium", server_default="medium")
    # A webhook URL POSTed to when the run finishes (jobs.notify), once per `round`: a resume starts a new round,
    # so a run that finishes again is heard of again.
    notify_url: Mapped[str | None] = mapped_column(Text)
    round: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # The run's cost cap (`max_cost_usd`), in micro-dollars like every amount; None: no cap. A worker does not start
    # a batch that would take the run past it (jobs.claims.gate); when it stops the run, `budget_reached_at` is set.
    max_cost_micro_usd: Mapped[int | None] = mapped_column(BigInteger)
    budget_reached_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # At its deadline, work not yet started is cancelled and `expired_at` set, once (jobs.db.limits.expire_due).
    deadline: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), index=True)
    expired_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # The team that owns it (jobs.db.teams): only that team's tokens see or touch it over HTTP. None: the default
    # team (a run recorded before teams existed, or by code that names none).
    team_id: Mapped[int | None] = mapped_column(ForeignKey("teams.id"), index=True)
    # What a video whose checks fail (engine.frames.video_checks) becomes: "flag" (stored and marked), "retry" (rendered
    # again once with the next seed) or "fail" (jobs.render.checks).
    checks_on_fail: Mapped[str] = mapped_column(String(8), default="flag", server_default="flag")

    videos: Mapped[list[Video]] = relationship(back_populates="run", lazy="raise", order_by="Video.id")


class Video(Timestamps, Base):
    __tablename__ = "videos"
    __table_args__ = (
        UniqueConstraint("run_id", "key"),
        # Is a run done, and its counts by status: both read from the index, never from the run's rows.
        Index("ix_videos_run_id_status", "run_id", "status"),
    )

    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    key: Mapped[str] = mapped_column(String(128))  # the manifest's video id
    line: Mapped[int] = mapped_column(Integer)
    prompt: Mapped[str] = mapped_column(Text)
    negative_prompt: Mapped[str | None] = mapped_column(Text)
    seed: Mapped[int] = mapped_column(BigInteger)
    width: Mapped[int] = mapped_column(Integer)
    height: Mapped[int] = mapped_column(Integer)
    frames: Mapped[int] = mapped_column(Integer)
    fps: Mapped[int] = mapped_column(Integer)
    duration_s: Mapped[float] = mapped_column(Float)
    steps: Mapped[int] = mapped_column(Integer)
    guidance: Mapped[float] = mapped_column(Float)

    status: Mapped[Status] = mapped_column(StatusColumn, default=Status.PENDING, index=True)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    last_error: Mapped[str | None] = mapped_column(Text)
    # Why a cancelled video was cancelled by reelbatch itself (jobs.db.status.CancelReason: "budget", "deadline");
    # None for one cancelled by `reelbatch cancel`.
    cancel_reason: Mapped[str | None] = mapped_column(String(16))
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    render_s: Mapped[float | None] = mapped_column(Float)  # the video's share of its batch's render
    # Its share of each render stage (the three add up to about render_s), for stage breakdowns and benchmarks.
    text_s: Mapped[float | None] = mapped_column(Float)
    denoise_s: Mapped[float | None] = mapped_column(Float)
    decode_s: Mapped[float | None] = mapped_column(Float)
    encode_s: Mapped[float | None] = mapped_column(Float)
    upload_s: Mapped[float | None] = mapped_column(Float)
    uri: Mapped[str | None] = mapped_column(Text)
    poster_uri: Mapped[str | None] = mapped_column(Text)  # its middle frame as a JPEG, beside the MP4
    bytes: Mapped[int | None] = mapped_column(BigInteger)
    sha256: Mapped[str | None] = mapped_column(String(64))
    # Written (fenced) just before an upload: if the worker dies after the upload but before recording it, the retry
    # finds this checksum on the object at the video's key and adopts that object instead of failing on a conflict.
    upload_sha256: Mapped[str | None] = mapped_column(String(64))
    # A long video is rendered as `chunks` window-sized work units sharing `chunk_overlap` latent frames
    # (engine.long.chunks); its seam score is stored once stitched, and a score above the review threshold flags it.
    chunks: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    chunk_overlap: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    seam_score: Mapped[float | None] = mapped_column(Float)
    needs_review: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    # The picture the video starts from (its first chunk, for a long video): where it is, the SHA-256 its bytes had
    # at submit (a worker refuses an object that changed since), and how it meets the video's size. None: text only.
    image_uri: Mapped[str | None] = mapped_column(Text)
    image_sha256: Mapped[str | None] = mapped_column(String(64))
    image_fit: Mapped[str | None] = mapped_column(String(8))
    # Its checks after its render (engine.frames.video_checks, as JSON text: jobs.render.checks.checks_json), an earlier
    # attempt's among them when a failed check retried it; `flagged` when the stored video failed one.
    checks: Mapped[str | None] = mapped_column(Text)
    flagged: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    checks_s: Mapped[float | None] = mapped_column(Float)  # the checks' seconds (bench's "checks" stage)

    run: Mapped[Run] = relationship(back_populates="videos", lazy="raise")
    units: Mapped[list[WorkUnit]] = relationship(back_populates="video", lazy="raise")
    costs: Mapped[list[CostRecord]] = relationship(back_populates="video", lazy="raise")


class WorkUnit(Timestamps, Base):
    """A claimable piece of rendering: a whole video, or one chunk of a long one (then `frames` is the model's
    window). Chunk k+1 becomes `ready` (claimable) when chunk k has finished and left its latents at `checkpoint`."""

    __tablename__ = "work_units"
    __table_args__ = (UniqueConstraint("video_id", "chunk"),)

    video_id: Mapped[int] = mapped_column(ForeignKey("videos.id", ondelete="CASCADE"), index=True)
    chunk: Mapped[int] = mapped_column(Integer, default=0)
    frames: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    ready: Mapped[bool] = mapped_column(Boolean, default=True, server_default=true())
    checkpoint: Mapped[str | None] = mapped_column(Text)
    shape_key: Mapped[str] = mapped_column(String(255))
    # The run's model, so a worker claims only what it serves with one index probe per model (jobs.claims.claims).
    model: Mapped[str] = mapped_column(String(128))
    priority: Mapped[int] = mapped_column(Integer, default=0)
    # The run's team (None: the default team), so the claim's fair share counts a team's units without a join.
    team_id: Mapped[int | None] = mapped_column(Integer)
    # Claim order, highest first: priority x AGING_S minus submission time (jobs.db.submission.unit_rank), so a
    # higher priority wins but waiting work gains a level every AGING_S seconds and is never starved.
    rank: Mapped[int] = mapped_column(BigInteger, default=0)
    status: Mapped[Status] = mapped_column(StatusColumn, default=Status.PENDING)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    # Backoff: a retried unit is not claimed before this time.
    not_before: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # After a batch failed, its units are retried one per batch so one bad video cannot fail its neighbours.
    solo: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    last_error: Mapped[str | None] = mapped_column(Text)
    # A claim is a lease: who holds it, until when, and a token that grows with every claim (fencing).
    lease_owner: Mapped[str | None] = mapped_column(String(255))
    lease_token: Mapped[int] = mapped_column(BigInteger, default=0)
    lease_expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))

    video: Mapped[Video] = relationship(back_populates="units", lazy="raise")


# The claim's probes (jobs.claims.claims): the best claimable unit of one model, or of one shape, is the first entry of
# its range, whatever else the table holds (finished rows sort under other statuses). rank DESC, id: the claim order.
Index("ix_work_units_claim_model", WorkUnit.status, WorkUnit.ready, WorkUnit.model, WorkUnit.rank.desc(), WorkUnit.id)
# A team's best claimable unit of a model (jobs.claims.fair): the first entry of its range.
Index("ix_work_units_claim_team", WorkUnit.status, WorkUnit.ready, WorkUnit.team_id, WorkUnit.model,
      WorkUnit.rank.desc(), WorkUnit.id)
Index("ix_work_units_claim_shape", WorkUnit.status, WorkUnit.ready, WorkUnit.shape_key, WorkUnit.rank.desc(),
      WorkUnit.id)


class WorkerSession(Timestamps, Base):
    """One worker process's paid time, from its start to its stop (jobs.cost.ledger). Its seconds are either charged to
    videos (cost records carrying this session's id) or idle: `up_s` minus the charged seconds. `in_flight_*` name the
    batch it is rendering, so a session that stops heartbeating (a killed worker) has that time charged to the videos
    that needed it (kind "lost") when another worker's sweeper closes it."""

    __tablename__ = "worker_sessions"

    owner: Mapped[str] = mapped_column(String(255))  # host:pid, as in leases
    up_s: Mapped[float] = mapped_column(Float, default=0.0)  # seconds up at the last heartbeat (the worker's clock)
    last_seen_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow, index=True)
    ended_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # "stopped" (the worker closed it) or "lost" (a sweeper closed it after its heartbeats stopped).
    end_reason: Mapped[str | None] = mapped_column(String(16))
    rate_usd_per_hour: Mapped[float] = mapped_column(Float)
    rate_source: Mapped[str] = mapped_column(Text)
    in_flight_videos: Mapped[str | None] = mapped_column(Text)  # comma-separated video ids
    in_flight_since_s: Mapped[float | None] = mapped_column(Float)  # on the session's clock, like up_s
    # Seconds up when its last work (a render, storing) ended, on its clock: the idle time before it is its runs',
    # the idle after it the ledger's alone (jobs.cost.ledger). None: a session recorded before the column.
    worked_s: Mapped[float | None] = mapped_column(Float)
    # The models it claims, comma-separated (`reelbatch status` names pending work no live session serves); None:
    # a session opened before workers recorded them, taken to serve every model.
    models: Mapped[str | None] = mapped_column(Text)
    # Seconds from its process's start to its first video stored (its cold start: load, compile, first batch); the
    # recent sessions' median is `reelbatch scale`'s cold start (jobs.db.scale_queries.measured_cold_start).
    cold_start_s: Mapped[float | None] = mapped_column(Float)


class CostRecord(Timestamps, Base):
    """One charge against one video: "gpu" (its share of a batch's render, plus storing time no render covered),
    "retry" (a failed attempt's), "lost" (a killed worker's attempt), "cancelled", "preempted" and "interrupted" (a
    render stopped mid-batch and handed back: its run cancelled, its worker's grace too short, its worker told to
    stop now), "storage" and "egress". The worker seconds behind a charge name their session; idle time stays on the
    session (jobs.cost.ledger)."""

    __tablename__ = "cost_records"

    video_id: Mapped[int] = mapped_column(ForeignKey("videos.id", ondelete="CASCADE"), index=True)
    session_id: Mapped[int | None] = mapped_column(ForeignKey("worker_sessions.id", ondelete="SET NULL"), index=True)
    kind: Mapped[str] = mapped_column(String(32))
    seconds: Mapped[float] = mapped_column(Float)
    rate_usd_per_hour: Mapped[float] = mapped_column(Float)
    rate_source: Mapped[str] = mapped_column(Text)
    # Money as integer micro-dollars: exact sums, no float drift, no Decimal warnings on SQLite.
    amount_micro_usd: Mapped[int] = mapped_column(BigInteger)
    # A render's charge ("gpu"): the precision it rendered at (engine.levers.precision: fp32, bf16, int8, ...); None on
    # other charges and on records older than the column.
    precision: Mapped[str | None] = mapped_column(String(16))

    video: Mapped[Video] = relationship(back_populates="costs", lazy="raise")


class PrunedCharge(Timestamps, Base):
    """What a pruned run's cost records were, summed per worker session (jobs.db.prune): removing a run removes its
    videos and, with them, their cost records, but not the worker time they were charged. The ledger adds these to
    each session's charged seconds and money, and counts their successful videos among those the session served, so
    its figures, and the idle time it spreads over the runs that remain, read the same after a prune as before."""

    __tablename__ = "pruned_charges"

    session_id: Mapped[int] = mapped_column(ForeignKey("worker_sessions.id", ondelete="CASCADE"), index=True)
    run_id: Mapped[int] = mapped_column(Integer)  # the pruned run's id then (no key: its row is gone)
    run_name: Mapped[str] = mapped_column(String(128))
    seconds: Mapped[float] = mapped_column(Float)
    amount_micro_usd: Mapped[int] = mapped_column(BigInteger)
    succeeded_videos: Mapped[int] = mapped_column(Integer)  # of the run's, those this session worked on
