"""`reelbatch bench`: both sides run for real (diffusers pipeline calls; the worker path with its database, store and
finisher) and the report's numbers are consistent with each other. Speed itself is never asserted here."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from jobs.bench.baseline import denoise_gflop
from jobs.bench.compare import BenchResult
from jobs.bench.ladder import level_videos
from jobs.bench.presets import Preset, prompts
from jobs.bench.side import Side

REPO = Path(__file__).resolve().parents[2]


def test_bench_small_runs_both_sides_and_reports_every_field(tmp_path, model_cache):
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("REELBATCH_")},
           "REELBATCH_CACHE_DIR": str(model_cache)}
    proc = subprocess.run([sys.executable, "-m", "jobs", "bench", "--preset", "small", "--videos", "4", "--json"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout)
    for side in ("baseline", "engine"):
        s = r[side]
        assert s["videos"] == 4 and s["wall_s"] > 0
        # The worker path checks every video (jobs.render.checks); the diffusers script does not.
        assert set(s["stages"]) == {"text", "denoise", "decode", "encode", "upload", "other",
                                    *(["checks"] if side == "engine" else [])}
        assert s["stages"]["denoise"] > 0 and s["stages"]["decode"] > 0 and s["stages"]["encode"] > 0
        # Rendering is one thread of work, so its stages fit in the wall time; encoding and upload may overlap it.
        assert s["stages"]["text"] + s["stages"]["denoise"] + s["stages"]["decode"] <= s["wall_s"]
    b = r["baseline"]
    assert sum(b["stages"].values()) <= b["wall_s"] * 1.01, "the baseline does one thing at a time"
    e = r["engine"]
    # Same model, prompts and seeds: the worker path's videos are the diffusers script's, to rounding.
    assert r["min_psnr_db"] >= 40 and len(r["psnr_db"]) == 4 and r["min_psnr_db"] == min(r["psnr_db"])
    assert 0 < r["min_psnr_mp4_db"] <= 100
    assert {"denoise_gflop", "peak_gflops", "denoise_floor_s", "denoise_mfu", "baseline_denoise_mfu"} <= set(r)
    # The preset's batches of 16, but at least two batches of the 4 videos, so storing one overlaps the next.
    assert e["config"]["overlap"] is True and e["config"]["max_batch"] == 2
    assert not list(tmp_path.iterdir()), "the bench leaves nothing behind in the working folder"
    # It recorded the worker path's seconds per video as the toy model's profile, which estimates then stand on.
    p = r["profile"]
    assert (p["model"], p["width"], p["frames"], p["steps"], p["videos"]) == ("toy", 32, 9, 20, 4)
    assert p["seconds_per_video"] == e["wall_s"] / 4
    assert json.loads((model_cache / "profiles.json").read_text())["toy"] == p
    manifest = tmp_path / "m.yaml"
    manifest.write_text("name: m\nmodel: toy\ndefaults: {steps: 40}\nvideos:\n  - {id: a, prompt: p}\n")
    proc = subprocess.run([sys.executable, "-m", "jobs", "estimate", str(manifest), "--gpus", "1", "--json"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    (shape,) = json.loads(proc.stdout)["shapes"]
    assert shape["basis"]["kind"] == "profile" and shape["basis"]["work_ratio"] == 2.0, "40 steps against 20"
    assert shape["gpu_seconds"] == pytest.approx(2 * p["seconds_per_video"])
    assert sorted(x.name for x in tmp_path.iterdir()) == ["m.yaml"], "the estimate wrote nothing"


def test_denoise_flops_match_a_hand_count_of_the_blocks(model_cache):
    """FlopCounterMode on one transformer call, scaled by steps and guidance, against the matmuls counted by hand."""
    from diffusers import WanPipeline

    from engine.models.tiny import ensure_tiny

    pipe = WanPipeline.from_pretrained(ensure_tiny(model_cache))
    preset = Preset("t", "", "tiny", 64, 64, 9, 8, steps=3, guidance=5.0, videos=1, batch=1, max_sequence_length=64)
    gflop = denoise_gflop(pipe, preset, torch.device("cpu"))
    c = pipe.transformer.config
    d = c.num_attention_heads * c.attention_head_dim
    tokens = 3 * (64 // 8 // 2) ** 2  # 9 frames -> 3 latent frames, 8x8 latents, 2x2 patches
    text = 64
    per_block = (2 * tokens * d * d * 4  # self-attention q, k, v, o
                 + 2 * tokens * d * d * 2 + 2 * text * d * d * 2  # cross-attention q, o and k, v
                 + 2 * tokens * d * c.ffn_dim * 2  # feed-forward
                 + 2 * 2 * tokens * tokens * d + 2 * 2 * tokens * text * d)  # attention scores and values
    blocks = c.num_layers * per_block * preset.steps * 2 / 1e9
    # The blocks are most of it; embeddings and the output head add a little on top.
    assert blocks <= gflop <= 1.3 * blocks


def test_the_ratios_are_worked_out_from_the_sides():
    """Figures worked out by hand: 4 videos in 2 s is 7,200 an hour; 4 in 8 s is 1,800; so 4x. Denoising 3 GFLOP a
    video, 4 videos in 0.4 s at a 100 GFLOP/s peak is 12 GFLOP in 0.4 s = 30 GFLOP/s, 0.3 of the peak."""
    baseline = Side("baseline", videos=4, wall_s=8.0, stages={"denoise": 1.2, "decode": 0.8})
    engine = Side("engine", videos=4, wall_s=2.0, stages={"denoise": 0.4, "decode": 1.2})
    result = BenchResult("p", "", "cpu", "fp32", {}, baseline, engine, 100.0, [100.0], 100.0, denoise_gflop=3.0,
                         peak_gflops=100.0)
    assert (baseline.videos_per_hour, engine.videos_per_hour, result.speedup) == (1800.0, 7200.0, 4.0)
    assert engine.to_dict()["wall_over_compute"] == 1.25  # 2 s over 0.4 + 1.2 s
    assert result.denoise_mfu == pytest.approx(0.3) and result.baseline_denoise_mfu == pytest.approx(0.1)
    assert result.denoise_floor_s == 0.03


def test_prompts_are_distinct():
    assert len(set(prompts(64))) == 64


def test_the_wan_presets_have_the_published_sizes():
    """Built on the meta device (no memory, no time): the wan-1.3b preset is Wan2.1-T2V-1.3B's transformer (1.42B
    parameters), Wan2.1's VAE (127M) and UMT5-XXL's encoder (5.68B with its own vocabulary); the cpu preset keeps
    its widths."""
    from diffusers import AutoencoderKLWan, WanTransformer3DModel
    from transformers import UMT5Config, UMT5EncoderModel

    from jobs.bench.models import UMT5_XXL, WAN_13B_TRANSFORMER

    def count(module) -> float:
        return sum(p.numel() for p in module.parameters())

    with torch.device("meta"):
        transformer = WanTransformer3DModel(**WAN_13B_TRANSFORMER)
        encoder = UMT5EncoderModel(UMT5Config(vocab_size=256384, **UMT5_XXL))
        vae = AutoencoderKLWan()
    assert count(transformer) == pytest.approx(1.42e9, rel=0.01)
    assert count(encoder) == pytest.approx(5.68e9, rel=0.01)
    assert count(vae) == pytest.approx(127e6, rel=0.01)
    block = transformer.blocks[0]
    assert (block.attn1.to_q.in_features, block.ffn.net[0].proj.out_features) == (1536, 8960)


def test_the_gpu_check_says_plainly_that_there_is_no_gpu(tmp_path):
    proc = subprocess.run(["bash", str(REPO / "scripts" / "gpu_check.sh"), str(tmp_path / "out")],
                          env={**os.environ, "PYTHON": sys.executable}, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert "no CUDA device" in (tmp_path / "out" / "torch.txt").read_text()


def test_ladder_runs_each_level_with_real_worker_processes(tmp_path, model_cache):
    """Two levels (1 and 2 workers at batch 2) of the small preset: every video of every level succeeds, latencies
    come from the rows the workers wrote, and the steady state is the level with the most videos per hour."""
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("REELBATCH_")},
           "REELBATCH_CACHE_DIR": str(model_cache)}
    proc = subprocess.run([sys.executable, "-m", "jobs", "bench", "ladder", "--preset", "small", "--batches", "2",
                           "--workers", "1,2", "--json"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout)
    assert [(lv["workers"], lv["batch"]) for lv in r["levels"]] == [(1, 2), (2, 2)]
    for lv in r["levels"]:
        assert lv["videos"] == lv["succeeded"] == level_videos(lv["batch"], lv["workers"]) == 16 and lv["failed"] == 0
        assert lv["failure_rate"] == 0 and lv["retries"] == 0
        q = lv["latency_s"]
        assert 0 < q["p50"] <= q["p95"] <= q["p99"] <= q["max"] <= lv["wall_s"]
        assert lv["peak_rss_mb"] > 100 and lv["peak_device_mb"] is None  # a worker holds torch and the model
    best = max(r["levels"], key=lambda lv: lv["videos_per_hour"])
    assert r["steady"] == {"workers": best["workers"], "batch": best["batch"],
                           "videos_per_hour": best["videos_per_hour"]}
    assert not list(tmp_path.iterdir()), "the ladder leaves nothing behind in the working folder"


@pytest.mark.parametrize("option, value", [("--batches", "0,2"), ("--workers", "two")])
def test_ladder_levels_must_be_whole_numbers(tmp_path, option, value):
    proc = subprocess.run([sys.executable, "-m", "jobs", "bench", "ladder", option, value], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and f"{option}: expected comma-separated whole numbers" in proc.stderr


@pytest.mark.parametrize("args, said", [
    (["--quality", "--count", "32"], "--quality: the mode is a subcommand now: `reelbatch bench quality [OPTIONS]`"),
    (["--preset", "small", "--ladder"], "--ladder: the mode is a subcommand now: `reelbatch bench ladder [OPTIONS]`"),
    (["--precision=bf16"], "--precision: the mode is a subcommand now: `reelbatch bench precision MODE... [OPTIONS]`"),
    (["--preset", "small", "long"], "--preset: an option of the side-by-side bench, given before `long`"),
])
def test_bench_modes_are_subcommands_and_the_old_flags_say_where_they_went(tmp_path, args, said):
    """`bench` alone is the side by side; each other mode is a subcommand with its own options. A former mode flag,
    or a side-by-side option put before a subcommand, exits 2 saying so, having rendered and written nothing."""
    proc = subprocess.run([sys.executable, "-m", "jobs", "bench", *args], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2 and said in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("batch, workers, videos", [(1, 1, 16), (2, 2, 16), (8, 1, 24), (16, 2, 96), (4, 2, 24)])
def test_a_ladder_level_is_whole_batches_for_every_worker(batch, workers, videos):
    assert level_videos(batch, workers) == videos and videos % (batch * workers) == 0


def test_bench_long_reports_chunked_and_full_length_side_by_side(tmp_path, model_cache):
    """The small preset (toy, 9-frame window) at 1x and 4x: 1 and 5 chunks, each case in its own process."""
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("REELBATCH_")},
           "REELBATCH_CACHE_DIR": str(model_cache)}
    proc = subprocess.run([sys.executable, "-m", "jobs", "bench", "long", "--preset", "small", "--json"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout)
    assert r["frames"] == {"1x": 9, "4x": 33} and r["chunks"] == {"1x": 1, "4x": 5} and r["chunk_ratio"] == 5
    one, many = r["cases"]["chunked_1x"], r["cases"]["chunked_4x"]
    assert r["time_ratio"] == pytest.approx(many["seconds"] / one["seconds"])
    assert r["peak_memory_ratio"] == pytest.approx(many["peak_mb"] / one["peak_mb"])
    assert r["seam_score"] == many["seam_score"] > 0 and one["seam_score"] is None
    assert set(many["stages"]) == {"text", "denoise", "decode"}
    assert r["full_length"]["time_ratio"] > 0 and r["full_length"]["peak_memory_ratio"] > 0
    assert not list(tmp_path.iterdir())


def test_bench_renders_a_distilled_registration_against_its_teacher_once_its_gate_passed(tmp_path):
    """`--preset small --model toy-fast`: the baseline is the plain script rendering the teacher `toy` at its
    defaults (20 steps, guidance 2), reelbatch's side renders toy-fast at its own (4 steps, one pass, its LoRA,
    sampler and light decoder). Refused, writing nothing, until toy-fast's distilled gate has passed; `--speed-only`
    times it anyway and says why workers would refuse it."""
    from engine.engine import Engine
    from engine.levers import gates
    from engine.levers.config import EngineConfig
    from engine.models.registry import TOY_FAST, TOY_WEIGHTS, Registry
    from jobs.bench.sides import check_gates
    from jobs.settings import Settings

    cache = tmp_path / "cache"
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("REELBATCH_")}, "REELBATCH_CACHE_DIR": str(cache)}
    args = [sys.executable, "-m", "jobs", "bench", "--preset", "small", "--model", "toy-fast", "--videos", "4", "--json"]
    work = tmp_path / "work"
    work.mkdir()
    refused = subprocess.run(args, cwd=work, env=env, capture_output=True, text=True, timeout=600)
    assert refused.returncode == 2, refused.stderr
    assert "--model toy-fast: model 'toy-fast' is distilled and has no recorded quality gate" in refused.stderr
    assert "reelbatch bench quality --model toy-fast" in refused.stderr and not list(work.iterdir())
    proc = subprocess.run(args + ["--speed-only"], cwd=work, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout)
    assert "model 'toy-fast' is distilled and has no recorded quality gate" in r["engine_gate"]
    assert r["baseline"]["model"] == {"name": "toy", "path": str(TOY_WEIGHTS), "adapters": [], "sampler": None,
                                      "decoder": None, "teacher": None, "steps": 20, "guidance": 2.0}
    assert r["engine"]["model"] == {
        "name": "toy-fast", "path": str(TOY_WEIGHTS),
        "adapters": [{"path": str(TOY_WEIGHTS.parent / "toy-fast" / "adapter.safetensors"), "scale": 1.0}],
        "sampler": "flow_euler(shift=3,terminal=0.1)", "decoder": str(TOY_WEIGHTS.parent / "toy-fast" / "decoder"),
        "teacher": "toy", "steps": 4, "guidance": 1.0}
    assert (r["shape"]["steps"], r["shape"]["guidance"], r["same_model"]) == (4, 1.0, False)
    # 20 steps of two passes against 4 of one: 40 transformer passes a video against 4.
    assert r["baseline_denoise_gflop"] == pytest.approx(10 * r["denoise_gflop"])
    assert r["engine"]["config"]["max_batch"] == 2, "4 videos in two batches, so storing one overlaps the next"
    for side in ("baseline", "engine"):
        assert r[side]["videos"] == 4 and set(r[side]["stages"]) == {"text", "denoise", "decode", "encode", "upload",
                                                                      "other", *(["checks"] if side == "engine" else [])}
    env_ = r["environment"]
    assert set(env_["versions"]) == {"torch", "diffusers", "transformers", "peft", "av"} and all(env_["versions"].values())
    assert env_["commit"] == "unknown" or len(env_["commit"].removesuffix("+dirty")) == 40
    assert env_["datasheet_peak_gflops"] is None and r["datasheet_mfu"] == {"baseline": None, "engine": None}
    # A passing record, as `bench quality --model toy-fast` writes one (that measurement is test_toy_fast's):
    # the check the bench makes before rendering then lets it through.
    teacher = {"colour": 1.0, "shape": 0.8, "direction": 0.95, "background": 1.0, "all_four": 0.75}
    video = [np.arange(192, dtype=np.uint8).reshape(1, 8, 8, 3).repeat(2, axis=0)] * gates.MIN_SAMPLE
    identity = Engine(EngineConfig(cache_dir=cache), Registry()).gate_identity(TOY_FAST)
    gates.record(cache, gates.distilled_gate("toy-fast", identity, "toy",
                                             adherence=teacher, teacher_adherence=teacher, videos=video,
                                             teacher_videos=video, batch=8, speedup=10.0))
    settings = Settings.from_env({"REELBATCH_CACHE_DIR": str(cache)})
    check_gates(settings, settings.registry().get("toy-fast"))


def test_the_cpu_fast_registrations_adapter_and_decoder_fit_their_base_and_render_in_four_passes(tmp_path,
                                                                                                model_cache):
    """The cpu-fast preset's random LoRA and light decoder, built here for the tiny folder (the same code builds
    them for the Wan-width bench model): the models file's checks accept them, and the engine renders 4 steps of one
    pass with the light decoder in place of the VAE's."""
    from engine.engine import Engine
    from engine.levers.config import EngineConfig
    from engine.models.file import load_registry
    from engine.models.tiny import ensure_tiny
    from engine.types import RenderBatch, RenderRequest, Shape
    from jobs.bench.models import ADAPTER_FILE, DECODER_FOLDER, ensure_fast_extras

    tiny = ensure_tiny(model_cache)
    extras = ensure_fast_extras(tmp_path, tiny)
    assert ensure_fast_extras(tmp_path, tiny) == extras, "built once"
    models = tmp_path / "models.yaml"
    models.write_text(f"fast:\n  path: {tiny}\n  max_sequence_length: 64\n  adapters: [{{path: {extras / ADAPTER_FILE}}}]\n"
                      f"  decoder: {extras / DECODER_FOLDER}\n  sampler: {{name: flow_euler, shift: 3.0}}\n"
                      "  defaults: {width: 64, height: 64, fps: 8, duration_s: 1, steps: 4, guidance: 1.0}\n")
    engine = Engine(EngineConfig(cache_dir=tmp_path), load_registry(models))
    calls = []
    hook = engine.pipeline("fast").transformer.register_forward_hook(lambda *a: calls.append(1))
    (video,) = engine.render(RenderBatch(Shape("fast", 64, 64, 9, 4, 1.0), (RenderRequest(1, "a boat", None, 3),)))
    hook.remove()
    assert video.error is None and video.frames.shape == (9, 64, 64, 3) and len(calls) == 4
    assert engine.light_decoder("fast") is not None
