"""Gates on the user's own prompts and model: `reelbatch bench quality --model M --prompts FILE` on a Wan model at
tiny widths registered through a models file, a distilled registration judged by reference-free measures and a CLIP
score from a small CLIP folder built here (random weights: the plumbing; no hub), and what `run` then accepts."""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from engine.levers import gate_rules, gates
from engine.models.file import load_registry
from engine.models.tiny import ensure_tiny
from jobs.quality.gate_sample import SHIPPED, gate_sample


def cli(args, cwd, env, timeout=900):
    return subprocess.run([sys.executable, "-m", "jobs", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


def build_clip(folder, seed: int = 2) -> None:
    """A CLIP folder as transformers saves one, at tiny widths with random weights, and a byte-level tokenizer
    built here (every byte a token, no merges)."""
    import torch
    from tokenizers import pre_tokenizers
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPProcessor, CLIPTokenizer

    chars = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {t: i for i, t in enumerate(["<|startoftext|>", "<|endoftext|>"] + chars + [c + "</w>" for c in chars])}
    config = CLIPConfig(
        text_config=dict(vocab_size=len(vocab), hidden_size=32, intermediate_size=37, num_hidden_layers=2,
                         num_attention_heads=4, max_position_embeddings=77, bos_token_id=0, eos_token_id=1,
                         pad_token_id=1),
        vision_config=dict(hidden_size=32, intermediate_size=37, num_hidden_layers=2, num_attention_heads=4,
                           image_size=32, patch_size=8),
        projection_dim=16)
    torch.manual_seed(seed)
    CLIPModel(config).save_pretrained(folder)
    CLIPProcessor(image_processor=CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}),
                  tokenizer=CLIPTokenizer(vocab=vocab, merges=[])).save_pretrained(folder)


@pytest.fixture
def mine(tmp_path, model_cache):
    """`mine`: the tiny Wan folder (copied: its own files) registered through a models file, at 32x32, 5 frames and
    4 steps; `mine-fast`: the same folder with a 2-step Euler sampler at guidance 1, teacher `mine`, with a CLIP
    folder."""
    folder = tmp_path / "mine"
    shutil.copytree(ensure_tiny(model_cache), folder)
    build_clip(tmp_path / "clip")
    models = tmp_path / "models.yaml"
    models.write_text(f"mine:\n  path: {folder}\n  max_sequence_length: 64\n"
                      "  defaults: {width: 32, height: 32, fps: 8, duration_s: 0.5, steps: 4, guidance: 5.0}\n"
                      f"mine-fast:\n  path: {folder}\n  max_sequence_length: 64\n  teacher: mine\n"
                      f"  clip: {tmp_path / 'clip'}\n  sampler: {{name: flow_euler, shift: 3.0}}\n"
                      "  defaults: {steps: 2, guidance: 1.0}\n")
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("REELBATCH_")},
           "REELBATCH_CACHE_DIR": str(tmp_path / "cache"), "REELBATCH_MODELS": str(models)}
    return models, env


def write_prompts(path) -> None:
    # Two shapes; the last video names no seed (it gets the one a run named `prompts` derives for its id).
    lines = [{"id": "a", "prompt": "a lighthouse in a storm", "seed": 11, "resolution": "32x32", "steps": 2,
              "duration_s": 0.5},
             {"id": "b", "prompt": "a cat on a sofa", "seed": 12, "resolution": "32x32", "steps": 2,
              "duration_s": 0.5},
             {"id": "c", "prompt": "fireworks over a harbour", "seed": 13, "resolution": "48x32", "steps": 2,
              "duration_s": 0.5},
             {"id": "d", "prompt": "a horse in a field", "resolution": "48x32", "steps": 2, "duration_s": 0.5}]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")


def test_a_model_outside_the_toy_world_uses_the_shipped_prompts_at_its_defaults(mine):
    models, _ = mine
    sample = gate_sample(load_registry(models), "mine", prompts=None, count=80)
    assert sample.label == SHIPPED and len(sample) == 36 and not sample.judged
    assert {(i.shape.width, i.shape.height, i.shape.frames, i.shape.steps, i.shape.guidance) for i in sample.items} \
        == {(32, 32, 5, 4, 5.0)}  # its registration's defaults: 0.5 s at 8 fps is 4 frames, on Wan's 4k+1 grid 5
    assert sample.items[0].case.seed == 31000 and sample.items[35].case.seed == 31035


def test_a_gate_from_the_users_manifest_is_recorded_and_under_32_videos_releases_nothing(tmp_path, mine):
    _, env = mine
    prompts = tmp_path / "prompts.jsonl"
    write_prompts(prompts)
    proc = cli(["bench", "quality", "--model", "mine", "--prompts", str(prompts), "--setting", "step_cache=1e-6",
                "--batch", "2", "--json"], tmp_path, env)
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout)
    assert (r["sample"], r["count"], r["shape"]["shapes"], r["exact"]["adherence"]) == (str(prompts), 4, 2, {})
    (g,) = r["settings"]
    # A threshold no step passes changes nothing: every video the same as exact mode's.
    assert g["passed"] and g["psnr_db_min"] == 100.0 and g["ssim_min"] == pytest.approx(1.0) and not g["releases"]
    assert r["released"] == []
    (recorded,) = gates.load(tmp_path / "cache").values()
    assert recorded["count"] == 4 and recorded["sample"] == str(prompts)

    manifest = tmp_path / "one.yaml"
    manifest.write_text("name: one\nmodel: mine\nvideos:\n  - {id: a, prompt: a cat, resolution: 32x32}\n")
    for command in ("run", "submit"):
        refused = cli([command, str(manifest)], tmp_path, {**env, "REELBATCH_STEP_CACHE": "1e-6"})
        assert refused.returncode == 2, refused.stderr
        assert "lossy setting step_cache=1e-06's quality gate for model 'mine' passed on 4 videos, under the 32" \
            in refused.stderr
        assert "REELBATCH_STEP_CACHE" in refused.stderr
    sage = cli(["run", str(manifest)], tmp_path, {**env, "REELBATCH_ATTENTION": "sage"})
    assert sage.returncode == 2 and "lossy setting attention=sage has no recorded quality gate for model 'mine'" \
        in sage.stderr, sage.stderr
    assert not (tmp_path / "reelbatch.db").exists(), "nothing written"

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "prompt": "x", "steps": 0}\n', encoding="utf-8")
    proc = cli(["bench", "quality", "--model", "mine", "--prompts", str(bad)], tmp_path, env)
    assert proc.returncode == 2 and f"{bad}:1: steps" in proc.stderr, proc.stderr


def test_a_distilled_registration_is_judged_by_motion_frames_and_clip_against_its_teacher(tmp_path, mine):
    _, env = mine
    prompts = tmp_path / "prompts.jsonl"
    write_prompts(prompts)
    proc = cli(["bench", "quality", "--model", "mine-fast", "--prompts", str(prompts), "--batch", "2", "--json"],
               tmp_path, env)
    assert proc.returncode == 0, proc.stderr
    g = json.loads(proc.stdout)["gate"]
    assert (g["model"], g["teacher"], g["setting"], g["count"], g["sample"]) == \
        ("mine-fast", "mine", "distilled", 4, str(prompts))
    assert g["adherence"] == {} and g["exact_adherence"] == {}  # no toy judge outside the toy world
    # Random weights draw noise: both sides flicker and move, nothing is blank or frozen.
    assert g["flicker"] > 0 and g["teacher_flicker"] > 0 and g["motion"] > 0 and g["teacher_motion"] > 0
    assert g["blank_frames"] == g["teacher_blank_frames"] == 0 and g["frozen_videos"] == g["teacher_frozen_videos"] == 0
    assert 0 <= g["clip_score"] <= 100 and 0 <= g["teacher_clip_score"] <= 100
    clip_failed = any("CLIP score" in f for f in g["failures"])
    assert clip_failed == (g["clip_score"] < g["teacher_clip_score"] - gate_rules.CLIP_MARGIN)
    assert not g["releases"]  # 4 videos
    manifest = tmp_path / "fast.yaml"
    manifest.write_text("name: fast\nmodel: mine-fast\nvideos:\n  - {id: a, prompt: a cat, resolution: 32x32}\n")
    refused = cli(["submit", str(manifest)], tmp_path, env)
    assert refused.returncode == 2 and f"{manifest}: model 'mine-fast'" in refused.stderr, refused.stderr


def test_clip_score_floors_each_frame_at_zero_and_averages(tmp_path):
    """The CLIP folder of build_clip(seed 2) puts frame 0 of this noise video at cosine -0.0223 and frame 4 at
    +0.0162 to "a red circle" (measured once): each frame's score is max(100 cos, 0), so their mean is 0.81."""
    from engine.frames.clip_score import ClipScorer

    build_clip(tmp_path / "clip")
    video = np.random.default_rng(0).integers(0, 256, (5, 32, 32, 3), dtype=np.uint8)
    scorer = ClipScorer(tmp_path / "clip")
    assert scorer.video("a red circle", video[[0, 4]]) == pytest.approx((0 + 1.618) / 2, abs=0.01)
    assert scorer.video("a red circle", video[[0, 0]]) == 0.0


def test_the_toy_judge_reads_a_manifest_only_of_toy_prompts_on_a_toy_world_model(tmp_path):
    from engine.models.registry import Registry

    toy = tmp_path / "toy.jsonl"
    toy.write_text('{"id": "a", "prompt": "a red circle moving left on a black background", "seed": 5}\n')
    other = tmp_path / "other.jsonl"
    other.write_text('{"id": "a", "prompt": "a red circle moving left on a black background", "seed": 5}\n'
                     '{"id": "b", "prompt": "a cat on a sofa", "seed": 6}\n')
    registry = Registry()
    judged = gate_sample(registry, "toy-fast", prompts=toy, count=80)
    assert judged.judged and judged.label == str(toy) and judged.items[0].case.seed == 5
    assert judged.items[0].shape.steps == 4  # toy-fast's own defaults
    assert not gate_sample(registry, "toy", prompts=other, count=80).judged
    held = gate_sample(registry, "toy", prompts=None, count=40, entropy=7)
    assert held.label == "toy held-out draw, entropy 7" and held.judged


def test_a_toy_gate_draws_seeds_nothing_was_tuned_on():
    from engine.models.registry import Registry

    registry = Registry()
    first, again = (gate_sample(registry, "toy-fast", prompts=None, count=48, entropy=7) for _ in range(2))
    other = gate_sample(registry, "toy-fast", prompts=None, count=48, entropy=8)
    seeds = [item.case.seed for item in first.items]
    # Training draws below 2^31, the quality set is 7000-7079: a held-out seed is at least 2^32 = 4294967296.
    assert all(4294967296 <= seed < 1099511627776 for seed in seeds) and len(set(seeds)) == 48
    assert seeds == [item.case.seed for item in again.items]  # the recorded entropy renders the draw again
    assert not set(seeds) & {item.case.seed for item in other.items}
    # The prompts cycle as the quality set's do: any 16 in a row hold every colour, shape, direction, background.
    assert [item.case.prompt for item in first.items[:2]] == ["a red circle moving left on a black background",
                                                             "a green square moving left on a black background"]
    # Case 15: colour 15 mod 5 = 0 red, shape 15 mod 2 = 1 square, direction 7 mod 4 = 3 down, background 1 gray.
    assert first.items[15].case.prompt == "a red square moving down on a gray background"
    # Unseeded, a gate draws afresh.
    assert gate_sample(registry, "toy", prompts=None, count=4).label != gate_sample(registry, "toy", prompts=None,
                                                                                     count=4).label
