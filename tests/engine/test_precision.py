"""Precision modes (engine.levers.precision): what an 8-bit layer holds, which layers stay in float, what a device and a
missing gate refuse, and a gated int8 render of the tiny model."""

import json
from datetime import datetime, timezone

import numpy as np
import pytest
import torch

from engine.engine import Engine
from engine.errors import ModelNotFound
from engine.frames.metrics import psnr
from engine.levers import gates, precision
from engine.levers.config import EngineConfig
from engine.levers.gates import UngatedSetting
from engine.levers.precision import PrecisionRefused
from engine.models.file import load_registry
from engine.models.registry import Registry
from engine.models.tiny import ensure_tiny
from engine.types import RenderBatch, RenderRequest, Shape

SHAPE = Shape("tiny", 64, 48, 9, 4, 5.0)
REQUESTS = tuple(RenderRequest(i, f"prompt {i}", None, 300 + i) for i in range(2))


class Two(torch.nn.Module):
    """A block's Linear and an output projection, named as in Wan's transformer."""

    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.Linear(64, 32)
        self.proj_out = torch.nn.Linear(32, 16)


@pytest.mark.parametrize("mode", ["int8-weight", "int8"])
def test_an_int8_linear_holds_a_byte_a_weight_and_a_scale_and_zero_point_a_row(mode):
    model = Two()
    # fp32: blocks 64*32*4 + 32*4 (bias) = 8320; proj_out 32*16*4 + 16*4 = 2112.
    assert precision.weight_bytes(model) == 8320 + 2112
    assert precision.quantize(model, mode) == 1, "proj_out is kept in float"
    # blocks in int8: 64*32 one-byte weights, a float32 scale (4 bytes) and an int8 zero point (1 byte) for each of
    # its 32 output rows, and its float32 bias: 2048 + 128 + 32 + 128 = 2336. proj_out unchanged: 2112.
    assert precision.weight_bytes(model) == 2336 + 2112
    x = torch.randn(3, 64)
    assert model.blocks(x).shape == (3, 32)


def test_with_nothing_kept_every_linear_is_quantized():
    model = Two()
    assert precision.quantize(model, "int8-weight", keep=()) == 2
    # proj_out in int8: 32*16 + 16*4 + 16 + 16*4 (bias) = 656.
    assert precision.weight_bytes(model) == 2336 + 656


@pytest.mark.parametrize("mode, native, lossy", [
    ("auto", "fp32", False), ("fp32", "fp32", False), ("bf16", "fp32", True), ("fp16", "fp32", True),
    ("int8-weight", "fp32", True), ("int8", "bf16", True), ("bf16", "bf16", False), ("fp32", "bf16", False),
    ("fp16", "bf16", True), ("fp8", "bf16", True),
    # At submit the device is unknown: only what is lossy on every device counts.
    ("bf16", None, False), ("fp16", None, True), ("int8", None, True), ("auto", None, False),
])
def test_a_mode_is_lossy_below_native_and_fp32_never(mode, native, lossy):
    assert precision.lossy(mode, native) is lossy


def test_fp8_needs_fp8_units():
    assert "this device is cpu" in precision.device_problem("fp8", "cpu", None)
    assert "this GPU is 8.0" in precision.device_problem("fp8", "cuda", (8, 0))  # A100: no FP8 units
    assert precision.device_problem("fp8", "cuda", (8, 9)) is None and precision.device_problem("fp8", "cuda", (9, 0)) is None
    assert precision.device_problem("int8", "cpu", None) is None


def test_a_models_file_names_an_unknown_precision(tmp_path, model_cache):
    models = tmp_path / "models.yaml"
    models.write_text(f"tiny8:\n  path: {ensure_tiny(model_cache)}\n  precision: int4\n")
    with pytest.raises(ModelNotFound, match=r"models.yaml: model 'tiny8': precision must be one of auto, fp32, bf16, "
                                            r"fp16, int8-weight, int8, fp8, got 'int4'"):
        load_registry(models)
    models.write_text(f"tiny8:\n  path: {ensure_tiny(model_cache)}\n  precision: int8\n")
    assert load_registry(models).get("tiny8").precision == "int8"


@pytest.fixture
def cache_dir(tmp_path, model_cache):
    """A cache folder of this test's own (its gates file) holding the session's tiny model."""
    ensure_tiny(model_cache)
    (tmp_path / "models").symlink_to(model_cache / "models")
    return tmp_path


def record_gate(cache_dir, setting: str) -> None:
    gates.record(cache_dir, gates.Gate(
        model="tiny", identity=Engine(EngineConfig(cache_dir=cache_dir), Registry()).gate_identity(Registry().get("tiny")),
        setting=setting, count=32, batch=8,
        speedup=1.0, psnr_db_min=30, psnr_db_mean=35, ssim_min=0.9, adherence={}, exact_adherence={},
        measured_at=datetime.now(timezone.utc).isoformat()))


def test_fp8_on_a_cpu_and_an_ungated_mode_are_refused_naming_the_model_and_mode(cache_dir):
    with pytest.raises(PrecisionRefused, match=r"model 'tiny': precision fp8 cannot run here: fp8 needs a CUDA GPU "
                                               r"with FP8 units .* this device is cpu"):
        Engine(EngineConfig(cache_dir=cache_dir, precision="fp8"), Registry()).pipelines.check_precision("tiny")
    engine = Engine(EngineConfig(cache_dir=cache_dir, precision="int8"), Registry())
    with pytest.raises(UngatedSetting, match=r"lossy setting precision=int8 has no recorded quality gate for model "
                                             r"'tiny'.*`reelbatch bench quality --model tiny --precision int8`"):
        engine.pipelines.check_precision("tiny")
    with pytest.raises(UngatedSetting):
        engine.render(RenderBatch(SHAPE, REQUESTS))
    # Native precision (fp32 on this CPU) needs no gate.
    Engine(EngineConfig(cache_dir=cache_dir, precision="fp32"), Registry()).pipelines.check_precision("tiny")


def test_an_8bit_gate_measured_with_other_layers_kept_in_float_releases_nothing(cache_dir, monkeypatch):
    from importlib.metadata import version

    record_gate(cache_dir, "precision=int8-weight")
    recorded = gates.load(cache_dir)
    (key,) = recorded
    assert recorded[key]["recipe"] == f"transformer keeps proj_out in float; torchao {version('torchao')}"
    check = Engine(EngineConfig(cache_dir=cache_dir, precision="int8-weight"), Registry()).pipelines.check_precision
    check("tiny")  # this code's recipe: released
    # The same record, had the output projection been quantized too when it was measured.
    monkeypatch.setattr(precision, "KEEP", ())
    with pytest.raises(UngatedSetting, match=r"precision=int8-weight's quality gate for model 'tiny' was measured "
                                             r"with another quantization \(transformer keeps proj_out in float; "
                                             r"torchao .*; now: transformer keeps nothing in float; torchao .*\): "
                                             r"measure it with `reelbatch bench quality --model tiny --precision "
                                             r"int8-weight` again"):
        Engine(EngineConfig(cache_dir=cache_dir, precision="int8-weight"), Registry()).pipelines.check_precision("tiny")
    # A record from before recipes were recorded is measured again too; a float or lossless setting has none.
    monkeypatch.undo()
    recorded[key].pop("recipe")
    (cache_dir / gates.GATES_FILE).write_text(json.dumps(recorded), encoding="utf-8")
    with pytest.raises(UngatedSetting, match=r"another quantization \(unrecorded; now: transformer keeps proj_out"):
        Engine(EngineConfig(cache_dir=cache_dir, precision="int8-weight"), Registry()).pipelines.check_precision("tiny")
    assert precision.recipe("precision=bf16") == precision.recipe("step_cache=0.1") == ""
    assert precision.recipe("text_encoder_precision=int8,precision=fp16").startswith("text encoder keeps nothing in "
                                                                                     "float; torchao ")


def test_a_gated_int8_render_quantizes_the_transformer_and_stays_close_to_exact(cache_dir):
    exact = [v.frames for v in Engine(EngineConfig(cache_dir=cache_dir).exact(), Registry())
             .render(RenderBatch(SHAPE, REQUESTS))]
    record_gate(cache_dir, "precision=int8")
    engine = Engine(EngineConfig(cache_dir=cache_dir, precision="int8").exact(), Registry())
    assert engine.pipelines.precision("tiny") == "fp32", "exact mode renders at native precision"
    engine = Engine(EngineConfig(cache_dir=cache_dir, precision="int8"), Registry())
    out = engine.render(RenderBatch(SHAPE, REQUESTS))
    assert all(v.error is None for v in out), [v.error for v in out]
    transformer = engine.pipeline("tiny").transformer
    assert type(transformer.blocks[0].ffn.net[2].weight).__name__ == "Int8Tensor"
    assert type(transformer.proj_out.weight).__name__ == "Parameter", "the output projection stays in float"
    # Another rounding of the same model: close to exact, not equal.
    scores = [psnr(v.frames, e) for v, e in zip(out, exact)]
    assert all(40 < s < 100 for s in scores), scores
    assert not np.array_equal(out[0].frames, exact[0])


def tiny_text(cache_dir, mode: str | None) -> Registry:
    """The built-in tiny model registered with its text encoder at `mode` (a models file's
    `text_encoder_precision:`)."""
    from dataclasses import replace

    return Registry({"tiny": replace(Registry().get("tiny"), text_encoder_precision=mode)})


def test_a_models_file_names_an_unknown_text_encoder_precision(tmp_path, model_cache):
    models = tmp_path / "models.yaml"
    models.write_text(f"tinyte:\n  path: {ensure_tiny(model_cache)}\n  text_encoder_precision: int4\n")
    with pytest.raises(ModelNotFound, match=r"models.yaml: model 'tinyte': text_encoder_precision must be one of "
                                            r"auto, fp32, bf16, fp16, int8-weight, int8, fp8, got 'int4'"):
        load_registry(models)
    models.write_text(f"tinyte:\n  path: {ensure_tiny(model_cache)}\n  text_encoder_precision: int8-weight\n")
    info = load_registry(models).get("tinyte")
    assert (info.text_encoder_precision, info.precision) == ("int8-weight", None)
    with pytest.raises(ValueError, match=r"'text_encoder_precision=int4': text_encoder_precision must be one of auto"):
        EngineConfig(cache_dir=tmp_path).with_lossy("text_encoder_precision=int4")


def test_an_ungated_or_unrunnable_text_encoder_precision_is_refused_naming_it(cache_dir):
    engine = Engine(EngineConfig(cache_dir=cache_dir), tiny_text(cache_dir, "int8"))
    with pytest.raises(UngatedSetting, match=r"lossy setting text_encoder_precision=int8 has no recorded quality gate "
                                             r"for model 'tiny'.*`reelbatch bench quality --model tiny --setting "
                                             r"text_encoder_precision=int8`"):
        engine.pipelines.check_precision("tiny")
    with pytest.raises(PrecisionRefused, match=r"model 'tiny': text_encoder_precision fp8 cannot run here: fp8 needs "
                                               r"a CUDA GPU"):
        Engine(EngineConfig(cache_dir=cache_dir), tiny_text(cache_dir, "fp8")).pipelines.check_precision("tiny")
    # fp32 is native here: nothing to gate. With the transformer's own mode too, the key holds both.
    Engine(EngineConfig(cache_dir=cache_dir), tiny_text(cache_dir, "fp32")).pipelines.check_precision("tiny")
    both = Engine(EngineConfig(cache_dir=cache_dir, precision="int8"), tiny_text(cache_dir, "int8-weight"))
    assert both.pipelines.gate_setting("tiny") == "text_encoder_precision=int8-weight,precision=int8"


@pytest.mark.parametrize("mode, expected", [
    # The tiny text encoder (engine.models.tiny: UMT5, vocabulary 259, width 32, 4 heads of 8, feed-forward 64, 2
    # layers, 8 position buckets) holds 28,992 parameters: the embedding table 259*32 = 8,288; a layer's q, k, v, o
    # 4*32*32 = 4,096, wi_0 and wi_1 2*32*64 = 4,096, wo 64*32 = 2,048, two norms 64 and its position biases 8*4 = 32
    # (10,336); the final norm 32. fp32: 28,992 * 4 = 115,968 bytes.
    (None, 115_968),
    # bf16: 2 bytes each.
    ("bf16", 57_984),
    # fp16: 2 bytes each, but transformers keeps UMT5's `wo` in fp32 (its _keep_in_fp32_modules): 2 * 2,048 * 2 more.
    ("fp16", 66_176),
    # int8 weights: the 14 Linears' 20,480 weights a byte each, with a float32 scale and an int8 zero point for each
    # of their 576 output rows (2 * (4*32 + 2*64 + 32)): 2,880; the table, norms and biases stay fp32:
    # (8,288 + 2*(64 + 32) + 32) * 4 = 34,048. 20,480 + 2,880 + 34,048 = 57,408, 0.495x of fp32.
    ("int8-weight", 57_408),
    ("int8", 57_408),
])
def test_the_text_encoder_alone_holds_its_modes_bytes_and_renders_gated(cache_dir, mode, expected):
    if mode is not None:
        record_gate(cache_dir, f"text_encoder_precision={mode}")
    engine = Engine(EngineConfig(cache_dir=cache_dir), tiny_text(cache_dir, mode))
    pipe = engine.pipeline("tiny")
    assert precision.weight_bytes(pipe.text_encoder) == expected
    assert type(pipe.transformer.blocks[0].ffn.net[2].weight).__name__ == "Parameter", "the transformer untouched"
    if mode in ("int8-weight", "int8"):
        out = engine.render(RenderBatch(SHAPE, REQUESTS))
        assert all(v.error is None for v in out), [v.error for v in out]
        # An 8-bit encoder computes in fp32 (the dtype in the embedding cache's key), so its mode is in the key too.
        exact = Engine(EngineConfig(cache_dir=cache_dir).exact(), tiny_text(cache_dir, mode))
        assert engine.pipelines.text_identity(Registry().get("tiny")) == \
            exact.pipelines.text_identity(Registry().get("tiny")) + f"+{mode}"
