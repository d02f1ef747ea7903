"""The models file is as strict as a manifest: a key no registration knows, at any level, is refused with the file,
its line, the model and the key (and the nearest known key), before any folder is read. Every folder here is
missing on purpose: a key error is found first, so none of these needs a model."""

import pytest

from engine.errors import ModelNotFound
from engine.models.file import load_registry

REGISTRATION_HAS = ("path, base, defaults, max_frames, chunk_overlap, chunk_condition, max_sequence_length, max_batch, "
                    "temporal_factor, spatial_multiple, image_condition, mixed_image_batches, precision, "
                    "text_encoder_precision, checks, adapters, sampler, decoder, teacher, clip, guidance_2, "
                    "offload_idle_expert, boundary_ratio")


@pytest.mark.parametrize("text, message", [
    # A registration's own key, the typo the issue met (int8 would have been dropped without a word).
    ("wan:\n  path: /models/wan\n  precison: int8\n",
     "3: model 'wan': unknown key 'precison' (did you mean 'precision'?)"),
    # Nothing near it: every key a registration has.
    ("wan:\n  path: /models/wan\n  max_frames: 81\n  bogus_key: 3\n",
     f"4: model 'wan': unknown key 'bogus_key' (known: {REGISTRATION_HAS})"),
    # defaults, written as a block.
    ("wan:\n  path: /models/wan\n  defaults:\n    width: 832\n    hieght: 480\n",
     "5: model 'wan': defaults: unknown key 'hieght' (did you mean 'height'?)"),
    # checks, written in flow style on one line.
    ("wan:\n  path: /models/wan\n  checks: {max_flicker: 45, min_motoin: 1.0}\n",
     "3: model 'wan': checks: unknown key 'min_motoin' (did you mean 'min_motion'?)"),
    ("wan:\n  path: /models/wan\n  sampler: {name: flow_euler, shfit: 5.0}\n",
     "3: model 'wan': sampler: unknown key 'shfit' (did you mean 'shift'?)"),
    # An adapter is an item of a list: its index is named.
    ("wan:\n  path: /models/wan\n  adapters:\n    - {path: /a.safetensors, scale: 1.0}\n"
     "    - path: /b.safetensors\n      expret: low_noise\n",
     "6: model 'wan': adapters[1]: unknown key 'expret' (did you mean 'expert'?)"),
    ("wan:\n  path: /models/wan\n  adapters: [{path: /a.safetensors, strength: 1}]\n",
     "3: model 'wan': adapters[0]: unknown key 'strength' (known: path, scale, expert)"),
    # The second registration's typo, on its own line; the first is checked whole before it.
    ("a:\n  path: /models/a\nb:\n  path: /models/b\n  text_encoder_precison: int8\n",
     "5: model 'b': unknown key 'text_encoder_precison' (did you mean 'text_encoder_precision'?)"),
    # A key given twice: safe_load would keep the last one silently.
    ("wan:\n  path: /models/wan\n  precision: int8\n  precision: fp16\n",
     "4: model 'wan': 'precision' given twice (first at line 3)"),
    ("wan:\n  path: /models/a\nother:\n  path: /models/b\nwan:\n  path: /models/c\n",
     "5: 'wan' given twice (first at line 1)"),
    # At the top level, a registration's key indented under no model.
    ("precision: int8\nwan:\n  path: /models/wan\n",
     "1: model 'precision' must be a mapping with a 'path' to a local diffusers folder, got 'int8' (a registration's "
     "key: indent it under its model)"),
    # Not YAML at all: one line, with the line.
    ("wan:\n  path: /models/wan\n   precision: int8\n", "3: not valid YAML: mapping values are not allowed here"),
])
def test_an_unknown_or_repeated_key_names_the_file_line_model_and_key(tmp_path, text, message):
    models = tmp_path / "models.yaml"
    models.write_text(text)
    with pytest.raises(ModelNotFound) as caught:
        load_registry(models)
    assert str(caught.value) == f"{models}:{message}"


def test_a_merged_registration_is_checked_with_what_it_merges(tmp_path):
    """`<<: *anchor` is YAML's own merge, as safe_load reads it: not a key of its own, and the merging mapping's
    keys are checked on their own lines."""
    models = tmp_path / "models.yaml"
    models.write_text("a: &a\n  path: /nowhere/a\n  max_batch: 2\nb:\n  <<: *a\n  precison: int8\n")
    with pytest.raises(ModelNotFound) as caught:
        load_registry(models)
    assert str(caught.value) == f"{models}:6: model 'b': unknown key 'precison' (did you mean 'precision'?)"
    models.write_text("a: &a\n  path: /nowhere/a\n  max_batch: 2\nb:\n  <<: *a\n  precision: int8\n")
    with pytest.raises(ModelNotFound) as caught:  # every key known: the folder is what is wrong
        load_registry(models)
    assert str(caught.value) == f"{models}: model 'a': /nowhere/a holds no model_index.json"


@pytest.mark.parametrize("defaults, message", [
    ("{width: wide}", "defaults.width must be a whole number, got 'wide'"),
    ("{steps: 2.5}", "defaults.steps must be a whole number, got 2.5"),
    ("{guidance: .inf}", "defaults.guidance must be a number, got inf"),
    ("[832, 480]", "defaults must be a mapping (width, height, fps, duration_s, steps, guidance), got [832, 480]"),
])
def test_a_default_that_is_not_a_number_is_refused_without_a_traceback(model_cache, tmp_path, defaults, message):
    """Each was a ValueError (or a silent truncation: 2.5 steps became 2) before."""
    from engine.models.tiny import ensure_tiny

    models = tmp_path / "models.yaml"
    models.write_text(f"m:\n  path: {ensure_tiny(model_cache)}\n  defaults: {defaults}\n")
    with pytest.raises(ModelNotFound) as caught:
        load_registry(models)
    assert str(caught.value) == f"{models}: model 'm': {message}"


def test_a_registration_knows_its_line(model_cache, tmp_path):
    from engine.models.tiny import ensure_tiny

    models = tmp_path / "models.yaml"
    folder = ensure_tiny(model_cache)
    models.write_text(f"# two of the same folder\nfirst:\n  path: {folder}\n\nsecond:\n  path: {folder}\n")
    registry = load_registry(models)
    assert registry.sources == {"first": f"{models}:2", "second": f"{models}:5"}
    assert "tiny" in registry and "tiny" not in registry.sources, "a built-in is written in no file"
