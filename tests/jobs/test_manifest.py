"""The manifest contract: good files become the expected specs; each kind of bad input is one precise issue."""

import hashlib
import json
import os
import textwrap

import pytest

from engine.models import Registry
from jobs.errors import UsageError
from jobs.manifest import ManifestError, ManifestIssue, RunSpec, derive_seed, load_manifest

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "manifests", "examples")


def write(tmp_path, text, name="m.yaml"):
    path = tmp_path / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    elif name.endswith(".jsonl"):
        path.write_text(text, encoding="utf-8")
    else:
        path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
    return path


def load(path, **kwargs) -> RunSpec:
    return load_manifest(path, registry=Registry(), **kwargs)


def expect(path, line, field, *fragments, **kwargs) -> ManifestIssue:
    """Loading fails with an issue at exactly this line and field whose message holds every fragment."""
    with pytest.raises(ManifestError) as info:
        load(path, **kwargs)
    found = [i for i in info.value.issues if i.line == line and i.field == field]
    assert found, f"no issue at line {line}, field {field!r}; got:\n{info.value}"
    issue = found[0]
    assert issue.file == str(path)
    for fragment in fragments:
        assert fragment in issue.message, f"{fragment!r} not in {issue.message!r}"
    return issue


def one_video(tmp_path, field_lines, name="m.yaml"):
    """A manifest whose only video has id `a`, prompt `p` (unless overridden) and these lines; they start at line 5."""
    body = "".join(f"    {line}\n" for line in field_lines)
    head = "name: t\nvideos:\n  - id: a\n    # the fields under test:\n"
    prompt = "" if any(line.startswith("prompt:") for line in field_lines) else "    prompt: p\n"
    return write(tmp_path, head + body + prompt, name)


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


def test_keyword_arguments_override_the_yaml_run_fields(tmp_path):
    path = write(tmp_path, "name: t\nmodel: nope\noutput: ftp://x\npriority: 99\nvideos: [{id: a, prompt: p}]\n")
    spec = load(path, name="other", model="tiny", output="file://./out", priority=2)
    assert (spec.name, spec.model, spec.output, spec.priority) == ("other", "tiny", "file://./out/", 2)


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
    yaml_spec = load(os.path.join(EXAMPLES, "demo.yaml"))
    jsonl_spec = load(os.path.join(EXAMPLES, "demo.jsonl"))
    for spec in (yaml_spec, jsonl_spec):
        assert spec.name == "demo" and spec.model == "tiny" and 3 <= len(spec.videos) <= 4
        assert any(v.seed is not None for v in spec.videos)
        assert any(v.negative_prompt for v in spec.videos)
        assert all((v.width, v.height, v.frames) == (64, 64, 9) for v in spec.videos)
    assert all(v.steps == 4 for v in yaml_spec.videos)


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
    from engine.models import TINY, ModelInfo

    registry = Registry()
    registry.models["tiny2"] = ModelInfo(name="tiny2", defaults=TINY.defaults, max_frames=33)
    path = write(tmp_path, YAML_RUN)
    one = load_manifest(path, registry=registry)
    two = load_manifest(path, registry=registry, model="tiny2")
    assert one.content_sha256 != two.content_sha256


def test_derive_seed_is_deterministic_and_in_range():
    expected = int.from_bytes(hashlib.sha256(b"night\0a").digest()[:8], "big") & (2**63 - 1)
    assert derive_seed("night", "a") == expected
    assert derive_seed("night", "b") != expected and derive_seed("nighta", "") != expected
    assert all(0 <= derive_seed("r", str(i)) < 2**63 for i in range(200))


# --- Errors: shape --------------------------------------------------------------------------------------------------


def test_error_lists_every_issue_in_line_order_as_file_line_field_message(tmp_path):
    path = write(tmp_path, """
        name: t
        videos:
          - id: a
            prompt: p
            seeed: 3
          - id: a
            prompt: q
            steps: 0
    """)
    with pytest.raises(ManifestError) as info:
        load(path)
    err = info.value
    assert isinstance(err, UsageError) and err.exit_code == 2
    assert [(i.line, i.field) for i in err.issues] == [(5, "videos[0].seeed"), (6, "videos[1].id"),
                                                       (8, "videos[1].steps")]
    assert str(err).splitlines() == [str(i) for i in err.issues]
    assert str(err.issues[0]) == f"{path}:5: videos[0].seeed: unknown field 'seeed' (did you mean 'seed'?)"


def test_long_values_are_cut_in_messages(tmp_path):
    issue = expect(one_video(tmp_path, ["seed: " + "x" * 500]), 5, "videos[0].seed", "'xxxx")
    assert len(issue.message) < 200


# --- Errors: reading the file ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["m.json", "m.txt", "manifest"])
def test_unknown_extension(tmp_path, name):
    expect(write(tmp_path, "name: t\n", name), 0, "(file)", repr(name), ".yaml", ".jsonl")


def test_missing_file(tmp_path):
    expect(tmp_path / "nope.yaml", 0, "(file)", "No such file")


def test_non_utf8_names_the_line_of_the_first_bad_byte(tmp_path):
    path = write(tmp_path, b"name: t\nvideos:\n  - id: a\n    prompt: caf\xe9 \xff\n")
    expect(path, 4, "(file)", "not UTF-8", r"b'\xe9'")


def test_non_utf8_jsonl(tmp_path):
    expect(write(tmp_path, b'{"id": "a", "prompt": "p"}\n{"id": "\xc3("}\n', "m.jsonl"), 2, "(file)", r"b'\xc3'")


@pytest.mark.parametrize("size", [64 * 2**20 + 1, 2**30])
def test_oversized_file_is_refused_without_reading_it(tmp_path, size):
    path = tmp_path / "big.yaml"
    with open(path, "wb") as fh:
        fh.truncate(size)  # sparse: instant to make, and seconds to read were it read
    expect(path, 0, "(file)", f"{size:,} bytes", "64 MiB")


def test_a_file_of_exactly_64_mib_is_read(tmp_path):
    head = b"name: t\nvideos: [{id: a, prompt: p}]\n#"
    path = write(tmp_path, head + b"x" * (64 * 2**20 - len(head) - 1) + b"\n")
    assert path.stat().st_size == 64 * 2**20
    assert load(path).name == "t"


def test_endless_stream_is_cut_at_the_limit(tmp_path):
    path = tmp_path / "zero.yaml"
    path.symlink_to("/dev/zero")  # a size of 0 that never ends: only the bounded read stops it
    # Unbounded, this read would never end: reaching the error at all is the proof.
    expect(path, 0, "(file)", "67,108,865 bytes")


@pytest.mark.parametrize("text", ["", "\n\n", "# only a comment\n  # another\n"])
def test_empty_yaml(tmp_path, text):
    expect(write(tmp_path, text), 1, "(file)", "empty")


@pytest.mark.parametrize("text", ["", "\n  \n\n"])
def test_empty_jsonl(tmp_path, text):
    expect(write(tmp_path, text, "m.jsonl"), 1, "(file)", "no videos")


def test_yaml_syntax_error_names_the_line(tmp_path):
    path = write(tmp_path, "name: t\nvideos:\n  - id: a\n    prompt: a: b\n")
    expect(path, 4, "(syntax)", "mapping values are not allowed", "prompt: a: b")


def test_yaml_second_document(tmp_path):
    expect(write(tmp_path, "name: t\nvideos: [{id: a, prompt: p}]\n---\nname: u\n"), 3, "(syntax)", "'---'")


def test_yaml_control_character(tmp_path):
    # Wide characters before it: libyaml reports a byte offset, which must not be read as a character offset.
    path = write(tmp_path, "name: t\n# " + "é" * 40 + "\nvideos:\n  - {id: a, prompt: \"p\x07\"}\n" + "#\n" * 30)
    expect(path, 4, "(syntax)", "#x0007")


def test_jsonl_syntax_error_names_the_record_line(tmp_path):
    path = write(tmp_path, '{"id": "a", "prompt": "p"}\n{"id": "b", "prompt": }\n{"id": "c", "prompt": "q"}\n',
                 "m.jsonl")
    issue = expect(path, 2, "(syntax)", "Expecting value", "column 23", '"prompt": }')
    assert issue.message.count("\n") == 0


def test_too_many_videos(tmp_path):
    path = write(tmp_path, "name: t\nvideos: [" + "{}, " * 100_001 + "]\n")
    expect(path, 2, "videos", "100,001 videos", "100,000")


def test_too_many_jsonl_videos(tmp_path):
    path = write(tmp_path, "{}\n" * 100_000 + '\n{"id": "last", "prompt": "p"}\n', "m.jsonl")
    with pytest.raises(ManifestError) as info:
        load(path)
    # Only the count: 100,000 videos missing an id would bury it.
    assert [(i.line, i.field) for i in info.value.issues] == [(100_002, "(file)")]
    assert "more than 100,000 videos" in info.value.issues[0].message


# --- Errors: YAML's own features ------------------------------------------------------------------------------------


def test_alias_bomb_is_refused_quickly(tmp_path):
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, 9):
        prev, cur = chr(ord("a") + i - 1), chr(ord("a") + i)
        lines.append(f"{cur}: &{cur} [" + ",".join([f"*{prev}"] * 9) + "]")
    path = write(tmp_path, "\n".join(lines) + "\nname: t\nvideos: *i\n")
    # Expanded, this document holds 9**9 strings: the count stops it long before, with bounded memory.
    issue = expect(path, 7, "(file)", "billion laughs", "at alias *")
    assert "2,500,000" in issue.message


def test_recursive_alias(tmp_path):
    path = write(tmp_path, "name: t\nvideos: &v\n  - *v\n")
    expect(path, 3, "videos[0]", "recursive alias", "*v")


def test_deep_nesting_is_refused(tmp_path):
    path = write(tmp_path, "name: t\nvideos:\n  - id: a\n    prompt: " + "[" * 40 + "]" * 40 + "\n")
    # The top mapping, videos, the video and 29 lists make 32 levels; the 30th list is one too many.
    expect(path, 4, "videos[0].prompt" + "[0]" * 29, "nested more than 32 levels")


def test_undefined_alias(tmp_path):
    expect(one_video(tmp_path, ["seed: *nope"]), 5, "videos[0].seed", "*nope", "not defined")


@pytest.mark.parametrize("value, tag", [
    ("!!python/object:os.system x", "!!python/object:os.system"),
    ("!!python/name:os.system ''", "!!python/name:os.system"),
    ("!custom x", "!custom"),
    ("!!binary aGVsbG8=", "!!binary"),
    ("!!set {a, b}", "!!set"),
    ("!!omap [{a: 1}]", "!!omap"),
    ("!!timestamp 2024-01-01", "!!timestamp"),
    ("!!str [a]", "!!str"),
])
def test_tags_other_than_plain_types_are_refused(tmp_path, value, tag):
    issue = expect(one_video(tmp_path, [f"negative_prompt: {value}"]), 5, "videos[0].negative_prompt", tag)
    assert "not allowed" in issue.message


def test_merge_of_a_scalar(tmp_path):
    expect(write(tmp_path, "name: t\nvideos:\n  - id: a\n    prompt: p\n    <<: just text\n"), 5, "videos[0]",
           "'<<' must merge a mapping", "'just text'")


def test_plain_explicit_tags_are_allowed(tmp_path):
    (video,) = load(one_video(tmp_path, ['seed: !!int "42"', "negative_prompt: !!str 2024-01-01"])).videos
    assert (video.seed, video.negative_prompt) == (42, "2024-01-01")


def test_tag_on_a_field_name(tmp_path):
    expect(one_video(tmp_path, ["!!binary c2VlZA==: 1"]), 5, "videos[0]", "!!binary", "c2VlZA==")


def test_bare_date_as_a_string_field(tmp_path):
    expect(one_video(tmp_path, ["negative_prompt: 2024-01-01"]), 5, "videos[0].negative_prompt",
           "2024-01-01", "a date", "quote it")


def test_field_name_that_is_a_mapping(tmp_path):
    expect(one_video(tmp_path, ["? {a: 1}", ": x"]), 5, "videos[0]", "field name must be plain text")


# --- Errors: structure ----------------------------------------------------------------------------------------------


def test_top_level_list(tmp_path):
    expect(write(tmp_path, "- id: a\n  prompt: p\n"), 1, "(top level)", "must be a mapping", "under 'videos:'")


def test_top_level_scalar(tmp_path):
    expect(write(tmp_path, "just some words\n"), 1, "(top level)", "'just some words'")


def test_video_that_is_a_list(tmp_path):
    expect(write(tmp_path, "name: t\nvideos:\n  - [a, p]\n"), 3, "videos[0]", "must be a mapping", "a list of 2")


def test_video_that_is_a_string(tmp_path):
    expect(write(tmp_path, "name: t\nvideos:\n  - a cat\n"), 3, "videos[0]", "must be a mapping", "'a cat'")


def test_jsonl_record_that_is_not_an_object(tmp_path):
    path = write(tmp_path, '{"id": "a", "prompt": "p"}\n["b", "q"]\n', "m.jsonl")
    expect(path, 2, "(video)", "must be a mapping", "a list of 2")


def test_defaults_that_is_a_list(tmp_path):
    path = write(tmp_path, "name: t\ndefaults:\n  - steps: 4\nvideos: [{id: a, prompt: p}]\n")
    expect(path, 2, "defaults", "must be a mapping", "a list of 1")


def test_videos_that_is_a_mapping(tmp_path):
    path = write(tmp_path, "name: t\nvideos:\n  id: a\n  prompt: p\n")
    expect(path, 2, "videos", "must be a list", "{id, prompt}")


@pytest.mark.parametrize("text, line", [("name: t\nvideos: []\n", 2), ("name: t\nvideos:\n", 2)])
def test_no_videos(tmp_path, text, line):
    expect(write(tmp_path, text), line, "videos", "is empty")


def test_missing_name_and_videos(tmp_path):
    path = write(tmp_path, "model: tiny\n")
    expect(path, 1, "name", "missing required field 'name'")
    expect(path, 1, "videos", "missing required field 'videos'")


def test_missing_id_and_prompt(tmp_path):
    path = write(tmp_path, "name: t\nvideos:\n  - seed: 1\n")
    expect(path, 3, "videos[0].id", "missing required field 'id'")
    expect(path, 3, "videos[0].prompt", "missing required field 'prompt'")


def test_missing_prompt_in_jsonl(tmp_path):
    expect(write(tmp_path, '{"id": "a"}\n', "m.jsonl"), 1, "prompt", "missing required field 'prompt'")


def test_json_null_where_a_value_belongs(tmp_path):
    expect(write(tmp_path, '{"id": "a", "prompt": null}\n', "m.jsonl"), 1, "prompt", "got null")


def test_unknown_video_field_suggests_the_closest(tmp_path):
    expect(one_video(tmp_path, ["negativ_prompt: x"]), 5, "videos[0].negativ_prompt",
           "'negativ_prompt'", "did you mean 'negative_prompt'?")


def test_unknown_run_field_suggests_the_closest(tmp_path):
    expect(write(tmp_path, "name: t\nvidoes: []\n"), 2, "vidoes", "did you mean 'videos'?")


def test_video_field_at_the_top_level(tmp_path):
    expect(write(tmp_path, "name: t\nsteps: 4\nvideos: [{id: a, prompt: p}]\n"), 2, "steps", "under 'defaults'")


def test_unknown_jsonl_field(tmp_path):
    expect(write(tmp_path, '{"id": "a", "prompt": "p", "sed": 1}\n', "m.jsonl"), 1, "sed", "did you mean 'seed'?")


def test_unknown_default_field(tmp_path):
    path = write(tmp_path, "name: t\ndefaults:\n  stepz: 4\nvideos: [{id: a, prompt: p}]\n")
    expect(path, 3, "defaults.stepz", "did you mean 'steps'?")


def test_id_cannot_have_a_default(tmp_path):
    path = write(tmp_path, "name: t\ndefaults:\n  id: x\nvideos: [{prompt: p}]\n")
    expect(path, 3, "defaults.id", "'x'", "cannot have a default")


def test_duplicate_ids_name_both_lines(tmp_path):
    path = write(tmp_path, "name: t\nvideos:\n  - id: a\n    prompt: p\n  - id: b\n    prompt: p\n  - id: a\n    prompt: p\n")
    expect(path, 7, "videos[2].id", "duplicate id 'a'", "line 3", "videos[0]")


def test_duplicate_ids_compare_nfc(tmp_path):
    path = write(tmp_path, 'name: t\nvideos:\n  - {id: "caf\\u00e9", prompt: p}\n  - {id: "cafe\\u0301", prompt: p}\n')
    expect(path, 4, "videos[1].id", "duplicate id 'café'", "line 3")


def test_duplicate_ids_in_jsonl(tmp_path):
    path = write(tmp_path, '{"id": "a", "prompt": "p"}\n\n{"id": "a", "prompt": "q"}\n', "m.jsonl")
    expect(path, 3, "id", "duplicate id 'a'", "line 1")


def test_duplicate_key_in_yaml(tmp_path):
    expect(one_video(tmp_path, ["seed: 1", "seed: 2"]), 6, "videos[0].seed", "duplicate field 'seed'", "line 5")


def test_duplicate_key_in_json(tmp_path):
    path = write(tmp_path, '{"id": "a", "prompt": "p", "seed": 1, "seed": 2}\n', "m.jsonl")
    expect(path, 1, "seed", "duplicate field 'seed'", "1 and 2")


# --- Errors: values -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("line, field, shown", [
    ('seed: "42"', "seed", "'42' (a string); write it without quotes"),
    ("seed: 4.0", "seed", "4.0 (a number)"),
    ("seed: true", "seed", "true (a boolean)"),
    ("seed: [1]", "seed", "a list of 1"),
    ("steps: yes", "steps", "yes (a boolean)"),
    ("steps: {a: 1}", "steps", "{a} (a mapping)"),
    ("steps:", "steps", "got an empty value"),
    ("steps: ~", "steps", "got ~"),
    ("fps: 8.5", "fps", "8.5 (a number)"),
    ('guidance: "5"', "guidance", "'5' (a string)"),
    ("guidance: false", "guidance", "false (a boolean)"),
    ('duration_s: "2s"', "duration_s", "'2s' (a string)"),
    ("prompt: 123", "prompt", "123 (an integer); quote it"),
    ("prompt: no", "prompt", "no (a boolean); quote it"),
    ("prompt: [a, b]", "prompt", "a list of 2"),
    ("negative_prompt: 1.5", "negative_prompt", "1.5 (a number); quote it"),
    ("resolution: 480", "resolution", "480 (an integer)"),
    ('seed: !!int ""', "seed", "'' cannot be read as int"),
    ("guidance: !!float abc", "guidance", "'abc' cannot be read as float"),
    ("steps: !!bool maybe", "steps", "'maybe' cannot be read as bool"),
    ("seed: 0x1F2G", "seed", "'0x1F2G' (a string)"),
])
def test_wrong_types(tmp_path, line, field, shown):
    expect(one_video(tmp_path, [line]), 5, f"videos[0].{field}", shown)


@pytest.mark.parametrize("text", ["id: 001", "id: 7", "id: 1.5", "id: true", "id: 2024-01-01"])
def test_id_that_is_not_a_string_says_quote_it(tmp_path, text):
    raw = text.split(": ")[1]
    path = write(tmp_path, f"name: t\nvideos:\n  - {text}\n    prompt: p\n")
    expect(path, 3, "videos[0].id", f'quote it: "{raw}"')


@pytest.mark.parametrize("line, field, shown", [
    ("seed: -1", "seed", "-1"),
    ("seed: 9223372036854775808", "seed", "9223372036854775808"),
    ("fps: 0", "fps", "got 0"),
    ("fps: 61", "fps", "61"),
    ("steps: 201", "steps", "201"),
    ("guidance: 30.5", "guidance", "30.5"),
    ("guidance: -1", "guidance", "-1"),
    ("duration_s: 0", "duration_s", "got 0"),
    ("duration_s: 600.5", "duration_s", "600.5"),
    ("resolution: 8x8", "resolution", "'8x8'"),
    ("resolution: 4096x64", "resolution", "4096"),
    ("resolution: 72x64", "resolution", "width 72"),
    ("resolution: 64x40", "resolution", "height 40"),
    ("resolution: 64 by 64", "resolution", "'64 by 64'"),
    ("resolution: 1080p", "resolution", "'1080p'"),
    ("prompt: '   '", "prompt", "'   '"),
    ("prompt: ''", "prompt", "''"),
    (f"prompt: {'w' * 10_001}", "prompt", "10001 characters"),
    (f"negative_prompt: {'w' * 10_001}", "negative_prompt", "10001 characters"),
    ('prompt: "a\\0b"', "prompt", r"'\x00'"),
])
def test_values_out_of_range(tmp_path, line, field, shown):
    expect(one_video(tmp_path, [line]), 5, f"videos[0].{field}", shown)


@pytest.mark.parametrize("text", [".nan", ".NaN", ".inf", "-.inf", "+.Inf"])
def test_non_finite_yaml_numbers(tmp_path, text):
    expect(one_video(tmp_path, [f"guidance: {text}"]), 5, "videos[0].guidance", "finite", text)


@pytest.mark.parametrize("text", ["NaN", "Infinity", "-Infinity"])
def test_non_finite_json_numbers(tmp_path, text):
    path = write(tmp_path, f'{{"id": "a", "prompt": "p", "duration_s": {text}}}\n', "m.jsonl")
    expect(path, 1, "duration_s", "finite", text)


def test_lone_surrogate_in_json(tmp_path):
    expect(write(tmp_path, '{"id": "a", "prompt": "p\\ud800"}\n', "m.jsonl"), 1, "prompt", r"'\ud800'")


def test_huge_integer_in_json(tmp_path):
    expect(write(tmp_path, '{"id": "a", "prompt": "p", "seed": ' + "9" * 5000 + "}\n", "m.jsonl"),
           1, "(syntax)", "ValueError")


def test_huge_integer_in_yaml(tmp_path):
    expect(one_video(tmp_path, ["seed: " + "9" * 5000]), 5, "videos[0].seed", "cannot be read as int", "999")


def test_too_long_for_the_model_names_the_max_duration(tmp_path):
    issue = expect(one_video(tmp_path, ["duration_s: 5"]), 5, "videos[0].duration_s", "5 s at 8 fps is 41 frames",
                   "at most 33 frames", "4.125 s at 8 fps")
    assert "tiny" in issue.message


def test_too_long_is_reported_beside_other_problems_of_the_video(tmp_path):
    path = one_video(tmp_path, ["fps: 60", "steps: 0"])
    expect(path, 5, "videos[0].duration_s", "1 s at 60 fps is 61 frames")
    expect(path, 6, "videos[0].steps", "got 0")


def test_too_long_from_defaults_is_reported_once_at_defaults(tmp_path):
    path = write(tmp_path, "name: t\ndefaults:\n  fps: 60\nvideos:\n  - {id: a, prompt: p}\n  - {id: b, prompt: p}\n")
    with pytest.raises(ManifestError) as info:
        load(path)
    assert [(i.line, i.field) for i in info.value.issues] == [(3, "defaults.fps")]
    assert "1 s at 60 fps is 61 frames" in info.value.issues[0].message


@pytest.mark.parametrize("value, shown", [
    ("..", "'..'"), (".", "'.'"), ("a/b", "'/'"), ("a\\\\b", "'\\\\'"), ("a\\0b", r"'\x00'"),
    ("a b", "' '"), ("a\U0001F600", "'\U0001F600'"), ("x" * 129, "129"), ("", "''"), ("\\u0301a", "'\u0301'"),
])
def test_bad_ids(tmp_path, value, shown):
    path = write(tmp_path, f'name: t\nvideos:\n  - id: "{value}"\n    prompt: p\n')
    expect(path, 3, "videos[0].id", shown)


@pytest.mark.parametrize("value, shown", [("..", "'..'"), ("../up", "'/'"), ("a\\\\b", "'\\\\'")])
def test_bad_run_names(tmp_path, value, shown):
    path = write(tmp_path, f'name: "{value}"\nvideos: [{{id: a, prompt: p}}]\n')
    expect(path, 1, "name", shown)


def test_good_unicode_ids(tmp_path):
    path = write(tmp_path, "name: 夜-run_1.0\nvideos:\n  - {id: नमस्ते, prompt: p}\n  - {id: Ünïcödé_1.2-x, prompt: p}\n")
    assert [v.id for v in load(path).videos] == ["नमस्ते", "Ünïcödé_1.2-x"]


def test_jsonl_file_name_that_cannot_be_a_run_name(tmp_path):
    path = write(tmp_path, '{"id": "a", "prompt": "p"}\n', "my videos.jsonl")
    expect(path, 0, "name", "'my videos'", "--name")
    assert load(path, name="ok").name == "ok"


def test_jsonl_id_that_is_a_number(tmp_path):
    expect(write(tmp_path, '{"id": 1, "prompt": "p"}\n', "m.jsonl"), 1, "id", 'quote it: "1"')


# --- Errors: run fields and keyword arguments -----------------------------------------------------------------------


def test_unregistered_model_lists_the_registered(tmp_path):
    path = write(tmp_path, "name: t\nmodel: wan-14b\nvideos: [{id: a, prompt: p}]\n")
    expect(path, 2, "model", "'wan-14b'", "not registered", "registered: tiny")


def test_unregistered_model_from_keyword(tmp_path):
    expect(write(tmp_path, '{"id": "a", "prompt": "p"}\n', "m.jsonl"), 0, "--model", "'wan'", "tiny", model="wan")


@pytest.mark.parametrize("uri", ["http://example.com/x/", "/abs/path/", "file://relative/", "s3:///nobucket/",
                                 "s3://Bad_Bucket/x/", "s3://bucket/a/../b/", "s3://bucket/a//b/", "s3://bucket/a?x"])
def test_bad_output_uri(tmp_path, uri):
    path = write(tmp_path, f"name: t\noutput: '{uri}'\nvideos: [{{id: a, prompt: p}}]\n")
    expect(path, 2, "output", repr(uri)[:-1])


@pytest.mark.parametrize("uri", ["file:///srv/out/", "file:///srv/out", "file://./out/", "file://../up/",
                                 "s3://bucket", "s3://bucket/a/b/", "s3://b.c-d/x"])
def test_good_output_uri(tmp_path, uri):
    path = write(tmp_path, f"name: t\noutput: '{uri}'\nvideos: [{{id: a, prompt: p}}]\n")
    assert load(path).output == uri.rstrip("/") + "/"


@pytest.mark.parametrize("uri, ok", [
    ("s3://bucket/a/", True), ("s3://bucket/a/x/", True), ("s3://bucket/a", True),
    ("s3://bucket/ab/", False), ("s3://bucket/", False), ("s3://bucket2/a/", False),
    ("file:///srv/out/run/", True), ("file:///srv/out/./x/", True), ("file:///srv/outer/", False),
    ("file:///srv/out/../etc/", False), ("file:///srv/out/%2e%2e/etc/", False), ("file://./x/", False),
])
def test_allowed_outputs(tmp_path, uri, ok):
    path = write(tmp_path, f"name: t\noutput: '{uri}'\nvideos: [{{id: a, prompt: p}}]\n")
    allowed = ["s3://bucket/a/", "file:///srv/out"]
    if ok:
        assert load(path, allowed_outputs=allowed).output.startswith(uri.split("/")[0])
    else:
        expect(path, 2, "output", repr(uri if uri.endswith("/") else uri + "/"), "allowed",
               allowed_outputs=allowed)


def test_allowed_outputs_checks_the_keyword_output(tmp_path):
    path = write(tmp_path, '{"id": "a", "prompt": "p"}\n', "m.jsonl")
    expect(path, 0, "--output", "'s3://other/'", output="s3://other/", allowed_outputs=["s3://bucket/"])
    assert load(path, allowed_outputs=["s3://bucket/"]).output is None  # no output: the operator's default


def test_bad_priority_from_keyword(tmp_path):
    expect(write(tmp_path, '{"id": "a", "prompt": "p"}\n', "m.jsonl"), 0, "--priority", "got 12", priority=12)


@pytest.mark.parametrize("entry, shown", [
    ("steps", "'steps'"), ("stepz=3", "did you mean 'steps'?"), ("steps=abc", "'abc' (a string)"),
    ("steps='8'", "'8' (a string)"), ("id=x", "cannot have a default"), ("fps=[1, 2]", "single value"),
    ("seed=!!binary eA==", "!!binary"), ("guidance=.nan", ".nan"),
])
def test_bad_set(tmp_path, entry, shown):
    path = write(tmp_path, '{"id": "a", "prompt": "p"}\n', "m.jsonl")
    issue = expect(path, 0, "--set", shown, sets=[entry])
    assert repr(entry) in issue.message or entry.startswith("steps")


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
