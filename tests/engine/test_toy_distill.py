"""`reelbatch toy distill`: a one-minute run through the CLI that writes a loadable few-step registration, records
its gate and card, resumes where it was killed drawing what an unbroken run draws, and never draws the quality set's
noise."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.numpy import load_file

from engine.engine import Engine
from engine.levers.config import EngineConfig
from engine.models.file import load_registry
from engine.models.registry import TOY_FAST, TOY_WEIGHTS
from engine.types import RenderBatch, RenderRequest, Shape
from jobs.cli.toy import QUICK_DISTILL
from toyworld.distill import DistillConfig, distill
from toyworld.distill_config import student_sigmas, teacher_sigmas

REPO = Path(__file__).resolve().parents[2]


class Stopped(Exception):
    """A run stopped by the test, as a kill would stop it."""


def stop_at(stage: str, step: int):
    """A log hook that stops the run at `stage`'s record of `step`."""
    def hook(record):
        if record["stage"] == stage and record["step"] == step:
            raise Stopped
    return hook


@pytest.fixture(scope="module")
def quick_distill(tmp_path_factory, model_cache):
    """`reelbatch toy distill --quick` once for the module, through the CLI, evaluation included."""
    root = tmp_path_factory.mktemp("quick-distill")
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("REELBATCH_")},
           "REELBATCH_CACHE_DIR": str(root / "cache")}
    proc = subprocess.run([sys.executable, "-m", "jobs", "toy", "distill", "--quick", "--out", str(root / "out"),
                           "--work", str(root / "work")], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return root, proc.stdout


def test_the_student_samples_at_toy_fasts_sigmas_and_the_teacher_stops_at_each():
    # By hand: shift 3 of linspace(1000, 2.994, 4) / 1000 is 1, 0.8577, 0.6022, 0.0089; stretched so the last is
    # 0.1 (1 - (1 - s) / 1.1012), then 0.
    windows = student_sigmas(DistillConfig())
    assert windows.tolist() == pytest.approx([1.0, 0.8708, 0.6387, 0.1, 0.0], abs=1e-4)
    fine, bounds = teacher_sigmas(DistillConfig(), windows)
    # 20 teacher steps spread over the windows by their length in unshifted time (0.31, 0.32, 0.34, 0.04).
    assert bounds == [0, 6, 12, 19, 20] and len(fine) == 21
    assert fine[bounds].tolist() == pytest.approx(windows.tolist(), abs=1e-6)
    # And the engine's scheduler for toy-fast visits the same sigmas.
    from diffusers import FlowMatchEulerDiscreteScheduler

    from engine.adapters.apply import scheduler

    engine_scheduler = scheduler(TOY_FAST.sampler, FlowMatchEulerDiscreteScheduler.load_config(TOY_WEIGHTS / "scheduler"))
    engine_scheduler.set_timesteps(4)
    assert torch.allclose(engine_scheduler.sigmas, windows)


def test_a_quick_distill_writes_a_registration_that_loads_renders_and_passed_its_recorded_gate(quick_distill):
    root, stdout = quick_distill
    out = root / "out"
    assert {p.name for p in out.iterdir()} == {"adapter.safetensors", "decoder", "README.md", "references.npz"}
    adapter = load_file(out / "adapter.safetensors")
    assert all(k.startswith("transformer.") and ".lora_" in k for k in adapter)
    config = json.loads((out / "decoder" / "config.json").read_text())
    assert (config["_class_name"], config["latent_channels"], config["spatial_factor"],
            config["temporal_factor"]) == ("LightDecoder", 8, 4, 2)
    card = (out / "README.md").read_text()
    assert "# Model card: `toy-fast`" in card and "| stage | minutes | CPU-minutes | last loss |" in card
    assert "Distilled gate" in card and "Long videos:" in card
    # A minute of distilling keeps few prompts: its gate is recorded, and failed.
    assert "gate failed" in stdout
    gates = json.loads((root / "cache" / "quality-gates.json").read_text())
    (gate,) = gates.values()
    assert gate["setting"] == "distilled" and gate["teacher"] == "toy" and not gate["passed"] and gate["count"] == 32
    assert gate["sample"].startswith("toy held-out draw, entropy ") and "clean_background" in gate["adherence"]
    assert "pairs held out (toy held-out draw, entropy" in card

    models = root / "models.yaml"
    models.write_text(f"mine-fast:\n  path: {TOY_WEIGHTS}\n  max_sequence_length: 64\n  temporal_factor: 2\n"
                      f"  max_frames: 9\n  chunk_condition: clean\n  teacher: toy\n"
                      f"  adapters: [{{path: {out / 'adapter.safetensors'}}}]\n  decoder: {out / 'decoder'}\n"
                      "  sampler: {name: flow_euler, shift: 3.0, shift_terminal: 0.1}\n"
                      "  defaults: {width: 32, height: 32, fps: 8, duration_s: 1, steps: 4, guidance: 1.0}\n")
    # Its gate failed (a minute of training); the render is what is tested, measured as its gate would be.
    engine = Engine(EngineConfig(cache_dir=root / "cache"), load_registry(models), measuring=["mine-fast"])
    calls = []
    hook = engine.pipeline("mine-fast").transformer.register_forward_hook(lambda *a: calls.append(1))
    (video,) = engine.render(RenderBatch(Shape("mine-fast", 32, 32, 9, 4, 1.0),
                                         (RenderRequest(1, "a red circle moving left on a black background", None, 3),)))
    hook.remove()
    assert video.error is None and video.frames.shape == (9, 32, 32, 3)
    assert len(calls) == 4, "4 steps, one pass each"


def test_the_teacher_never_draws_the_quality_sets_noise_and_holds_continuations_clean(quick_distill):
    root, _ = quick_distill
    free = torch.load(root / "work" / "teacher.done.pt", weights_only=False)
    continued = torch.load(root / "work" / "continuations.done.pt", weights_only=False)
    assert free["states"].shape[:2] == (80, 5) and sorted(free["prompts"].tolist()) == list(range(80))
    quality = torch.cat([torch.randn((1, 8, 5, 8, 8), generator=torch.Generator().manual_seed(7000 + i))
                         for i in range(80)])
    starts = torch.cat([free["states"][:, 0], continued["states"][:, 0]])
    distance = (starts[:, None] - quality[None]).flatten(2).abs().amax(2)
    assert distance.min() > 1.0, "no teacher sample starts from a quality-set seed's noise"
    # A continuation's 2 prefix latents are a free sample's last 2, the same in every recorded state.
    prefix = continued["states"][:, :, :, :2]
    assert torch.equal(prefix, prefix[:, :1].expand_as(prefix)) and (continued["prefix"] == 2).all()
    finals = free["states"][:, -1, :, -2:]
    for i in range(len(prefix)):
        match = (finals == prefix[i, 0]).flatten(1).all(1).nonzero().flatten().tolist()
        assert match and all(free["prompts"][m] == continued["prompts"][i] for m in match)


def test_a_killed_distill_resumes_to_the_same_student(quick_distill, tmp_path):
    """Killed in the student stage and run again, it finishes that stage with the weights an unbroken run has. Both
    runs are in this process, on its thread count, from the quick run's teacher samples: every draw is seeded by stage
    and step and the checkpoint holds the weights, their average and the optimizer's state, so nothing may differ.
    (Against the CLI's run in another process, CI's machine rounded one LoRA element 1.3e-5 apart: a float
    reduction's order is the process's, not the checkpoint's.) Both runs stop once the stage after it has begun: the
    stages after it start from the student's saved state, which is compared."""
    import shutil

    root, _ = quick_distill

    config = DistillConfig(**QUICK_DISTILL)
    for run in ("killed", "unbroken"):
        (tmp_path / run).mkdir()
        for stage in ("teacher", "continuations"):
            shutil.copy(root / "work" / f"{stage}.done.pt", tmp_path / run / f"{stage}.done.pt")
    after_student = stop_at("refine", 3)  # its first record: the student's state is saved by then
    with pytest.raises(Stopped):
        distill(config, TOY_WEIGHTS, tmp_path / "unbroken", tmp_path / "unbroken-out", on_log=after_student)
    with pytest.raises(Stopped):  # killed after the checkpoint at step 6: steps 7-9 are lost and redone
        distill(config, TOY_WEIGHTS, tmp_path / "killed", tmp_path / "out", on_log=stop_at("student", 9))
    assert (tmp_path / "killed" / "student.last.pt").is_file()
    assert not (tmp_path / "killed" / "student.done.pt").exists()
    with pytest.raises(Stopped):
        distill(config, TOY_WEIGHTS, tmp_path / "killed", tmp_path / "out", on_log=after_student)
    resumed, unbroken = (torch.load(tmp_path / run / "student.done.pt", weights_only=False)["lora"]
                         for run in ("killed", "unbroken"))
    assert resumed.keys() == unbroken.keys() and len(unbroken) > 0
    for key in unbroken:  # a step lost or done twice would move weights by about the learning rate (1e-3)
        assert torch.equal(resumed[key], unbroken[key]), key


def test_a_killed_match_stage_resumes_to_the_same_student(quick_distill, tmp_path):
    """The distribution-matching stage (toyworld.distill_match) killed after its checkpoint and run again ends with
    the student an unbroken run has: its checkpoint holds the student's weights and their average, the fake score's
    weights and both optimizers, and every draw (prompts, noise, noise levels, regression batches) is seeded by step.
    Both runs start from the quick run's finished stages before it, in this process."""
    import dataclasses
    import shutil

    root, _ = quick_distill

    config = dataclasses.replace(DistillConfig(**QUICK_DISTILL), match_steps=6, checkpoint_every=3, log_every=1)
    for run in ("killed", "unbroken"):
        (tmp_path / run).mkdir()
        for stage in ("teacher", "continuations", "student", "refine"):
            shutil.copy(root / "work" / f"{stage}.done.pt", tmp_path / run / f"{stage}.done.pt")
    after_match = stop_at("decoder", 3)
    with pytest.raises(Stopped):
        distill(config, TOY_WEIGHTS, tmp_path / "unbroken", tmp_path / "unbroken-out", on_log=after_match)
    with pytest.raises(Stopped):  # killed after the checkpoint at step 3: steps 4-5 are lost and redone
        distill(config, TOY_WEIGHTS, tmp_path / "killed", tmp_path / "out", on_log=stop_at("match", 5))
    assert (tmp_path / "killed" / "match.last.pt").is_file() and not (tmp_path / "killed" / "match.done.pt").exists()
    with pytest.raises(Stopped):
        distill(config, TOY_WEIGHTS, tmp_path / "killed", tmp_path / "out", on_log=after_match)
    resumed, unbroken, refined = (torch.load(tmp_path / run / f"{stage}.done.pt", weights_only=False)["lora"]
                                  for run, stage in (("killed", "match"), ("unbroken", "match"),
                                                     ("unbroken", "refine")))
    assert resumed.keys() == unbroken.keys() == refined.keys() and len(unbroken) > 0
    for key in unbroken:
        assert torch.equal(resumed[key], unbroken[key]), key
    assert any(not torch.equal(unbroken[k], refined[k]) for k in unbroken), "the stage moved the student"


def test_a_work_folder_refuses_another_config(tmp_path):
    (tmp_path / "work").mkdir()
    saved = json.loads(json.dumps(DistillConfig(**QUICK_DISTILL).__dict__))
    (tmp_path / "work" / "config.json").write_text(json.dumps({**saved, "student_steps": 13}))
    with pytest.raises(ValueError, match="student_steps differ"):
        distill(DistillConfig(**QUICK_DISTILL), TOY_WEIGHTS, tmp_path / "work", tmp_path / "out")


def test_a_negative_match_steps_is_refused_before_anything_is_written(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "jobs", "toy", "distill", "--match-steps", "-1", "--out",
                           str(tmp_path / "out"), "--work", str(tmp_path / "work")], cwd=REPO, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "COLUMNS": "200"})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "--match-steps" in proc.stderr and "-1" in proc.stderr and "Traceback" not in proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_the_default_recipe_is_the_shipped_students():
    """`toy distill` from scratch gives the shipped student: its stages end with 400 steps of matching and its
    decoder learns the VAE's decode of the student's own latents, as the card's did."""
    card = (REPO / "engine" / "models" / "toy-fast" / "README.md").read_text()
    assert "| match |" in card and "- `match_steps`: 400\n" in card and "- `decoder_student_target`: student\n" in card
    assert DistillConfig().match_steps == 400 and DistillConfig().refine_steps == 300
    assert DistillConfig().decoder_student_target == "student"
