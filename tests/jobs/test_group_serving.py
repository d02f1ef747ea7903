"""A worker of several ranks as the claim and the settings see it (issue 44): its claim passes over a shape whose
latent tokens its Ulysses ranks cannot split (left to a one-GPU worker) and takes the next; the settings that make
one read and refused as the other settings are.

Hand-worked: tiny's cells are 8 (VAE) x 2 (patch) = 16 pixels; 9 frames are (9 - 1) / 4 + 1 = 3 latent frames. At
48x48 a video is 3 x 3 x 3 = 27 tokens (odd: 2 ranks cannot split it); at 64x64, 3 x 4 x 4 = 48."""

import pytest

from engine.models.shape_rules import rules_of
from jobs.claims import claims
from jobs.claims.claims import Serving
from jobs.errors import UsageError
from jobs.settings import Settings
from tests.jobs.test_routing import keys, submit


def test_a_claim_of_two_ranks_leaves_a_shape_they_cannot_split(factory, registry, tmp_path):
    for name, count, rank, size in [("odd", 2, 100, "48x48"), ("even", 3, 10, "64x64")]:
        extra = f"defaults: {{resolution: {size}, duration_s: 1}}\n"
        submit(factory, registry, tmp_path, name, "tiny", count, rank, extra)
    rules = {"tiny": rules_of(registry.get("tiny"))}
    two = Serving(("tiny",), split=2, rules=rules)
    assert two.limit("tiny|48x48|f9|s30|g5", "tiny", 8) == 0 and two.limit("tiny|64x64|f9|s30|g5", "tiny", 8) == 8
    assert keys(claims.claim_batch(factory, owner="g", max_batch=8, lease_s=60, serving=two)) == ["even0", "even1",
                                                                                                   "even2"]
    assert claims.claim_batch(factory, owner="g", max_batch=8, lease_s=60, serving=two) is None
    # A one-rank worker takes the odd shape.
    one = Serving(("tiny",))
    assert keys(claims.claim_batch(factory, owner="w", max_batch=8, lease_s=60, serving=one)) == ["odd0", "odd1"]


def test_the_layout_settings_are_read_and_refused_by_name():
    s = Settings.from_env({"REELBATCH_ULYSSES": "4", "REELBATCH_CFG_PARALLEL": "2",
                           "REELBATCH_GPUS": "0, 2,5,7,1,3,4,6"})
    assert (s.engine.ulysses, s.engine.cfg_parallel, s.worker.gpus) == (4, 2, (0, 2, 5, 7, 1, 3, 4, 6))
    assert Settings.from_env({}).worker.gpus is None and Settings.from_env({}).engine.ulysses == 1
    each_once = "must be GPU indices separated by commas, each once (0,1,2,3)"
    for env, said in [({"REELBATCH_CFG_PARALLEL": "3"}, "REELBATCH_CFG_PARALLEL: must be 1 or 2, got '3'"),
                      ({"REELBATCH_ULYSSES": "0"}, "REELBATCH_ULYSSES: must be a whole number of at least 1, got '0'"),
                      ({"REELBATCH_GPUS": "1,1"}, f"REELBATCH_GPUS: {each_once}, got '1,1'"),
                      ({"REELBATCH_GPUS": "cuda:0"}, f"REELBATCH_GPUS: {each_once}, got 'cuda:0'")]:
        with pytest.raises(UsageError) as caught:
            Settings.from_env(env)
        assert str(caught.value) == f"environment variable {said}"


def test_a_worker_of_ranks_on_gpus_pays_for_each_gpu(monkeypatch):
    import torch

    from jobs.work.process import group_rate

    env = {"REELBATCH_GPU_HOUR_USD": "5.41", "REELBATCH_ULYSSES": "4", "REELBATCH_CFG_PARALLEL": "2"}
    on_cpu = Settings.from_env({**env, "REELBATCH_DEVICE": "cpu"})
    assert group_rate(on_cpu).usd_per_hour == 5.41  # its ranks share the CPU's cores
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # a machine with GPUs, as `auto` sees it
    rate = group_rate(Settings.from_env(env))
    assert rate.usd_per_hour == 43.28  # 8 GPUs x 5.41
    assert rate.source.endswith("; x 8 GPUs (one worker of 8 ranks)")
    assert group_rate(Settings.from_env({"REELBATCH_GPU_HOUR_USD": "5.41"})).usd_per_hour == 5.41
