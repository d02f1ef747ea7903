"""`reelbatch toy tune-decoder`: the light decoder's colour term, and a short tune of toy-fast's decoder written,
loaded and judged on a held-out draw whose gate is recorded for the tuned files."""

import json
import os
import subprocess
import sys

import pytest
import torch

from engine.adapters import light_decoder
from engine.levers import gates
from engine.models.registry import TOY_FAST_WEIGHTS
from toyworld.distill_config import DistillConfig
from toyworld.distill_decoder import decoder_loss


def test_the_colour_term_weighs_every_pixels_block_colour():
    # Two frames of 4x4, every pixel 0.5 in the VAE's output, 0 in the decoder's: one 4x4 block per frame and
    # channel, mean 0.5 against 0. The object weight is 1 everywhere (no pixel differs from the median), so the
    # per-pixel term is (0 - 0.5)^2 = 0.25; nothing changes between frames, so the temporal term is 0; the colour
    # term is its weight times the blocks' squared error, 8 x 0.25 = 2.
    want = torch.full((1, 3, 2, 4, 4), 0.5)
    out = torch.zeros_like(want)
    assert decoder_loss(out, want, DistillConfig()).item() == pytest.approx(0.25 + 2.0)
    assert decoder_loss(out, want, DistillConfig(decoder_colour_weight=0.0)).item() == pytest.approx(0.25)
    # Noise that averages out within each block costs the per-pixel term only.
    checker = torch.tensor([[0.1, -0.1, 0.1, -0.1], [-0.1, 0.1, -0.1, 0.1]] * 2).expand(1, 3, 2, 4, 4)
    assert decoder_loss(want + checker, want, DistillConfig()).item() == pytest.approx(0.01)


def test_a_short_tune_writes_a_decoder_that_loads_and_is_judged_on_held_out_seeds(tmp_path, monkeypatch):
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("REELBATCH_")},
           "REELBATCH_CACHE_DIR": str(tmp_path / "cache")}
    out = tmp_path / "decoder"
    proc = subprocess.run([sys.executable, "-m", "jobs", "toy", "tune-decoder", "--steps", "2", "--pairs", "16",
                           "--out", str(out), "--no-evaluate"], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "tune-decoder 2/2: loss" in proc.stdout and f"saved to {out}" in proc.stdout
    tuned, shipped = light_decoder.load(out), light_decoder.load(TOY_FAST_WEIGHTS / "decoder")
    assert tuned.config == shipped.config
    changed = [k for k, v in tuned.state_dict().items() if not torch.equal(v, shipped.state_dict()[k])]
    assert changed, "two steps of AdamW at 1e-3 move the weights"

    from jobs.quality.distilled import judge_decoder
    from jobs.settings import Settings

    monkeypatch.setenv("REELBATCH_CACHE_DIR", str(tmp_path / "cache"))
    gate = judge_decoder(Settings.from_env(), "toy-fast", out, count=4, entropy=7)
    assert (gate.model, gate.teacher, gate.count, gate.sample) == ("toy-fast", "toy", 4,
                                                                   "toy held-out draw, entropy 7")
    assert set(gate.adherence) == {"colour", "shape", "direction", "background", "all_four", "clean_background"}
    recorded = json.loads((tmp_path / "cache" / gates.GATES_FILE).read_text())
    assert [g["count"] for g in recorded.values()] == [4] and not gate.releases  # 4 is under MIN_SAMPLE's 32


def test_only_a_distilled_model_with_a_light_decoder_is_tuned(tmp_path):
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("REELBATCH_")},
           "REELBATCH_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.run([sys.executable, "-m", "jobs", "toy", "tune-decoder", "--model", "toy", "--out",
                           str(tmp_path / "d")], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert proc.returncode == 2 and "--model: 'toy' is not a registered distilled model" in proc.stderr
    assert not (tmp_path / "d").exists()
