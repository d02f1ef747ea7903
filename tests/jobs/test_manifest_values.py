"""Bad structure and bad values in a manifest: one error per problem, naming file, line, field and value."""


import pytest

from jobs.manifest import ManifestError

from .manifest_helpers import expect, load, one_video, write

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
    ("steps: yes", "steps", "'yes' (a string)"),
    ("steps: {a: 1}", "steps", "{a} (a mapping)"),
    ("steps:", "steps", "got an empty value"),
    ("steps: ~", "steps", "got ~"),
    ("fps: 8.5", "fps", "8.5 (a number)"),
    ('guidance: "5"', "guidance", "'5' (a string)"),
    ("guidance: false", "guidance", "false (a boolean)"),
    ('duration_s: "2s"', "duration_s", "'2s' (a string)"),
    ("prompt: 123", "prompt", "123 (an integer); quote it"),
    ("prompt: true", "prompt", "true (a boolean); quote it"),
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


@pytest.mark.parametrize("text", ["id: 7", "id: 1.5", "id: true", "id: 1e1"])
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
    issue = expect(one_video(tmp_path, ["duration_s: 300"]), 5, "videos[0].duration_s",
                   "300 s at 8 fps is 2401 frames, 86 chunks of tiny's 33-frame window", "at most 64 chunks "
                   "(1797 frames)", "224.625 s at 8 fps")
    assert "tiny" in issue.message


def test_too_long_is_reported_beside_other_problems_of_the_video(tmp_path):
    path = one_video(tmp_path, ["duration_s: 100", "fps: 60", "steps: 0"])
    expect(path, 5, "videos[0].duration_s", "100 s at 60 fps is 6001 frames")
    expect(path, 7, "videos[0].steps", "got 0")


def test_too_long_from_defaults_is_reported_once_at_defaults(tmp_path):
    path = write(tmp_path, "name: t\ndefaults:\n  duration_s: 100\n  fps: 60\nvideos:\n  - {id: a, prompt: p}\n"
                           "  - {id: b, prompt: p}\n")
    with pytest.raises(ManifestError) as info:
        load(path)
    assert [(i.line, i.field) for i in info.value.issues] == [(3, "defaults.duration_s")]
    assert "100 s at 60 fps is 6001 frames" in info.value.issues[0].message


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
