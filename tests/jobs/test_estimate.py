"""`reelbatch estimate`: each basis (measured, fit, bench profile, unknown) from a ledger the real render path wrote on
a controlled clock (tests/jobs/clocked.py), so every expected number is worked out by hand; then the command itself:
its JSON, writing nothing, and bad input. Accuracy on the real clock: tests/e2e/test_plan.py."""

import dataclasses
import json
from pathlib import Path

import pytest
from sqlalchemy import func, select
from typer.testing import CliRunner

from engine.models.registry import TINY
from jobs.cli import app
from jobs.cost import profiles
from jobs.cost.estimate import Estimator
from jobs.cost.forecast import estimate
from jobs.cost.projection import queued
from jobs.db import queries
from jobs.db.base import utcnow
from jobs.db.rows import Run

from .clocked import RATE, make_world, videos

# Storage at the default $0.023 per GB-month for one month; egress off (the default).
GB_MONTH_USD = 0.023


@pytest.fixture
def world(tmp_path, db_url, model_cache, registry, monkeypatch):
    return make_world(tmp_path, db_url, model_cache, registry, monkeypatch)


def history(world):
    """Run `a`: 4 videos of 2 steps and 2 of 4 steps, in batches of 2. Each 2-step video is charged its half of a
    20 s render plus its 5 s encode, 15 s; each 4-step one, half of 40 s plus 5 s, 25 s."""
    world.submit("a", videos("a", 4, steps=2) + videos("b", 2, steps=4))
    assert world.render_all() == 3


def forecast(world, spec, workers=1):
    with world.factory() as s:
        return estimate(spec, Estimator(s, profiles.load(world.settings.engine.cache_dir)), rate=RATE,
                        storage=world.settings.prices.storage, workers=workers, workers_source="test",
                        queue=queued(s), now=utcnow())


def stored_bytes_per_video_s(world, run: str, prefix: str, count: int) -> float:
    """From the files on disk: each video is 9 frames at 8 fps, 1.125 s."""
    sizes = [(world.folder / "out" / run / f"{prefix}{i}.mp4").stat().st_size for i in range(count)]
    return sum(sizes) / (count * 1.125)


def test_the_measured_basis_is_what_the_ledger_charged_per_video_of_the_shape(world):
    history(world)
    spec = world.spec("b", videos("c", 4, steps=2) + videos("d", 2, steps=4))
    e = forecast(world, spec)
    two, four = e["shapes"]
    assert (two["steps"], two["videos"], four["steps"], four["videos"]) == (2, 4, 4, 2)
    assert two["basis"] == {"kind": "measured", "gpu_seconds_per_video": 15.0, "videos": 4, "runs": 1}
    assert four["basis"] == {"kind": "measured", "gpu_seconds_per_video": 25.0, "videos": 2, "runs": 1}
    assert (two["gpu_seconds"], four["gpu_seconds"], e["gpu_seconds"]) == (60.0, 50.0, 110.0)
    assert (two["cost"]["gpu_usd"], four["cost"]["gpu_usd"]) == (0.06, 0.05), "1000 micro-dollars a second"
    per_s = stored_bytes_per_video_s(world, "a", "a", 4)
    assert two["bytes_per_video_s"] == pytest.approx(per_s)
    assert two["cost"]["storage_usd"] == round(per_s * 4 * 1.125 / 1e9 * GB_MONTH_USD * 1e6) / 1e6
    assert two["cost"]["egress_usd"] == 0.0
    assert e["cost_usd"] == pytest.approx(0.11 + two["cost"]["storage_usd"] + four["cost"]["storage_usd"])
    assert e["unknown_videos"] == 0 and e["storage_unknown_videos"] == 0

    # The same shapes with other prompts and seeds, rendered: the ledger charges what was estimated.
    run_id = world.submit("b", videos("c", 4, steps=2) + videos("d", 2, steps=4))
    world.render_all()
    _, rows = queries.load_report(world.factory, str(run_id))
    charged = sum(micro for _, micro in rows) / 1e6
    assert charged == pytest.approx(e["cost_usd"], rel=0.15)
    assert sum(micro for v, micro in rows) - round(e["cost_usd"] * 1e6) in range(-50, 51), "GPU exact, bytes close"


def test_a_new_shape_of_a_known_model_is_fitted_on_work(world):
    history(world)
    # The history's two shapes differ only in steps: 2 steps (work 64 x 64 x 9 x 2 x 2 guidance passes = 147456) cost
    # 15 s and 4 steps (294912) 25 s: 5 s plus 10 s per 147456 of work.
    spec = world.spec("f", videos("e", 2, steps=8) + [{"id": "long", "prompt": "p", "steps": 2, "duration_s": 10}])
    eight, long = forecast(world, spec)["shapes"]
    assert eight["basis"]["kind"] == "fit" and (eight["basis"]["shapes"], eight["basis"]["videos"]) == (2, 6)
    assert eight["basis"]["intercept_s"] == pytest.approx(5.0)
    assert eight["basis"]["seconds_per_work"] == pytest.approx(10 / 147456)
    assert eight["basis"]["gpu_seconds_per_video"] == pytest.approx(45.0), "5 + 10 x 589824 / 147456"
    # 10 s at 8 fps is 81 frames: three chunks of tiny's 33-frame window, each rendering all 33 frames.
    assert (long["frames"], long["chunks"]) == (81, 3)
    assert long["basis"]["work"] == 64 * 64 * 33 * 3 * 2 * 2
    assert long["basis"]["gpu_seconds_per_video"] == pytest.approx(115.0), "5 + 10 x 1622016 / 147456"
    # Rendered, the 8-step pair is one batch of 80 s: 40 s each plus its 5 s encode, as the fit said.
    run_id = world.submit("f", videos("e", 2, steps=8))
    world.render_all()
    _, rows = queries.load_report(world.factory, str(run_id))
    assert [v.render_s for v, _ in rows] == [40.0, 40.0]


def test_with_no_history_the_bench_profile_is_scaled_by_work(world):
    profiles.record(world.settings.engine.cache_dir, profiles.Profile(
        "tiny", 64, 64, 9, 4, 5.0, seconds_per_video=3.0, videos=8, batch=4, device="cpu",
        measured_at="2026-12-01T00:00:00+00:00", source="reelbatch bench --preset t"))
    spec = world.spec("p", videos("a", 1, steps=8) + videos("b", 1, steps=4, resolution="128x128"))
    e = forecast(world, spec)
    twice, four_times = e["shapes"]
    assert twice["basis"]["kind"] == "profile" and twice["basis"]["work_ratio"] == 2.0
    assert (twice["gpu_seconds"], four_times["gpu_seconds"]) == (6.0, 12.0)
    assert twice["basis"]["profile"]["device"] == "cpu" and twice["basis"]["profile"]["shipped"] is False, \
        "the user's own profile takes the place of the one reelbatch ships for tiny"
    recorded = json.loads((world.settings.engine.cache_dir / "profiles.json").read_text())
    assert list(recorded) == ["tiny"], "the shipped profiles stay out of the user's file"
    assert e["gpu_seconds"] == 18.0 and e["cost"]["gpu_usd"] == 0.018
    assert e["storage_unknown_videos"] == 2 and twice["cost"]["storage_usd"] is None, "nothing of it stored yet"
    assert (e["cost"]["storage_usd"], e["cost"]["egress_usd"]) == (None, None), "unknown in the total too, not $0"


def test_with_nothing_known_there_is_no_number(world):
    # An operator's registration reelbatch ships no profile for (the built-ins have one: the test below).
    world.registry.models["mine"] = dataclasses.replace(TINY, name="mine", builtin=False)
    e = forecast(world, world.spec("u", videos("a", 3), model="mine"))
    (shape,) = e["shapes"]
    assert shape["basis"]["kind"] == "unknown" and shape["basis"]["gpu_seconds_per_video"] is None
    assert "no successful video of model mine" in shape["basis"]["reason"]
    assert (shape["gpu_seconds"], shape["cost_usd"]) == (None, None)
    assert (e["gpu_seconds"], e["cost_usd"], e["finish_s"], e["unknown_videos"]) == (None, None, None, 3)


def test_time_to_finish_counts_the_work_queued_ahead(world):
    history(world)
    world.submit("urgent", videos("u", 2, steps=2), priority=5)  # ahead of a priority-1 run: 2 x 15 s
    world.submit("later", videos("l", 2, steps=2))  # priority 0: behind it
    e = forecast(world, world.spec("b", videos("c", 4, steps=2), priority=1), workers=2)
    assert (e["queue_ahead_s"], e["gpu_seconds"], e["utilisation"]) == (30.0, 60.0, 0.75)
    assert e["finish_s"] == pytest.approx(60.0), "(30 + 60) GPU-s over 2 GPUs busy 75% of the time"


def invoke(world, *args):
    env = {"REELBATCH_DATABASE_URL": world.settings.database_url,
           "REELBATCH_CACHE_DIR": str(world.settings.engine.cache_dir),
           "REELBATCH_GPU_HOUR_USD": "3.6", "COLUMNS": "200"}
    return CliRunner().invoke(app, list(args), env=env)


def test_the_command_prints_the_estimate_and_writes_nothing(world):
    history(world)
    path = world.manifest("b", videos("c", 4, steps=2), max_cost_usd=0.05, deadline="PT1H")
    with world.factory() as s:
        before = s.scalar(select(func.count()).select_from(Run))
    result = invoke(world, "estimate", str(path), "--gpus", "2", "--json")
    assert result.exit_code == 0, result.output
    e = json.loads(result.output)
    assert {"videos", "gpu_seconds", "cost_usd", "finish_s"} <= set(e) and e["shapes"][0]["basis"]["kind"] == "measured"
    assert (e["videos"], e["gpu_seconds"], e["gpus"], e["gpus_source"]) == (4, 60.0, 2, "--gpus")
    assert e["finish_s"] == pytest.approx(40.0), "60 GPU-s over 2 GPUs busy 75% of the time"
    assert e["within_budget"] is False and e["max_cost_usd"] == 0.05, "$0.06 of GPU alone is over $0.05"
    assert e["meets_deadline"] is True
    with world.factory() as s:
        assert s.scalar(select(func.count()).select_from(Run)) == before, "nothing written"
    text = invoke(world, "estimate", str(path), "--gpus", "2")
    assert text.exit_code == 0 and "measured (4 videos, 1 runs)" in text.output and "OVER it" in text.output


def test_a_fresh_database_estimates_the_demo_from_the_shipped_profile_and_creates_nothing(tmp_path):
    """The README's demo on a new machine: no ledger, no bench run, yet a number, said to be reelbatch's own."""
    env = {"REELBATCH_DATABASE_URL": f"sqlite:///{tmp_path / 'none.db'}", "REELBATCH_CACHE_DIR": str(tmp_path),
           "REELBATCH_GPU_HOUR_USD": "3.6", "COLUMNS": "200"}
    demo = str(Path(__file__).resolve().parents[2] / "manifests" / "examples" / "demo.yaml")
    result = CliRunner().invoke(app, ["estimate", demo, "--json"], env=env)
    assert result.exit_code == 0, result.output
    e = json.loads(result.output)
    # The demo is 4 toy videos at toy's 32x32, 9 frames, 20 steps; one at guidance 6, the others at 2: both two
    # passes a step, so the same work as the shipped profile's shape (jobs/cost/shipped_profiles.json: 0.1074 s).
    assert [(sh["videos"], sh["guidance"]) for sh in e["shapes"]] == [(3, 2.0), (1, 6.0)]
    for sh in e["shapes"]:
        b = sh["basis"]
        assert (b["kind"], b["work_ratio"], b["profile"]["shipped"]) == ("profile", 1.0, True)
        assert b["gpu_seconds_per_video"] == 0.1074
    assert e["gpu_seconds"] == pytest.approx(4 * 0.1074) and e["unknown_videos"] == 0
    # $3.60 an hour is $0.001 a second: 3 x 0.1074 s is 322.2 micro-dollars and 0.1074 s 107.4, each shape's cost
    # in whole micro-dollars (322 + 107).
    assert e["cost"]["gpu_usd"] == 0.000429
    text = CliRunner().invoke(app, ["estimate", demo], env=env)
    assert text.exit_code == 0 and "shipped profile" in text.output and "cost unknown" not in text.output
    assert not (tmp_path / "none.db").exists() and list(tmp_path.iterdir()) == [], "nothing written"


def test_bad_input_exits_2_naming_file_line_field_and_value(tmp_path):
    manifest = tmp_path / "m.yaml"
    manifest.write_text("name: m\nmax_cost_usd: -3\nvideos:\n  - {id: a, prompt: p}\n")
    env = {"REELBATCH_DATABASE_URL": f"sqlite:///{tmp_path / 'none.db'}", "REELBATCH_CACHE_DIR": str(tmp_path)}
    result = CliRunner().invoke(app, ["estimate", str(manifest)], env=env)
    assert result.exit_code == 2
    assert f"{manifest}:2: max_cost_usd: must be more than 0 and at most 100000, got -3" in result.output
    result = CliRunner().invoke(app, ["estimate", str(manifest), "--set", "max_cost_usd=1", "--gpus", "0"], env=env)
    assert result.exit_code == 2 and "--gpus" in result.output
    assert not (tmp_path / "none.db").exists()
