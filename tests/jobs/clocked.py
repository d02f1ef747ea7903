"""The real render path (claim -> tiny engine -> PyAV -> store -> rows and cost records) on a controlled clock, as in
tests/jobs/test_ledger.py: a batch's render takes STEP_S per denoising step of its shape (whatever its size) and an
encode ENCODE_S, so every charge is known in advance. With RATE one second costs 1000 micro-dollars."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from engine.engine import Engine
from jobs.cost.meter import Meter
from jobs.cost.prices import Rate
from jobs.db import submission
from jobs.db.connect import session_factory
from jobs.manifest import RunSpec, load_manifest
from jobs.render import encoding
from jobs.render.batch import render_next_batch
from jobs.render.finisher import BatchResult
from jobs.settings import Settings

RATE = Rate(3.6, "test rate: $3.60/h, so one second is 1000 micro-dollars")
STEP_S, ENCODE_S = 10.0, 5.0


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@dataclass
class World:
    settings: Settings
    factory: object
    engine: Engine
    clock: Clock
    meter: Meter
    folder: Path
    registry: object

    def manifest(self, name: str, videos: list[dict], **run: object) -> Path:
        path = self.folder / f"{name}.yaml"
        path.write_text(yaml.safe_dump({"name": name, "model": "tiny", **run, "videos": videos}, sort_keys=False))
        return path

    def spec(self, name: str, videos: list[dict], **run: object) -> RunSpec:
        return load_manifest(self.manifest(name, videos, **run), registry=self.registry)

    def submit(self, name: str, videos: list[dict], **run: object) -> int:
        return submission.submit_run(self.factory, self.spec(name, videos, **run),
                                  output=f"file://{self.folder / 'out'}/").run_id

    def render(self) -> BatchResult:
        return render_next_batch(self.settings, self.engine, self.factory, meter=self.meter)

    def render_all(self) -> int:
        """Render until nothing is claimable; returns how many batches were claimed."""
        batches = 0
        while self.render().claimed:
            batches += 1
        return batches


def clock_the_encoder(monkeypatch, clock: Clock, seconds: float = ENCODE_S) -> None:
    """Every MP4 encode of the render path takes `seconds` on `clock` (and really encodes)."""
    real_encode = encoding.encode_mp4

    def encode(frames, fps, **options):
        clock.advance(seconds)
        return real_encode(frames, fps, **options)

    monkeypatch.setattr(encoding, "encode_mp4", encode)


def videos(prefix: str, count: int, **fields: object) -> list[dict]:
    return [{"id": f"{prefix}{i}", "prompt": f"{prefix} video {i}", "seed": 100 + i, **fields} for i in range(count)]


def make_world(tmp_path: Path, db_url: str, model_cache: Path, registry, monkeypatch, measuring: tuple[str, ...] = (),
               **settings: object) -> World:
    """`measuring`: models rendered here without asking their gates (engine.models.pipelines.PipelineCache.measuring);
    `settings`: values by path (Settings.with_values), "worker.max_batch" written worker__max_batch."""
    config = Settings.from_env({}).with_values({
        "database_url": db_url, "engine.cache_dir": tmp_path / "cache", "worker.max_batch": 2, "prices.gpu": RATE,
        "limits.retry_backoff_s": 0.0, "worker.overlap": False,
        "worker.store_threads": 1,  # encodes one after another, each ENCODE_S on the clock: every charge is known
        **{k.replace("__", "."): v for k, v in settings.items()}})
    factory = session_factory(config.database_url)
    clock = Clock()
    # The built models come from the session's cache; profiles and the rest go to this test's own folder.
    engine_config = config.with_values({"engine.cache_dir": model_cache}).engine_config()
    engine = Engine(engine_config, registry, measuring=measuring)
    real_render = engine.render

    def render(batch, **kwargs):
        rendered = real_render(batch, **kwargs)
        clock.advance(STEP_S * batch.shape.steps)
        return rendered

    monkeypatch.setattr(engine, "render", render)
    clock_the_encoder(monkeypatch, clock)
    meter = Meter(RATE, factory, "test-worker", clock=clock)
    meter.open()
    return World(config, factory, engine, clock, meter, tmp_path, registry)
