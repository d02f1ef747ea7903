"""Every video checked (jobs.render.checks), through the real render path on a controlled clock (tests/jobs/clocked.py:
a 2-step batch renders in 20 s, an encode takes 5 s, one second costs 1000 micro-dollars).

The deterministic trigger: `toy-strict`, the toy folder registered through a models file with `checks: {min_motion:
1000}`, so every render fails the motion check (a frame's mean luma change cannot pass 255). Normal `toy` renders,
held to the defaults, are not flagged.
"""

import json

import pytest
from sqlalchemy import select
from typer.testing import CliRunner

from engine.errors import ModelNotFound
from engine.models.file import load_registry
from engine.models.registry import TOY_WEIGHTS, Registry
from jobs.cli import app
from jobs.db.rows import CostRecord, Run, Video
from jobs.db.status import Status
from jobs.manifest import ManifestError, load_manifest
from jobs.render.checks import next_seed

from .clocked import make_world

pytestmark = pytest.mark.skipif("toy" not in Registry().models, reason="the toy model's weights are not in place")

STRICT = f"""toy-strict:
  path: {TOY_WEIGHTS}
  max_frames: 9
  chunk_condition: clean
  defaults: {{width: 32, height: 32, fps: 8, duration_s: 1.0, steps: 2, guidance: 2.0}}
  checks: {{min_motion: 1000}}
"""


@pytest.fixture
def world(tmp_path, db_url, model_cache, monkeypatch):
    models = tmp_path / "models.yaml"
    models.write_text(STRICT)
    return make_world(tmp_path, db_url, model_cache, load_registry(models), monkeypatch)


def rows(world, run: str):
    with world.factory() as s:
        run_id = s.scalar(select(Run.id).where(Run.name == run))
        videos = list(s.scalars(select(Video).where(Video.run_id == run_id).order_by(Video.id)))
        costs = [(c.video_id, c.kind, c.amount_micro_usd) for c in
                 s.scalars(select(CostRecord).where(CostRecord.video_id.in_([v.id for v in videos]))
                           .order_by(CostRecord.id))]
    return videos, costs


def cli(world, tmp_path, *args):
    env = {"REELBATCH_DATABASE_URL": world.settings.database_url, "REELBATCH_REPORT_SQL": "0",
           "REELBATCH_BROKER_URL": f"sqla+sqlite:///{tmp_path / 'broker.db'}", "COLUMNS": "200"}
    result = CliRunner().invoke(app, list(args), env=env)
    assert result.exit_code == 0, result.output
    return result.output


def strict_videos(n: int) -> list[dict]:
    return [{"id": f"v{i}", "prompt": f"a red circle moving {d} on a gray background", "seed": 500 + i}
            for i, d in zip(range(n), ("left", "right"))]


def test_flag_stores_the_video_marks_it_and_report_results_and_status_show_it(world, tmp_path):
    world.submit("flagged", strict_videos(2), model="toy-strict")
    result = world.render()
    assert (result.claimed, result.succeeded, result.retried, result.failed) == (2, 2, 0, 0)
    videos, costs = rows(world, "flagged")
    for v in videos:
        assert Status(v.status) is Status.SUCCEEDED and v.flagged and v.uri is not None
        checks = json.loads(v.checks)
        assert (checks["seed"], checks["passed"]) == (v.seed, False)
        assert checks["motion"]["limit"] == 1000.0 and not checks["motion"]["passed"]
        assert [name for name in ("blank", "frozen", "flicker") if checks[name]["passed"]] == ["blank", "frozen",
                                                                                               "flicker"]
        assert v.checks_s > 0
    # Stored as usual: the batch's 20 s render shared, each encode 5 s (the checks run off the clock).
    assert [(kind, micro) for _, kind, micro in costs if kind == "gpu"] == [("gpu", 15_000), ("gpu", 15_000)]

    # results.jsonl, written when the run finished, carries each video's checks.
    results = [json.loads(line) for line in
               (world.folder / "out" / "flagged" / "results.jsonl").read_text().splitlines()]
    assert [(r["id"], r["flagged"], r["checks"]["motion"]["passed"]) for r in results] == [("v0", True, False),
                                                                                           ("v1", True, False)]
    report = json.loads(cli(world, tmp_path, "report", "flagged", "--json"))
    assert report["checks"] == {"on_fail": "flag", "flagged": 2}
    assert [v["flagged"] for v in report["videos"]] == [True, True]
    text = cli(world, tmp_path, "report", "flagged")
    motion = json.loads(videos[0].checks)["motion"]["value"]
    assert f"FLAGGED v0: motion {motion:.3g} < 1000" in text
    assert "2 succeeded; 2 flagged by their checks (on_fail: flag)" in text
    status = json.loads(cli(world, tmp_path, "status", "flagged", "--json"))["runs"][0]
    assert (status["counts"]["succeeded"], status["flagged"]) == (2, 2)
    html_file = tmp_path / "r.html"
    cli(world, tmp_path, "report", "flagged", "--html", str(html_file))
    page = html_file.read_text()
    flagged_section = page.split('<section id="flagged">')[1].split("</section>")[0]
    assert flagged_section.count('src="data:image/jpeg;base64,') == 2, "both flagged, with their posters"
    assert "flagged: motion" in flagged_section


def test_fail_fails_the_video_with_the_checks_reason_and_charges_its_render(world):
    world.submit("failing", strict_videos(1), model="toy-strict", checks={"on_fail": "fail"})
    result = world.render()
    assert (result.claimed, result.succeeded, result.retried, result.failed) == (1, 0, 0, 1)
    (v,), costs = rows(world, "failing")
    assert Status(v.status) is Status.FAILED and v.flagged and v.uri is None and v.attempts == 1
    assert v.last_error.startswith("checks failed: motion ") and v.last_error.endswith(" < 1000")
    assert json.loads(v.checks)["passed"] is False
    # Its 20 s render, charged as an attempt that stored nothing; no encode.
    assert [(kind, micro) for _, kind, micro in costs] == [("retry", 20_000)]
    assert not (world.folder / "out" / "failing" / "v0.mp4").exists()
    errors = (world.folder / "out" / "failing" / "errors.jsonl").read_text()
    assert json.loads(errors)["code"] == "checks failed"


def test_retry_renders_again_once_with_the_next_seed_then_stores_and_flags(world):
    world.submit("retrying", strict_videos(1), model="toy-strict", checks={"on_fail": "retry"})
    first = world.render()
    assert (first.claimed, first.succeeded, first.retried) == (1, 0, 1)
    (v,), _ = rows(world, "retrying")
    assert (Status(v.status), v.seed, v.flagged) == (Status.PENDING, 501, False)
    assert next_seed(500) == 501 and next_seed(2**63 - 1) == 0
    second = world.render()
    assert (second.claimed, second.succeeded, second.retried) == (1, 1, 0), "retried once only"
    (v,), costs = rows(world, "retrying")
    assert Status(v.status) is Status.SUCCEEDED and v.flagged and v.attempts == 2 and v.seed == 501
    checks = json.loads(v.checks)
    assert (checks["seed"], checks["passed"]) == (501, False)
    assert [(e["seed"], e["passed"]) for e in checks["earlier"]] == [(500, False)]
    # Both attempts charged: the first's 20 s render as a retry, the second's render and encode.
    assert [(kind, micro) for _, kind, micro in costs if kind != "storage"] == [("retry", 20_000), ("gpu", 25_000)]


def test_normal_toy_and_toy_fast_renders_are_not_flagged(tmp_path, model_cache, registry, monkeypatch):
    """4 videos of each (docs/QUALITY.md has 80 of each): 4 of the 80 prompts, at seeds neither the quality set
    (7000-7079) nor the docs' measurement (31000-31079) used."""
    if "toy-fast" not in registry:
        pytest.skip("toy-fast's weights are not in place")
    # One database is enough here (the rows are written as in the tests above); the time limit is the render's own.
    # toy-fast's gate is test_toy_fast's; here, renders.
    world = make_world(tmp_path, f"sqlite:///{tmp_path / 'n.db'}", model_cache, registry, monkeypatch,
                       worker__max_batch=4, limits__min_time_limit_s=900.0, measuring=("toy-fast",))
    prompts = ["a red circle moving left on a black background", "a green square moving up on a gray background",
               "a blue square moving right on a gray background", "a white circle moving down on a black background"]
    for model in ("toy", "toy-fast"):
        world.submit(model, [{"id": f"n{i}", "prompt": p, "seed": 42_000 + i} for i, p in enumerate(prompts)],
                     model=model)
        result = world.render()
        assert (result.claimed, result.succeeded) == (4, 4)
        videos, _ = rows(world, model)
        assert [v.flagged for v in videos] == [False] * 4
        assert all(json.loads(v.checks)["passed"] for v in videos)


def test_a_long_video_whose_seam_jumps_past_its_limit_is_flagged_not_retried(tmp_path, model_cache, monkeypatch):
    """seam_jump through the real render path: a long toy video (2 s, 17 frames: 3 chunks, seams at frames 9 and 15)
    held to `max_seam_jump: 0`, so any seam that moves at all is over it. Under on_fail: retry it is stored and
    flagged, not rendered again (its chunks would all be), and seam_jump is the check that failed. Normal long toy
    videos read 0.77-2.30 (docs/LONG_VIDEOS.md, held out): under the default 3, as test_long's four are."""
    models = tmp_path / "models.yaml"
    models.write_text(STRICT.replace("{min_motion: 1000}", "{max_seam_jump: 0}"))
    world = make_world(tmp_path, f"sqlite:///{tmp_path / 's.db'}", model_cache, load_registry(models), monkeypatch)
    world.submit("seams", [{"id": "long", "prompt": "a yellow circle moving right on a black background",
                            "seed": 500, "duration_s": 2, "steps": 20}],
                 model="toy-strict", checks={"on_fail": "retry"})
    assert world.render_all() == 3, "one batch a chunk"
    (v,), _ = rows(world, "seams")
    assert Status(v.status) is Status.SUCCEEDED and (v.chunks, v.frames) == (3, 17)
    assert v.flagged and v.seed == 500, "flagged, not retried with the next seed"
    checks = json.loads(v.checks)
    assert [name for name, c in checks.items() if isinstance(c, dict) and not c["passed"]] == ["seam_jump"]
    assert checks["seam_jump"]["limit"] == 0.0 and checks["seam_jump"]["value"] > 0
    assert "earlier" not in checks


def test_on_fail_is_validated_like_every_manifest_field(tmp_path, registry):
    path = tmp_path / "m.yaml"
    path.write_text("name: m\nchecks:\n  on_fail: skip\n  when: always\nvideos:\n  - {id: a, prompt: p}\n")
    with pytest.raises(ManifestError) as caught:
        load_manifest(path, registry=registry)
    assert str(caught.value) == (f"{path}:3: checks.on_fail: must be one of flag, retry, fail, got 'skip'\n"
                                 f"{path}:4: checks.when: unknown field 'when' (checks has: on_fail)")
    path.write_text("name: m\nchecks: retry\nvideos:\n  - {id: a, prompt: p}\n")
    with pytest.raises(ManifestError, match=r"m.yaml:2: checks: must be a mapping such as \{on_fail: flag\}, got "
                                            r"'retry'"):
        load_manifest(path, registry=registry)
    path.write_text("name: m\nvideos:\n  - {id: a, prompt: p}\n")
    assert load_manifest(path, registry=registry).on_fail == "flag"
    assert load_manifest(path, registry=registry, sets=["checks.on_fail=retry"]).on_fail == "retry"
    with pytest.raises(ManifestError, match=r"^--set: 'checks.on_fail=maybe': must be one of flag, retry, "
                                            r"fail, got 'maybe'"):
        load_manifest(path, registry=registry, sets=["checks.on_fail=maybe"])
    # The same videos with another on_fail are another run.
    assert load_manifest(path, registry=registry).content_sha256 != \
        load_manifest(path, registry=registry, sets=["checks.on_fail=fail"]).content_sha256


def test_check_limits_in_the_models_file_are_validated(tmp_path):
    models = tmp_path / "models.yaml"
    for checks, message in [
        ("{min_motion: -1}", "checks.min_motion must be a finite number of at least 0, got -1"),
        ("{max_flicker: .nan}", "checks.max_flicker must be a finite number of at least 0, got nan"),
        ("[1, 2]", "checks must be a mapping of limits"),
    ]:
        models.write_text(STRICT.replace("{min_motion: 1000}", checks))
        with pytest.raises(ModelNotFound) as caught:
            load_registry(models)
        assert str(caught.value).startswith(f"{models}: model 'toy-strict': {message}"), str(caught.value)
