"""`reelbatch toy train`: a one-minute run whose losses fall, that saves a loadable model and resumes where it was
killed, drawing exactly what an unbroken run draws."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from engine.engine import Engine
from engine.levers.config import EngineConfig
from engine.models.file import load_registry
from engine.types import RenderBatch, RenderRequest, Shape
from jobs.cli.toy import QUICK
from toyworld.train import TrainConfig, train


@pytest.fixture(scope="module")
def quick_run(quick_toy):
    """The session's quick run through the CLI (tests/conftest.py), as a user starts it."""
    assert "transformer 30/30" in quick_toy.stdout
    return quick_toy.root


def losses(work: Path, stage: str) -> list[float]:
    records = [json.loads(line) for line in (work / "train-log.jsonl").read_text().splitlines()]
    return [r["loss"] for r in records if r["stage"] == stage]


def test_losses_fall_in_every_trained_stage(quick_run):
    vae = losses(quick_run / "work", "vae")
    transformer = losses(quick_run / "work", "transformer")
    assert len(vae) == 8 and len(transformer) == 10
    # Each logged VAE loss is one batch's, and batches differ (shape sizes, colours), so compare averages.
    assert np.mean(vae[-3:]) < 0.9 * np.mean(vae[:2])
    assert np.mean(transformer[-3:]) < 0.6 * np.mean(transformer[:2])


def test_the_saved_folder_loads_as_a_registered_model_and_renders(quick_run, tmp_path):
    out = quick_run / "out"
    assert not list(out.rglob("*.bin")) and {p.parent.name for p in out.rglob("*.safetensors")} >= {
        "vae", "transformer", "text_encoder"}
    vae_config = json.loads((out / "vae" / "config.json").read_text())
    assert (vae_config["scale_factor_spatial"], vae_config["scale_factor_temporal"], vae_config["z_dim"]) == (4, 2, 8)
    assert vae_config["latents_std"] != [1.0] * 8, "the encoded data's statistics are stored for the pipeline"
    models = tmp_path / "models.yaml"
    models.write_text(f"mine:\n  path: {out}\n  max_sequence_length: 64\n  defaults: {{width: 32, height: 32}}\n")
    engine = Engine(EngineConfig(cache_dir=tmp_path), load_registry(models))
    (video,) = engine.render(RenderBatch(Shape("mine", 32, 32, 9, 2, 5.0),
                                         (RenderRequest(1, "a red circle moving left on a black background", None, 3),)))
    assert video.error is None and video.frames.shape == (9, 32, 32, 3)


def test_a_killed_run_resumes_to_the_same_weights(quick_run, tmp_path):
    class Killed(Exception):
        pass

    def kill_at_step_25(record):
        if record["stage"] == "transformer" and record["step"] == 24:
            raise Killed  # after the checkpoint at step 20: steps 21-24 are lost and redone

    # The quick run's work folder as it stood when its transformer stage began: the VAE stages and the encoded
    # latents done (a resumed run loads them and trains none of them again), the transformer's not.
    (tmp_path / "work").mkdir()
    for name in ("config.json", "vae.done.pt", "decoder.done.pt", "latents.done.pt"):
        shutil.copy(quick_run / "work" / name, tmp_path / "work" / name)
    config = TrainConfig(**QUICK)
    with pytest.raises(Killed):
        train(config, tmp_path / "work", tmp_path / "out", on_log=kill_at_step_25)
    assert (tmp_path / "work" / "transformer.last.pt").is_file() and not (tmp_path / "out").exists()
    assert {r["stage"] for r in map(json.loads, (tmp_path / "work" / "train-log.jsonl").read_text().splitlines())} \
        == {"transformer"}, "a stage that was done was trained again"
    train(config, tmp_path / "work", tmp_path / "out")
    for part in ("transformer", "vae"):
        resumed = load_file(next((tmp_path / "out" / part).glob("*.safetensors")))
        unbroken = load_file(next((quick_run / "out" / part).glob("*.safetensors")))
        assert resumed.keys() == unbroken.keys()
        # The unbroken run is another process (the CLI's), whose float reductions may round differently: a clean-clone
        # run saw one weight in 16384 differ by 1.3e-6 after Adam. A step lost or done twice would move weights by
        # about the learning rate (2e-3), far past this tolerance.
        for name in unbroken:
            np.testing.assert_allclose(resumed[name], unbroken[name], rtol=0, atol=1e-5, err_msg=name)


def test_a_work_folder_refuses_another_config(tmp_path):
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "config.json").write_text(json.dumps({**TrainConfig(**QUICK).__dict__, "steps": 31}))
    with pytest.raises(ValueError, match="steps differ"):
        train(TrainConfig(**QUICK), tmp_path / "work", tmp_path / "out")


def test_the_continuation_prefix_is_the_toy_registrations_overlap():
    from engine.models.registry import TOY

    assert TrainConfig().prefix_latents == TOY.chunk_overlap


def test_the_continuation_stage_ran_and_changed_the_transformer(quick_run):
    import torch

    assert len(losses(quick_run / "work", "continuation")) == 2  # 6 steps, logged every 3
    before = torch.load(quick_run / "work" / "transformer.done.pt", weights_only=False)["transformer"]
    after = torch.load(quick_run / "work" / "continuation.done.pt", weights_only=False)["transformer"]
    assert before.keys() == after.keys()
    assert any(not torch.equal(before[k], after[k]) for k in before)


def test_a_clean_prefix_trains_at_timestep_0_and_outside_the_loss(tmp_path):
    """One step of the training loop with a 2-latent prefix on the first clip: the transformer sees that prefix
    clean with timestep 0 on its tokens, the rest noised at the clip's timestep; the other clip has no prefix."""
    import torch

    from toyworld.model import build_transformer
    from toyworld.plumbing import Logger
    from toyworld.train_transformer import _flow_matching

    model = build_transformer()
    x0 = torch.randn(2, 8, 5, 8, 8, generator=torch.Generator().manual_seed(0))
    seen = {}

    def record(module, args, kwargs):
        seen["hidden"], seen["timestep"] = args[0].clone(), args[1].clone()

    hook = model.register_forward_pre_hook(record, with_kwargs=True)
    config = TrainConfig(**QUICK)
    try:
        _flow_matching(model, config, tmp_path, Logger(tmp_path / "log.jsonl", None), stage="continuation",
                       batch=lambda rng: (x0, torch.zeros(2, 64, 64), torch.tensor([2, 0])), steps=1,
                       lr=1e-3, warmup=1, ema=0.9)
    finally:
        hook.remove()
    per_frame = 16  # 8x8 latents in 2x2 patches
    t = seen["timestep"]
    assert t.shape == (2, 5 * per_frame)
    assert torch.all(t[0, : 2 * per_frame] == 0) and torch.all(t[0, 2 * per_frame :] > 0)
    assert torch.all(t[1] == t[1, 0]) and t[1, 0] > 0
    assert torch.equal(seen["hidden"][0, :, :2], x0[0, :, :2])
    assert not torch.allclose(seen["hidden"][0, :, 2:], x0[0, :, 2:])
