"""The rule submit checks (engine.models.shape_rules) is the one the model keeps: on the real toy folder (64 rotary
positions of 8-px patches, by hand from its configs: tests/jobs/test_submit_shapes.py), a video 512 px wide (64
patches) renders, and the transformer's own rotary table cannot be sliced for 528 px (66 patches), as submit says."""

import numpy as np
import pytest
import torch

from engine.engine import Engine
from engine.levers.config import EngineConfig
from engine.models.registry import Registry
from engine.types import RenderBatch, RenderRequest, Shape

pytestmark = pytest.mark.skipif("toy" not in Registry().models, reason="the toy model's weights are not in place")


def test_the_widest_side_the_rule_allows_renders_and_the_next_step_does_not(tmp_path):
    registry = Registry()
    rules = registry.get("toy").rules
    assert rules.side_problem("toy", "width", 512, 16) is None
    assert rules.side_problem("toy", "width", 528, 16).startswith("is 66 patches, over the 64 positions")
    engine = Engine(EngineConfig(cache_dir=tmp_path), registry)
    request = RenderRequest(1, "a red circle moving right on a black background", None, 3)
    (video,) = engine.render(RenderBatch(Shape("toy", 512, 32, 9, 2, 2.0), (request,)))
    assert video.error is None and video.frames.shape == (9, 32, 512, 3) and video.frames.dtype == np.uint8
    # The latents of 528 x 32 px at 9 frames: 8 channels, (9 - 1) / 2 + 1 = 5 frames, 32 / 4 = 8 high, 528 / 4 = 132
    # wide, so 66 patches across where the table has 64 rows of 10 width channels: 640 values.
    rope = engine.pipeline("toy").transformer.rope
    rope(torch.zeros(1, 8, 5, 8, 128))
    with pytest.raises(RuntimeError, match=r"shape '\[1, 1, 66, -1\]' is invalid for input of size 640"):
        rope(torch.zeros(1, 8, 5, 8, 132))
