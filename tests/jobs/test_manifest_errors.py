"""Bad manifest files: shape, reading and YAML features; one error per problem, with file, line, field, value."""


import pytest

from jobs.errors import UsageError
from jobs.manifest import ManifestError

from .manifest_helpers import expect, load, one_video, write

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


def test_yaml_control_character_in_a_value_names_the_field_and_value(tmp_path):
    path = write(tmp_path, "name: t\n# " + "é" * 40 + "\nvideos:\n  - {id: a, prompt: \"p\x07\"}\n" + "#\n" * 30)
    expect(path, 4, "videos[0].prompt", r"control character '\x07'", r"'p\x07'", r"\u0007")


def test_yaml_control_character_outside_a_value(tmp_path):
    # Wide characters before it: libyaml reports a byte offset, which must not be read as a character offset.
    path = write(tmp_path, "name: t\n# " + "é" * 40 + "\nvideos:\n  - {id: a, prompt: p} # \x07\n" + "#\n" * 30)
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


def test_bare_date_is_text(tmp_path):
    # YAML 1.2's core schema has no dates: what a user wrote is what the field holds.
    spec = load(one_video(tmp_path, ["negative_prompt: 2024-01-01"]))
    assert spec.videos[0].negative_prompt == "2024-01-01"


def test_field_name_that_is_a_mapping(tmp_path):
    expect(one_video(tmp_path, ["? {a: 1}", ": x"]), 5, "videos[0]", "field name must be plain text")
