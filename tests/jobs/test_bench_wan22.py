"""`reelbatch bench`'s Wan 2.2 presets (issue 22): accepted by the command, and each builds its architecture with
the preset's shape on that architecture's grid. Built on the meta device (diffusers' real classes and configs, no
memory, no weights), so it is fast; the presets' runs themselves are measurements (docs/PERFORMANCE.md)."""

import os
import subprocess
import sys

import pytest

from jobs.bench import models as bench_models
from jobs.bench.presets import PRESETS

# preset -> (hidden width, ffn width, blocks per transformer, latent channels, two experts, the grid sides must be
# on): the published configs (jobs/bench/models.py cites them), by hand.
EXPECTED = {
    "a14b": (5120, 13824, 40, 16, True, 16),
    "ti2v": (3072, 14336, 30, 48, False, 32),
    "a14b-cpu": (5120, 13824, 1, 16, True, 16),
    "ti2v-cpu": (3072, 14336, 2, 48, False, 32),
}


@pytest.mark.parametrize("name", list(EXPECTED))
def test_a_wan22_preset_builds_its_architecture_and_its_shape_fits(name):
    preset = PRESETS[name]
    hidden, ffn, blocks, channels, two, grid = EXPECTED[name]
    pipe = bench_models.BUILDERS[preset.model](device="meta")
    experts = [pipe.transformer] + ([pipe.transformer_2] if two else [])
    assert (pipe.transformer_2 is not None) == two
    for t in experts:
        c = t.config
        assert (c.num_attention_heads * c.attention_head_dim, c.ffn_dim, c.num_layers, c.in_channels) == \
            (hidden, ffn, blocks, channels)
    assert pipe.config.boundary_ratio == (0.875 if two else None)
    assert bool(pipe.config.expand_timesteps) == (not two)
    assert pipe.vae_scale_factor_spatial * 2 == grid
    assert preset.width % grid == 0 and preset.height % grid == 0 and (preset.frames - 1) % 4 == 0
    assert preset.guidance_2 == (3.0 if two else None)


def test_the_command_offers_the_wan22_presets(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("REELBATCH_")}
    proc = subprocess.run([sys.executable, "-m", "jobs", "bench", "--preset", "a14b-gpu"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "--preset: 'a14b-gpu' is not a preset (choose from" in proc.stderr
    assert "a14b, ti2v, a14b-cpu, ti2v-cpu" in proc.stderr
