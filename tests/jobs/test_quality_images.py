"""Videos from pictures, judged: the image set, `reelbatch toy first-frame`, `quality --images` and `toy sheet
--images` through the real CLI and engine, and the shipped `toy-i2v` against its targets."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from engine.engine import Engine
from engine.frames.metrics import psnr
from engine.levers.config import EngineConfig
from engine.models.file import load_registry
from engine.models.registry import TOY, TOY_WEIGHTS, builtin_models
from engine.types import RenderBatch, RenderRequest, Shape
from jobs.quality.evaluate import round_trip
from jobs.quality.images import IMAGE_TARGETS, image_set
from toyworld.judge import judge_clip
from toyworld.world import parse_prompt

REPO = Path(__file__).resolve().parents[2]


def cli(cwd: Path, model_cache: Path, *args: str, models: Path | None = None) -> subprocess.CompletedProcess:
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("REELBATCH_")},
           "REELBATCH_CACHE_DIR": str(model_cache)}
    if models:
        env["REELBATCH_MODELS"] = str(models)
    return subprocess.run([sys.executable, "-m", "jobs", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=900)


@pytest.fixture(scope="module")
def quick_i2v(tmp_path_factory, model_cache):
    """`reelbatch toy first-frame --quick` from the shipped toy, registered as `ff-quick` over toy's folder."""
    root = tmp_path_factory.mktemp("quick-i2v")
    proc = cli(root, model_cache, "toy", "first-frame", "--quick", "--no-evaluate", "--out", str(root / "out"),
               "--work", str(root / "work"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    d = TOY.defaults
    models = root / "models.yaml"
    models.write_text(
        f"ff-quick:\n  path: {root / 'out'}\n  base: {TOY_WEIGHTS}\n  image_condition: first_frame\n"
        f"  defaults: {{width: {d.width}, height: {d.height}, fps: {d.fps}, duration_s: {d.duration_s}, "
        f"steps: {d.steps}, guidance: {d.guidance}}}\n  temporal_factor: {TOY.temporal_factor}\n"
        f"  max_frames: {TOY.max_frames}\n  max_sequence_length: {TOY.max_sequence_length}\n"
        f"  chunk_condition: {TOY.chunk_condition}\n")
    return root, models


def test_the_image_set_is_pictures_of_the_toy_world_that_match_their_prompts():
    cases = image_set(32, 32)
    assert len(cases) == 80 and len({c.prompt for c in cases}) == 80  # the issue asks for at least 40
    assert len({c.image.tobytes() for c in cases}) == 80 and len({c.seed for c in cases}) == 80
    for case in cases:
        assert case.image.shape == (32, 32, 3) and case.image.dtype == np.uint8
        verdict = judge_clip(case.image[None])
        wanted = parse_prompt(case.prompt)
        assert (verdict.colour, verdict.shape, verdict.background) == \
            (wanted["colour"], wanted["shape"], wanted["background"]), case.prompt
    # The same triples every time: a fixed set, as the quality set is.
    assert all(np.array_equal(a.image, b.image) for a, b in zip(cases, image_set(32, 32)))


def test_the_fine_tune_writes_only_its_transformer_and_resumes_as_a_no_op(quick_i2v, model_cache):
    root, _ = quick_i2v
    assert sorted(p.name for p in (root / "out").iterdir()) == ["base.json", "transformer"]
    weights = root / "out" / "transformer" / "diffusion_pytorch_model.safetensors"
    before = weights.read_bytes()
    proc = cli(root, model_cache, "toy", "first-frame", "--quick", "--no-evaluate", "--out", str(root / "out"),
               "--work", str(root / "work"))
    assert proc.returncode == 0 and weights.read_bytes() == before, "a finished stage is not trained again"


def test_quality_images_judges_first_frames_and_gates(quick_i2v, model_cache, tmp_path):
    _, models = quick_i2v
    proc = cli(tmp_path, model_cache, "quality", "--images", "--model", "ff-quick", "--count", "16", "--json",
               models=models)
    report = json.loads(proc.stdout)
    assert report["count"] == 16 and report["targets"] == IMAGE_TARGETS
    assert set(report["adherence"]) == {"colour", "shape", "direction", "background", "kept"}
    # However briefly trained, every video starts from its picture: frame 0 is the picture's VAE round trip.
    first = report["first_frame"]
    assert first["psnr_db_min"] >= 25.0 and first["vs_image_psnr_db_mean"] < first["psnr_db_mean"], first
    assert proc.returncode == (0 if report["passed"] else 1)
    text = cli(tmp_path, model_cache, "quality", "--images", "--model", "ff-quick", "--count", "16", models=models)
    assert "frame 0 against the picture after the VAE round trip" in text.stdout and "kept" in text.stdout


def test_quality_images_refuses_a_model_that_takes_none(tmp_path, model_cache):
    proc = cli(tmp_path, model_cache, "quality", "--images", "--model", "toy")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "--model: 'toy' does not take images (models that do: " in proc.stderr


def test_the_image_contact_sheet_shows_the_picture_then_the_decoded_frames(quick_i2v, model_cache, tmp_path):
    _, models = quick_i2v
    proc = cli(tmp_path, model_cache, "toy", "sheet", "--images", "--model", "ff-quick", "--out", "sheet.png",
               "--scale", "1", models=models)
    assert proc.returncode == 0, proc.stderr
    sheet = np.asarray(Image.open(tmp_path / "sheet.png").convert("RGB"))
    size, frames, label, gap, lead = 32, 9, 14, 2, 32 + 8
    assert sheet.shape == (8 * (label + size + gap), lead + frames * (size + gap) - gap, 3)
    cases = [image_set(32, 32, 16)[i] for i in (0, 1, 2, 3, 12, 13, 14, 15)]
    engine = Engine(EngineConfig(cache_dir=model_cache), load_registry(models))
    shape = Shape("ff-quick", size, size, frames, 20, TOY.defaults.guidance)
    rendered = engine.render(RenderBatch(shape, tuple(RenderRequest(i, c.prompt, None, c.seed, image=c.image)
                                                      for i, c in enumerate(cases))))
    for row, (case, video) in enumerate(zip(cases, rendered)):
        top = row * (label + size + gap) + label
        assert np.array_equal(sheet[top : top + size, :size], case.image), f"row {row}: the given picture"
        tiles = np.stack([sheet[top : top + size, lead + t * (size + gap) : lead + t * (size + gap) + size]
                          for t in range(frames)])
        # libx264 does not always give the same bytes for the same frames on this machine (two encodes of one
        # video measured as close as 38.6 dB), so the decoded MP4s are compared by PSNR; another video is < 20 dB.
        assert psnr(tiles, round_trip(video.frames, 8)) >= 30, f"row {row}: the decoded MP4"


@pytest.mark.skipif("toy-i2v" not in builtin_models(), reason="engine/models/toy-i2v holds no transformer")
def test_the_shipped_toy_i2v_meets_the_targets_less_ten_points(tmp_path, model_cache):
    """The committed `toy-i2v` on 16 triples of the image set (every attribute value), judged after MP4."""
    proc = cli(tmp_path, model_cache, "quality", "--images", "--count", "16", "--json")
    report = json.loads(proc.stdout)
    assert report["model"] == "toy-i2v" and report["count"] == 16
    assert report["first_frame"]["psnr_db_min"] >= IMAGE_TARGETS["first_frame_psnr_db"], report["first_frame"]
    for name in ("kept", "background"):
        assert report["adherence"][name] >= IMAGE_TARGETS[name] - 0.10, report["adherence"]
