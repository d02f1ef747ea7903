"""The committed `toy` model through `reelbatch quality` and `reelbatch toy sheet`: real CLI, real engine, MP4s
decoded and judged from their pixels."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from engine.models import TOY
from engine.toy.judge import judge_clip
from jobs.quality import TARGETS

REPO = Path(__file__).resolve().parents[2]


def reelbatch(*args, cwd, env=None):
    return subprocess.run([sys.executable, "-m", "jobs", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=600, env=env)


@pytest.fixture
def env(tmp_path):
    return {**{k: v for k, v in os.environ.items() if not k.startswith("REELBATCH_")},
            "REELBATCH_CACHE_DIR": str(tmp_path / "cache")}


def test_a_reduced_quality_set_meets_the_targets_less_ten_points_and_matches_the_references(tmp_path, env):
    proc = reelbatch("quality", "--count", "16", "--json", cwd=tmp_path, env=env)
    report = json.loads(proc.stdout)
    assert report["count"] == 16 and report["model"] == "toy"
    for name, target in TARGETS.items():
        assert report["adherence"][name] >= target - 0.10, (name, report["adherence"])
    ref = report["reference"]
    assert ref["available"] and ref["matches"] and ref["psnr_db_min"] >= 40.0, ref
    assert report["shape"] == {"width": 48, "height": 48, "frames": 9, "steps": 20, "guidance": 5.0, "fps": 8}
    assert proc.returncode == (0 if report["passed"] else 1)


def test_quality_with_other_settings_says_there_is_nothing_to_compare(tmp_path, env):
    proc = reelbatch("quality", "--count", "16", "--steps", "4", cwd=tmp_path, env=env)
    assert "no reference comparison: references are 48x48, 9 frames, 20 steps" in proc.stdout
    assert "colour" in proc.stdout and "shape" in proc.stdout


def test_quality_refuses_an_unknown_model(tmp_path, env):
    proc = reelbatch("quality", "--model", "nope", cwd=tmp_path, env=env)
    assert proc.returncode == 2 and "'nope' is not registered" in proc.stderr and "Traceback" not in proc.stderr


def test_the_contact_sheet_shows_each_prompt_as_rendered(tmp_path, env):
    prompts = ["a green circle moving down on a gray background", "a white square moving left on a black background"]
    proc = reelbatch("toy", "sheet", "--out", "sheet.png", "--scale", "1", *sum((["--prompt", p] for p in prompts), []),
                     cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    sheet = np.asarray(Image.open(tmp_path / "sheet.png").convert("RGB"))
    size, frames, label, gap = TOY.defaults.width, 9, 14, 2
    assert sheet.shape == (2 * (label + size + gap), frames * (size + gap) - gap, 3)
    for row, prompt in enumerate(prompts):
        top = row * (label + size + gap) + label
        clip = np.stack([sheet[top : top + size, t * (size + gap) : t * (size + gap) + size] for t in range(frames)])
        agree = judge_clip(clip).matches(prompt)
        assert agree["colour"] and agree["background"] and agree["direction"], (prompt, agree)


def test_the_vae_alone_reconstructs_every_attribute(tmp_path):
    from engine.config import EngineConfig
    from engine.engine import Engine
    from engine.models import Registry
    from engine.types import Shape
    from jobs.toy_card import vae_adherence

    pipe = Engine(EngineConfig(cache_dir=tmp_path), Registry()).pipeline("toy")
    d = TOY.defaults
    scores = vae_adherence(pipe.vae, Shape("toy", d.width, d.height, 9, d.steps, d.guidance), d.fps)
    assert all(scores[name] >= 0.95 for name in ("colour", "shape", "direction", "background")), scores
