"""Taking work: a worker claims a same-shape batch of claimable units, each a lease (jobs.claims.leases).

Claimable (jobs.db.queries.claimable_units): pending, its turn (a long video's next chunk waits for the one before),
past its retry backoff, and of a model the worker serves (`Serving`): work for a model no live worker serves waits.
Among those, the best unit decides the batch's shape: the highest rank (jobs.db.submission.unit_rank), where a unit of
a model the worker has loaded counts `affinity_s` seconds of waiting more, and one of its last batch's shape as much
again. As many units of that shape as the worker's max batch for the model (its own, the registration's, or its
device's memory envelope's for the shape, whichever is smallest) join it; a shape of which the envelope fits not one
video is passed over, for a worker with more memory.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta

from sqlalchemy import case, func, select, update

from engine.models.envelope import Envelope, tokens
from engine.models.shape_rules import ShapeRules
from engine.types import RenderBatch, RenderRequest, Shape
from jobs.claims.fair import FairShare
from jobs.claims.gate import Gate
from jobs.db.base import utcnow
from jobs.db.connect import reads
from jobs.db.queries import Factory, claimable_units, waiting_units
from jobs.db.rows import Run, Video, WorkUnit
from jobs.db.status import Status, check_move
from storage.codecs import DEFAULT, Encoding

# Claim order, best first: the order of the claim indexes (jobs.db.rows), so each probe reads one index entry.
ORDER = (WorkUnit.rank.desc(), WorkUnit.id)


@dataclass(frozen=True)
class Serving:
    """What a worker claims: units of `models` only, at most `max_batch[model]` at a time where a registration sets
    a smaller batch, and, preferred by `affinity_s` seconds of rank, work for what it has warm: the `loaded` models
    (their pipelines are in memory) and the `shape` of its last batch and its other `warm` shapes (their compiled
    graphs, its learnt batch size)."""

    models: tuple[str, ...]
    max_batch: Mapping[str, int] = field(default_factory=dict)
    loaded: tuple[str, ...] = ()
    shape: Shape | None = None
    affinity_s: float = 0.0
    # The shapes it has warm besides the last (compiled or warmed up ahead: engine.engine.Engine.warm_shapes), each
    # preferred as the last shape is: a worker warm for a shape takes its work before a cold one would.
    warm: tuple[Shape, ...] = ()
    # Its device's memory envelope per model, with the model's shape rules (engine.models.envelope): at most the
    # largest batch of a shape the envelope allows, and nothing of a shape of which not even one video fits.
    envelopes: Mapping[str, tuple[Envelope, ShapeRules]] = field(default_factory=dict)
    # A worker of several ranks (engine.group): the ranks that split each video's tokens, and each model's shape
    # rules; a shape whose tokens they do not divide is left to other workers.
    split: int = 1
    rules: Mapping[str, ShapeRules] = field(default_factory=dict)

    def limit(self, shape_key: str, model: str, max_batch: int) -> int:
        """The most units of the shape `shape_key` one claim takes (0: none)."""
        limit = min(max_batch, self.max_batch.get(model, max_batch))
        if self.split > 1 and model in self.rules:
            shape = Shape.parse(shape_key)
            if tokens(self.rules[model], shape.width, shape.height, shape.frames) % self.split:
                return 0
        if model in self.envelopes:
            envelope, rules = self.envelopes[model]
            shape = Shape.parse(shape_key)
            limit = min(limit, envelope.largest_batch(tokens(rules, shape.width, shape.height, shape.frames),
                                                      shape.width, shape.height))
        return limit

    def probes(self) -> list[tuple[tuple, float]]:
        """(where-clauses, rank bonus) per probe: the last shape, the other warm shapes, each loaded model, each
        other served model. One probe per model rather than `model IN (...)`: each is the first entry of its index
        range, where an IN list would have PostgreSQL (before 17) sort every claimable unit of those models."""
        loaded = [m for m in self.loaded if m in self.models]
        probes: list[tuple[tuple, float]] = []
        if self.affinity_s:
            warm = dict.fromkeys(s.key() for s in (self.shape, *self.warm) if s is not None and s.model in loaded)
            probes += [((WorkUnit.shape_key == key,), 2 * self.affinity_s) for key in warm]
        probes += [((WorkUnit.model == m,), self.affinity_s) for m in loaded]
        probes += [((WorkUnit.model == m,), 0.0) for m in self.models if m not in loaded]
        return probes


def served_by(models: tuple[str, ...] | None) -> tuple:
    """The where-clause for units of `models` (None: every model)."""
    return () if models is None else (WorkUnit.model.in_(models),)


@dataclass(frozen=True)
class ClaimedUnit:
    unit_id: int
    token: int
    video_id: int
    run_id: int
    key: str
    run_name: str
    output: str
    seed: int
    fps: int
    frames: int
    attempts: int
    # The checksum an earlier attempt was about to upload, if any (jobs.render.record.mark_all_uploading).
    upload_sha256: str | None = None
    # A long video's chunk (engine.long.chunks): which one, of how many, sharing how many latent frames.
    chunk: int = 0
    chunks: int = 1
    chunk_overlap: int = 0
    encoding: Encoding = DEFAULT  # the run's codec, crf and preset
    # The video's image (jobs.render.images reads it for its first chunk): URI, SHA-256 at submit, fit.
    image_uri: str | None = None
    image_sha256: str | None = None
    image_fit: str | None = None
    on_fail: str = "flag"  # the run's `checks.on_fail` (jobs.render.checks)

    @property
    def chunked(self) -> bool:
        return self.chunks > 1

    @property
    def last_chunk(self) -> bool:
        return self.chunk == self.chunks - 1


@dataclass(frozen=True)
class Claim:
    batch: RenderBatch
    units: tuple[ClaimedUnit, ...]


# A claim whose best units belong to runs the gate holds looks again past them, this many times at most.
GATE_PASSES = 8


def claim_batch(factory: Factory, *, owner: str, max_batch: int, lease_s: float, serving: Serving | None = None,
                where: tuple = (), gate: Gate | None = None, fair: FairShare | None = None) -> Claim | None:
    """Atomically take up to `max_batch` claimable units of one shape: the shape of the best claimable unit that
    `serving` allows (None: any model, no preference). `where`: more clauses a unit must meet to be claimable.

    A unit marked solo (its batch failed before) is claimed alone. On PostgreSQL every select uses FOR UPDATE SKIP
    LOCKED, so concurrent workers take disjoint units without waiting (a probe's best unit that loses to another
    probe's stays locked until this transaction ends, milliseconds, and other workers pass over it meanwhile); on
    SQLite the transaction is BEGIN IMMEDIATE (jobs.db.connect). With a `gate` (jobs.claims.gate), the batch holds only
    what its runs' deadlines and cost caps let start; the runs it holds back are passed over for the next best units.
    With `fair` (jobs.claims.fair), the teams that may start work are tried in their fair-share order, each with the
    claim above restricted to its units.
    """
    now = utcnow()
    claimable = (*claimable_units(now), *where)
    with factory.begin() as s:
        for turn in fair.turns(s, now) if fair is not None else [None]:
            found = _gated(s, claimable if turn is None else (*claimable, turn.clause), serving, max_batch, gate, now)
            if found is not None:
                if fair is not None:
                    fair.claimed(found[0])
                break
        else:
            return None
        units, rows = found
        for unit in units:  # pending -> running, as jobs.db.status.move would; written below in two statements
            check_move(unit, Status.RUNNING)
            check_move(rows[unit.video_id][0], Status.RUNNING)
        _take(s, units, owner, now, now + timedelta(seconds=lease_s))
        claimed = [(u, *rows[u.video_id]) for u in units]
        u0, v0, run0 = claimed[0]
        shape = Shape(run0.model, v0.width, v0.height, u0.frames, v0.steps, v0.guidance)
        # The rows in the session still hold the values read under their locks: the lease token and the attempts
        # are one more now.
        return Claim(
            RenderBatch(shape, tuple(RenderRequest(v.id, v.prompt, v.negative_prompt, v.seed) for _, v, _ in claimed)),
            tuple(ClaimedUnit(u.id, u.lease_token + 1, v.id, r.id, v.key, r.name, r.output, v.seed, v.fps, v.frames,
                              u.attempts + 1, v.upload_sha256, u.chunk, v.chunks, v.chunk_overlap,
                              Encoding(r.codec, r.crf, r.preset), v.image_uri, v.image_sha256, v.image_fit,
                              r.checks_on_fail)
                  for u, v, r in claimed),
        )


def _gated(s, claimable: tuple, serving: Serving | None, max_batch: int, gate: Gate | None, now):
    """The best batch the gate lets start: (units, rows) as _select_batch gives them, or None."""
    held: set[int] = set()
    for _ in range(GATE_PASSES):
        found = _select_batch(s, claimable, serving, held, max_batch)
        if found is None or gate is None:
            return found
        units, rows = found
        verdict = gate.admit(s, units, {v.id: v for v, _ in rows.values()}, {r.id: r for _, r in rows.values()}, now)
        held |= verdict.held
        if verdict.keep:
            return verdict.keep, rows
    return None


def _select_batch(s, claimable: tuple, serving: Serving | None, held: set[int], max_batch: int):
    """The best claimable unit (not of a `held` run) and up to its batch limit - 1 more of its shape, locked; with
    their videos and runs ({video id: (video, run)}). None when nothing is claimable."""
    where = claimable
    if held:  # only when some run is held back, so the usual claim stays one indexed probe a model
        where = (*claimable, WorkUnit.video_id.not_in(select(Video.id).where(Video.run_id.in_(held))))
    first, limit = _best(s, where, serving), max_batch
    too_big: list[str] = []  # shapes it cannot take (not one video fits its envelope; its ranks cannot split them)
    while first is not None and serving is not None:
        limit = serving.limit(first.shape_key, first.model, max_batch)
        if limit >= 1:
            break
        too_big.append(first.shape_key)
        first = _best(s, (*where, WorkUnit.shape_key.not_in(too_big)), serving)
    if first is None:
        return None
    units = [first]
    if not first.solo and limit > 1:
        units += s.scalars(select(WorkUnit).where(*where, WorkUnit.shape_key == first.shape_key,
                                                  WorkUnit.solo.is_(False), WorkUnit.id != first.id)
                           .order_by(*ORDER).limit(limit - 1).with_for_update(skip_locked=True))
    rows = {v.id: (v, r) for v, r in s.execute(select(Video, Run).join(Run, Run.id == Video.run_id)
                                                  .where(Video.id.in_([u.video_id for u in units])))}
    return units, rows


def _take(s, units: list[WorkUnit], owner: str, now, expires) -> None:
    """The claim's writes, one statement per table whatever the batch's size (row by row, a batch of four cost eight
    round trips): each unit running under a new lease and token, one more attempt on it and on its video, and a
    video's start time when its first chunk starts."""
    plain = {"synchronize_session": False}
    s.execute(update(WorkUnit).where(WorkUnit.id.in_([u.id for u in units]))
              .values(status=Status.RUNNING, attempts=WorkUnit.attempts + 1, lease_owner=owner,
                      lease_token=WorkUnit.lease_token + 1, lease_expires_at=expires).execution_options(**plain))
    first_chunks = [u.video_id for u in units if u.chunk == 0]
    s.execute(update(Video).where(Video.id.in_([u.video_id for u in units]))
              .values(status=Status.RUNNING, attempts=Video.attempts + 1,
                      started_at=case((Video.id.in_(first_chunks), now), else_=Video.started_at))
              .execution_options(**plain))


def _best(s, claimable: tuple, serving: Serving | None) -> WorkUnit | None:
    """The best claimable unit, locked: the highest rank plus its probe's bonus; on a tie, the earlier probe."""
    best, best_score = None, 0.0
    for clauses, bonus in serving.probes() if serving is not None else [((), 0.0)]:
        unit = s.scalar(select(WorkUnit).where(*claimable, *clauses).order_by(*ORDER).limit(1)
                        .with_for_update(skip_locked=True))
        if unit is not None and (best is None or unit.rank + bonus > best_score):
            best, best_score = unit, unit.rank + bonus
    return best


def claimable_count(factory: Factory, models: tuple[str, ...] | None = None) -> int:
    """How many units a worker serving `models` (None: every model) could claim now."""
    with factory() as s:
        return s.scalar(select(func.count()).select_from(WorkUnit)
                        .where(*claimable_units(utcnow()), *served_by(models)))


def any_claimable(factory: Factory, models: tuple[str, ...] | None = None) -> bool:
    """Is any unit waiting that a worker serving `models` (None: every model) could claim now?"""
    if models is not None:
        return next_model(factory, models) is not None
    with reads(factory)() as s:
        return s.scalar(select(WorkUnit.id).where(*claimable_units(utcnow())).limit(1)) is not None


def next_model(factory: Factory, models: tuple[str, ...], prefer: str | None = None) -> str | None:
    """The first of `prefer`, then `models`, with a unit claimable now (one index probe each); None if none has."""
    order = ([prefer] if prefer in models else []) + [m for m in models if m != prefer]
    now = utcnow()
    with reads(factory)() as s:  # a statement each, autocommit on PostgreSQL
        for model in order:
            if s.scalar(select(WorkUnit.id).where(*claimable_units(now), WorkUnit.model == model).limit(1)):
                return model
    return None


def waiting_shapes(factory: Factory, limit: int = 4, models: tuple[str, ...] | None = None) -> list[tuple[Shape, int]]:
    """The shapes of waiting work (backoff or not) of `models` (None: every model), with how many units wait in
    each, the most first."""
    count = func.count(WorkUnit.id)
    columns = (Run.model, Video.width, Video.height, WorkUnit.frames, Video.steps, Video.guidance)
    with factory() as s:
        rows = s.execute(select(*columns, count).join(Video, WorkUnit.video_id == Video.id)
                         .join(Run, Video.run_id == Run.id).where(*waiting_units(), *served_by(models))
                         .group_by(*columns).order_by(count.desc()).limit(limit)).all()
    return [(Shape(*row[:6]), row[6]) for row in rows]
