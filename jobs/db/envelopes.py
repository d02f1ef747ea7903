"""Memory envelopes in the database (jobs.db.service_rows.EnvelopeRow): recorded by `reelbatch bench envelope` and by
a worker that measures its own at start, read by every worker (its claims' batch sizes) and by submit and estimate
(a video that fits no recorded device is refused), shrunk by a worker that still runs out of memory."""

from __future__ import annotations

import json
from dataclasses import asdict, fields

from sqlalchemy import select

from engine.models.envelope import Envelope, Point
from jobs.db.queries import Factory
from jobs.db.service_rows import EnvelopeRow

_PARTS = [f.name for f in fields(Envelope)]


def _envelope(row: EnvelopeRow) -> Envelope:
    return Envelope(**{name: getattr(row, name) for name in _PARTS})


def record(factory: Factory, envelope: Envelope, points: list[Point], measured_with: str) -> None:
    """Keep `envelope` for its model and device, in place of what was kept (a new measurement starts with no OOMs)."""
    values = {**asdict(envelope), "points": json.dumps([asdict(p) for p in points]), "measured_with": measured_with}
    with factory.begin() as s:
        row = s.scalar(select(EnvelopeRow).where(EnvelopeRow.model == envelope.model,
                                                 EnvelopeRow.device == envelope.device).with_for_update())
        if row is None:
            s.add(EnvelopeRow(**values))
        else:
            for name, value in values.items():
                setattr(row, name, value)


def load(factory: Factory, model: str | None = None, device: str | None = None) -> list[Envelope]:
    """The envelopes kept, of `model` and `device` where given, by model then device."""
    where = []
    if model is not None:
        where.append(EnvelopeRow.model == model)
    if device is not None:
        where.append(EnvelopeRow.device == device)
    with factory() as s:
        rows = s.scalars(select(EnvelopeRow).where(*where).order_by(EnvelopeRow.model, EnvelopeRow.device))
        return [_envelope(r) for r in rows]


def shrink(factory: Factory, model: str, device: str, batch: int, tokens: int, width: int, height: int,
           what: str) -> Envelope | None:
    """After `batch` videos of a shape (`what`, its key) ran out of memory on `device`: the kept envelope shrunk so
    that batch no longer fits (Envelope.shrunk), and the error counted. None when none is kept."""
    with factory.begin() as s:
        row = s.scalar(select(EnvelopeRow).where(EnvelopeRow.model == model, EnvelopeRow.device == device)
                       .with_for_update())
        if row is None:
            return None
        smaller = _envelope(row).shrunk(batch, tokens, width, height, what)
        for name in ("per_token_bytes", "per_pixel_bytes", "ooms", "last_oom"):
            setattr(row, name, getattr(smaller, name))
        return smaller
