"""The manifest contract: good files become the expected specs; each kind of bad input is one precise issue."""

import json
import os

import pytest

from engine.models.registry import Registry
from jobs.manifest import ManifestError, derive_seed, load_manifest

from .manifest_helpers import EXAMPLES, load, one_video, write

# --- Good manifests -------------------------------------------------------------------------------------------------


def test_yaml_fields_come_from_video_then_defaults_then_model(tmp_path):
    path = write(tmp_path, """
        name: night
        model: tiny
        output: s3://bucket/renders
        priority: 7
        defaults:
          steps: 6
          guidance: 7
          negative_prompt: blurry
        videos:
          - id: a
            prompt: a red circle
          - id: b
            prompt: a blue square
            steps: 3
            negative_prompt: null
            seed: 5
            resolution: 720p
    """)
    spec = load(path)
    assert (spec.name, spec.model, spec.output, spec.priority, spec.source) == (
        "night", "tiny", "s3://bucket/renders/", 7, str(path))
    a, b = spec.videos
    assert (a.id, a.line, a.prompt, a.negative_prompt, a.seed) == ("a", 10, "a red circle", "blurry", None)
    assert (a.steps, a.guidance) == (6, 7.0) and isinstance(a.guidance, float)  # from defaults
    assert (a.width, a.height, a.fps, a.frames) == (64, 64, 8, 9)  # from the tiny model
    assert (b.line, b.steps, b.guidance, b.negative_prompt, b.seed) == (12, 3, 7.0, None, 5)
    assert (b.width, b.height) == (1280, 720)


def test_sets_override_yaml_defaults_but_not_videos(tmp_path):
    path = write(tmp_path, """
        name: t
        defaults: {steps: 6, fps: 4}
        videos:
          - {id: a, prompt: p}
          - {id: b, prompt: p, steps: 3}
    """)
    a, b = load(path, sets=["steps=9", "prompt=unused default", "negative_prompt=grainy"]).videos
    assert (a.steps, b.steps) == (9, 3)
    assert a.fps == 4 and a.prompt == "p" and a.negative_prompt == "grainy"


def test_keyword_arguments_override_the_yaml_run_fields(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = write(tmp_path, "name: t\nmodel: nope\noutput: ftp://x\npriority: 99\nvideos: [{id: a, prompt: p}]\n")
    spec = load(path, name="other", model="tiny", output="file://./out", priority=2)
    assert (spec.name, spec.model, spec.output, spec.priority) == ("other", "tiny", f"file://{tmp_path}/out/", 2)


@pytest.mark.parametrize("resolution, size", [("480p", (832, 480)), ("720p", (1280, 720)), ("32x48", (32, 48)),
                                              ("2048X16", (2048, 16))])
def test_resolution_presets_and_sizes(tmp_path, resolution, size):
    (video,) = load(one_video(tmp_path, [f"resolution: {resolution}"])).videos
    assert (video.width, video.height) == size


@pytest.mark.parametrize("duration, fps, frames", [
    (1, 8, 9),  # 8 frames -> nearest 4k+1 is 9
    (2, 8, 17),  # 16 -> 17 (halfway rounds up)
    (1.75, 8, 13),  # 14 -> 13
    (1.875, 8, 17),  # 15 -> 17
    (0.01, 1, 5),  # at least one step of 4, plus the first frame
    (3, 11, 33),  # 33 = tiny's max_frames
    (3.25, 2, 9),  # 6.5 frames rounds half up to 7 (Python's round() would give 6, then 5 frames)
])
def test_frames_round_to_4k_plus_1_and_record_the_actual_duration(tmp_path, duration, fps, frames):
    (video,) = load(one_video(tmp_path, [f"duration_s: {duration}", f"fps: {fps}"])).videos
    assert video.frames == frames
    assert video.duration_s == pytest.approx(frames / fps)
    assert video.requested_duration_s == duration


def test_ids_are_stored_nfc(tmp_path):
    path = write(tmp_path, 'name: t\nvideos:\n  - id: "cafe\\u0301-ü"\n    prompt: p\n')
    (video,) = load(path).videos
    assert video.id == "caf\u00e9-\u00fc"


def test_jsonl_takes_run_fields_from_keywords(tmp_path):
    path = write(tmp_path, '\n{"id": "a", "prompt": "p", "seed": 3}\n\n  \n{"id": "b", "prompt": "q"}\n', "batch-7.jsonl")
    spec = load(path, sets=["steps=8", 'negative_prompt="x"'])
    assert (spec.name, spec.model, spec.output, spec.priority) == ("batch-7", "tiny", None, 0)
    assert [(v.id, v.line, v.seed, v.steps, v.negative_prompt) for v in spec.videos] == [
        ("a", 2, 3, 8, "x"), ("b", 5, None, 8, "x")]
    spec = load(path, name="night", model="tiny", output="s3://b-1/x/", priority=3)
    assert (spec.name, spec.output, spec.priority) == ("night", "s3://b-1/x/", 3)


def test_bom_is_accepted(tmp_path):
    path = write(tmp_path, b"\xef\xbb\xbfname: t\nvideos: [{id: a, prompt: p}]\n")
    assert load(path).name == "t"
    path = write(tmp_path, b'\xef\xbb\xbf{"id": "a", "prompt": "p"}\n', "bom.jsonl")
    assert load(path).videos[0].id == "a"


def test_merge_keys_copy_fields_the_video_does_not_set(tmp_path):
    path = write(tmp_path, """
        name: t
        base: &base {prompt: shared, steps: 5}
        videos:
          - {<<: *base, id: a}
          - {<<: *base, id: b, steps: 2}
    """)
    with pytest.raises(ManifestError) as info:  # `base` itself is not a run field
        load(path)
    assert [(i.line, i.field) for i in info.value.issues] == [(2, "base")]
    path = write(tmp_path, """
        name: t
        defaults: &base {prompt: shared, steps: 5}
        videos:
          - {<<: *base, id: a}
          - {<<: *base, id: b, steps: 2}
    """)
    a, b = load(path).videos
    assert (a.prompt, a.steps, b.prompt, b.steps) == ("shared", 5, "shared", 2)


def test_windows_line_endings(tmp_path):
    path = write(tmp_path, b"name: t\r\nvideos:\r\n  - id: a\r\n    prompt: p\r\n")
    assert [(v.id, v.prompt, v.line) for v in load(path).videos] == [("a", "p", 3)]
    path = write(tmp_path, b'{"id": "a", "prompt": "p"}\r\n{"id": "b", "prompt": "q"}\r\n', "m.jsonl")
    assert [(v.id, v.line) for v in load(path).videos] == [("a", 1), ("b", 2)]


def test_examples_load():
    spec = load(os.path.join(EXAMPLES, "demo.yaml"))
    assert spec.name == "demo" and spec.model == "toy" and len(spec.videos) == 4
    # The trained toy model at its native shape.
    assert all((v.width, v.height, v.frames, v.steps) == (32, 32, 9, 20) for v in spec.videos)


def test_demo_jsonl_is_demo_yaml_as_json_lines():
    """README: `demo.jsonl` is the same run as JSON lines, run with `--model toy` (its name is the file's stem)."""
    yaml_spec = load(os.path.join(EXAMPLES, "demo.yaml"))
    jsonl_spec = load(os.path.join(EXAMPLES, "demo.jsonl"), model="toy")

    def shown(spec):
        return [(v.id, v.prompt, v.seed, v.steps, v.guidance, v.width, v.height, v.frames) for v in spec.videos]

    expected = [
        ("red-circle-left", "a red circle moving left on a black background", None, 20, 2.0, 32, 32, 9),
        ("blue-square-up", "a blue square moving up on a gray background", 42, 20, 2.0, 32, 32, 9),
        ("yellow-circle-right", "a yellow circle moving right on a black background", None, 20, 2.0, 32, 32, 9),
        ("green-square-down", "a green square moving down on a gray background", None, 20, 6.0, 32, 32, 9),
    ]
    assert shown(yaml_spec) == expected and shown(jsonl_spec) == expected
    assert (jsonl_spec.name, jsonl_spec.model) == (yaml_spec.name, yaml_spec.model) == ("demo", "toy")
    # The same content, so the same run: submitting one after the other finds the run the first made.
    assert jsonl_spec.content_sha256 == yaml_spec.content_sha256


# --- Content hash and seeds -----------------------------------------------------------------------------------------

YAML_RUN = """
name: same
output: s3://bucket/p/
priority: 2
defaults:
  steps: 6
videos:
  - id: a
    prompt: a cat
    seed: 1
  - id: b
    prompt: a dog
    negative_prompt: blur
    resolution: 32x32
"""
JSONL_RUN = ('{"id": "a", "prompt": "a cat", "seed": 1}\n'
             '{"id": "b", "prompt": "a dog", "negative_prompt": "blur", "resolution": "32x32"}\n')


def test_content_hash_is_the_same_for_yaml_and_jsonl(tmp_path):
    from_yaml = load(write(tmp_path, YAML_RUN))
    from_jsonl = load(write(tmp_path, JSONL_RUN, "same.jsonl"), output="s3://bucket/p/", priority=2, sets=["steps=6"])
    assert from_yaml.source != from_jsonl.source
    assert from_yaml.videos[0].line != from_jsonl.videos[0].line
    assert from_yaml.content_sha256 == from_jsonl.content_sha256
    assert len(from_yaml.content_sha256) == 64


@pytest.mark.parametrize("old, new", [
    ("name: same", "name: other"), ("priority: 2", "priority: 3"), ("s3://bucket/p/", "s3://bucket/q/"),
    ("steps: 6", "steps: 7"), ("a cat", "a cat."), ("seed: 1", "seed: 2"), ("id: b", "id: c"),
    ("negative_prompt: blur", "negative_prompt: blurs"), ("32x32", "32x48"),
    ("seed: 1", "seed: 1\n    duration_s: 1.01"),  # same 9 frames, other requested duration
    ("seed: 1", "seed: 1\n    guidance: 5.5"), ("seed: 1", "seed: 1\n    fps: 9"),
])
def test_content_hash_changes_with_any_field(tmp_path, old, new):
    assert old in YAML_RUN
    base = load(write(tmp_path, YAML_RUN)).content_sha256
    assert load(write(tmp_path, YAML_RUN.replace(old, new, 1))).content_sha256 != base


def test_content_hash_changes_with_the_model(tmp_path):
    from engine.models.registry import TINY, ModelInfo

    registry = Registry()
    registry.models["tiny2"] = ModelInfo(name="tiny2", defaults=TINY.defaults, max_frames=33)
    path = write(tmp_path, YAML_RUN)
    one = load_manifest(path, registry=registry)
    two = load_manifest(path, registry=registry, model="tiny2")
    assert one.content_sha256 != two.content_sha256


def test_derive_seed_is_deterministic_and_in_range():
    expected = 580902535170594075  # sha256("night\0a")'s first 8 bytes, big-endian, top bit cleared
    assert derive_seed("night", "a") == expected
    assert derive_seed("night", "b") != expected and derive_seed("nighta", "") != expected
    assert all(0 <= derive_seed("r", str(i)) < 2**63 for i in range(200))


# --- Size ------------------------------------------------------------------------------------------------------------


def test_ten_thousand_videos_validate_completely(tmp_path):
    body = "".join(f"  - id: v{i}\n    prompt: a red ball number {i} bouncing on grass\n    seed: {i}\n"
                   f"    negative_prompt: blurry\n    steps: 3\n" for i in range(10_000))
    path = write(tmp_path, "name: big\ndefaults:\n  guidance: 6\nvideos:\n" + body)
    jsonl = write(tmp_path, "".join(json.dumps({"id": f"v{i}", "prompt": f"a red ball number {i}", "seed": i}) + "\n"
                                    for i in range(10_000)), "big.jsonl")
    # Speed is measured by benchmarks, not asserted here: this checks that large files validate completely.
    spec = load(path)
    assert len(spec.videos) == 10_000 and spec.videos[-1].seed == 9_999
    assert len(load(jsonl).videos) == 10_000
