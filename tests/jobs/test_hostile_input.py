"""Issue 23's five classes of input that got through or crashed reelbatch, each as a named regression test: an output
that left its allowed prefix, names valid in characters but not in bytes, user text read as terminal markup, numbers
that were not what they looked like, and messages that lost the user's own text. The properties behind them, over
generated input, are in test_input_properties.py."""

import os
import subprocess
import sys

import pytest
from sqlalchemy import func, select

from jobs.db import submission
from jobs.db.connect import session_factory
from jobs.db.rows import Run
from jobs.errors import UsageError
from jobs.manifest import ManifestError
from jobs.manifest.keys import store_for
from jobs.work.schedules import add_schedule

from .manifest_helpers import expect, load, one_video, write

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOY = "model: toy\n"


def cli(cwd, *args, env=None):
    """The real command, as a user runs it."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("REELBATCH_", "AWS_"))}
    return subprocess.run([sys.executable, "-m", "jobs", *args], cwd=cwd, capture_output=True, text=True,
                          env={**base, "PYTHONPATH": REPO, "COLUMNS": "500", **(env or {})}, timeout=120,
                          stdin=subprocess.DEVNULL)


def runs(tmp_path) -> int:
    with session_factory(f"sqlite:///{tmp_path / 'reelbatch.db'}")() as s:
        return s.scalar(select(func.count()).select_from(Run))


# --- 1. An output cannot leave the allowed prefixes -------------------------------------------------------------------


def test_class_1_an_encoded_separator_cannot_take_an_output_above_its_allowed_folder(tmp_path):
    # Checked as allowed/a/b/../.. = allowed/, recorded as allowed/a%2Fb/../.. = tmp_path/: the store wrote above.
    allowed = tmp_path / "allowed"
    path = write(tmp_path, f"name: t\noutput: 'file://{allowed}/a%2Fb/../../'\nvideos: [{{id: a, prompt: p}}]\n")
    expect(path, 2, "output", "contains '%'", "not percent-decoded", allowed_outputs=[f"file://{allowed}/"])
    proc = cli(tmp_path, "submit", str(path), env={"REELBATCH_ALLOWED_OUTPUTS": f"file://{allowed}/"})
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert runs(tmp_path) == 0 and not [p for p in tmp_path.iterdir() if p.is_dir()], "nothing written"


@pytest.mark.parametrize("output", ["file://{allowed}/x/../../", "file://{allowed}/./x/", "file://{allowed}//x/",
                                    "file://{allowed}/%2e%2e/", "s3://bucket/allowed/x/../../",
                                    "s3://bucket/allowed%2F/"])
def test_class_1_dot_parts_and_percent_encoding_are_refused_not_resolved(tmp_path, output):
    allowed = tmp_path / "allowed"
    path = write(tmp_path, f"name: t\noutput: '{output.format(allowed=allowed)}'\nvideos: [{{id: a, prompt: p}}]\n")
    expect(path, 2, "output", "got", allowed_outputs=[f"file://{allowed}/", "s3://bucket/allowed/"])


def test_class_1_the_output_checked_is_the_output_recorded_and_the_store_opened(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = write(tmp_path, "name: t\noutput: file://./renders/[x]/\nvideos: [{id: a, prompt: p}]\n")
    spec = load(path, allowed_outputs=[f"file://{tmp_path}/renders/"], default_output="file://./elsewhere/")
    assert spec.output == f"file://{tmp_path}/renders/[x]/"
    factory = session_factory(f"sqlite:///{tmp_path / 'r.db'}")
    submission.submit_run(factory, spec, output=spec.output)
    with factory() as s:
        assert s.scalar(select(Run.output)) == spec.output
    store = store_for(spec.output)
    assert str(store.root) == f"{tmp_path}/renders/[x]"
    stored = store.put("t/a.mp4", b"x", sha256="2d711642b726b04401627ca9fbac32f5c8530fb1903cc4db02258717921a4881",
                       metadata={})
    assert stored.uri == spec.output + "t/a.mp4" and (tmp_path / "renders" / "[x]" / "t" / "a.mp4").is_file()


# --- 2. Ids and names valid in characters but not in bytes ------------------------------------------------------------


def test_class_2_an_id_of_128_cjk_characters_is_refused_at_submit_naming_its_bytes(tmp_path):
    # 128 x 3 bytes = 384: the local store's temporary name `.{id}.mp4.{16 hex}.tmp` would be 410 bytes.
    path = write(tmp_path, "name: t\nvideos:\n  - id: " + "東" * 128 + "\n    prompt: p\n")
    expect(path, 3, "videos[0].id", "is 384 bytes in UTF-8", "would be 410 bytes, over the 255-byte limit",
           "an id there may be at most 229 bytes", default_output=f"file://{tmp_path}/out/")
    # 76 CJK characters are 228 bytes: they fit.
    ok = write(tmp_path, "name: t\nvideos:\n  - id: " + "東" * 76 + "\n    prompt: p\n", "ok.yaml")
    assert load(ok, default_output=f"file://{tmp_path}/out/").videos[0].id == "東" * 76


def test_class_2_with_s3_the_output_prefix_decides_what_an_id_may_hold(tmp_path):
    path = write(tmp_path, "name: t\nvideos:\n  - id: " + "東" * 128 + "\n    prompt: p\n")
    assert load(path, default_output="s3://bucket/renders/").videos[0].id == "東" * 128  # 384 bytes fit in S3
    # renders/ (8) + p/ x 300 (600) + t/ (2) + 384 + .mp4 (4) = 998 bytes fit; with p/ x 315 it is 1,028.
    assert load(path, default_output="s3://bucket/renders/" + "p/" * 300).videos
    expect(path, 3, "videos[0].id", "its key", "would be 1,028 bytes, over the 1,024-byte limit",
           "at most 380 bytes", default_output="s3://bucket/renders/" + "p/" * 315)


def test_class_2_a_run_name_in_bytes_and_an_output_that_leaves_no_room(tmp_path):
    path = write(tmp_path, "name: " + "é" * 128 + "\nvideos: [{id: a, prompt: p}]\n")
    expect(path, 1, "name", "is 256 bytes in UTF-8", "folder name", "at most 255 bytes",
           default_output=f"file://{tmp_path}/")
    short = write(tmp_path, "name: t\nvideos: [{id: a, prompt: p}]\n", "short.yaml")
    expect(short, 0, "--output", "leaves no room for a run", "1,024-byte limit", output="s3://bucket/" + "p/" * 510)


def test_class_2_a_new_run_suffix_that_would_overflow_is_refused_and_writes_nothing(factory, tmp_path):
    # A 128-character name with `-2` would be 130: over the run name column, a crash in PostgreSQL before.
    path = write(tmp_path, "name: " + "n" * 128 + "\nvideos: [{id: a, prompt: p}]\n")
    spec = load(path)
    submission.submit_run(factory, spec, output="file:///tmp/out/")
    with pytest.raises(UsageError, match=r"'n{128}-2' is 130 characters, over the 128-character limit"):
        submission.submit_run(factory, spec, output="file:///tmp/out/", new_run=True)
    # In bytes: a 255-byte name (85 characters) fits a folder, `-2` would not.
    wide = load(write(tmp_path, "name: " + "東" * 85 + "\nvideos: [{id: a, prompt: p}]\n", "wide.yaml"))
    submission.submit_run(factory, wide, output="file:///tmp/out/")
    with pytest.raises(UsageError, match="is 257 bytes in UTF-8.*folder name.*pass a shorter --name"):
        submission.submit_run(factory, wide, output="file:///tmp/out/", new_run=True)
    with factory() as s:
        assert s.scalar(select(func.count()).select_from(Run)) == 2


def test_class_2_a_schedule_name_must_leave_room_for_its_stamp_in_bytes(tmp_path):
    (tmp_path / "m.yaml").write_text("name: x\nvideos: [{id: a, prompt: p}]\n")
    factory = session_factory(f"sqlite:///{tmp_path / 'r.db'}")
    # 80 characters (under 111) but 240 bytes: with `-20990101T020000Z` a 257-byte folder name.
    with pytest.raises(UsageError, match="is 240 bytes in UTF-8; at most 238"):
        add_schedule(factory, "東" * 80, str(tmp_path / "m.yaml"), "0 2 * * *")
    assert add_schedule(factory, "東" * 79 + "x", str(tmp_path / "m.yaml"), "0 2 * * *").name == "東" * 79 + "x"


# --- 3. User text is not read as terminal markup ----------------------------------------------------------------------


def test_class_3_a_manifest_at_a_path_with_closing_tags_submits(tmp_path):
    folder = tmp_path / "[/x]" / "[bold]b[/bold]"
    folder.mkdir(parents=True)
    (folder / "m.yaml").write_text(TOY + "name: t\nvideos: [{id: a, prompt: p}]\n")
    proc = cli(tmp_path, "submit", "[/x]/[bold]b[/bold]/m.yaml")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "run 1 created t (1 videos, 1 pending)\n"
    bad = cli(tmp_path, "submit", "[/x]/[bold]b[/bold]/missing.yaml")
    assert bad.returncode == 2 and "[/x]/[bold]b[/bold]/missing.yaml" in bad.stderr and "Traceback" not in bad.stderr


def test_class_3_a_report_shows_an_output_with_tags_whole(tmp_path):
    output = f"{tmp_path}/[/][bold]hidden[/bold]:smile:/"
    (tmp_path / "m.yaml").write_text(TOY + f"name: t\noutput: 'file://{output}'\nvideos: [{{id: a, prompt: p}}]\n")
    assert cli(tmp_path, "submit", "m.yaml").returncode == 0
    proc = cli(tmp_path, "report", "t")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0] == f"run 1 t (toy) -> file://{output}"


def test_class_3_control_and_bidi_characters_are_shown_escaped(tmp_path):
    assert cli(tmp_path, "db", "upgrade").returncode == 0  # a database to look the run up in
    proc = cli(tmp_path, "status", "run-\x1b[2J\u202eevil")
    assert proc.returncode == 2
    assert "\x1b" not in proc.stderr and "\u202e" not in proc.stderr
    assert "run-\\x1b[2J\\u202eevil" in proc.stderr


# --- 4. Numbers are what they look like -------------------------------------------------------------------------------


@pytest.mark.parametrize("resolution", ["１２８x６４", "١٢٨x٦٤", "128x６４"])
def test_class_4_resolutions_take_ascii_digits_only(tmp_path, resolution):
    expect(one_video(tmp_path, [f"resolution: {resolution}"]), 5, "videos[0].resolution", repr(resolution))


@pytest.mark.parametrize("line, message", [
    ("seed: 010", "010 is ambiguous: YAML 1.1 reads it as octal 8, YAML 1.2 as 10; write 10, or 0o10 for octal"),
    ("seed: 0777", "0777 is ambiguous: YAML 1.1 reads it as octal 511, YAML 1.2 as 777"),
    ("duration_s: 1:30", "must be a number, got '1:30' (a string)"),
    ("steps: 1_0", "must be an integer from 1 to 200, got '1_0' (a string)"),
    ("steps: ８", "got '８' (a string)"),
])
def test_class_4_yaml_1_1_readings_are_never_taken_silently(tmp_path, line, message):
    expect(one_video(tmp_path, [line]), 5, f"videos[0].{line.split(':')[0]}", message)


def test_class_4_yaml_and_jsonl_read_the_same_text_as_the_same_value(tmp_path):
    fields = {"seed": "0x10", "guidance": "1e1", "duration_s": "0.5e1", "steps": "20"}
    yaml_path = write(tmp_path, "name: same\nvideos:\n  - id: a\n    prompt: p\n" +
                      "".join(f"    {k}: {v}\n" for k, v in fields.items() if k != "seed") + "    seed: 16\n")
    jsonl = write(tmp_path, '{"id": "a", "prompt": "p", "guidance": 1e1, "duration_s": 0.5e1, "steps": 20, '
                            '"seed": 16}\n', "same.jsonl")
    from_yaml, from_jsonl = load(yaml_path), load(jsonl)
    v = from_yaml.videos[0]
    assert (v.guidance, v.requested_duration_s, v.steps, v.seed) == (10.0, 5.0, 20, 16)
    assert from_yaml.content_sha256 == from_jsonl.content_sha256
    assert load(one_video(tmp_path, ["seed: 0x10"])).videos[0].seed == 16  # YAML's hex, the same number
    # A float where an integer belongs is refused in both, as written.
    expect(one_video(tmp_path, ["seed: 1e1"]), 5, "videos[0].seed", "got 1e1 (a number)")
    expect(write(tmp_path, '{"id": "a", "prompt": "p", "seed": 1e1}\n', "f.jsonl"), 1, "seed", "got 1e1 (a number)")


# --- 5. Messages keep the user's own text -----------------------------------------------------------------------------


def test_class_5_1e400_is_reported_as_written(tmp_path):
    expect(write(tmp_path, '{"id": "a", "prompt": "p", "guidance": 1e400}\n', "m.jsonl"), 1, "guidance",
           "must be at least 0 and at most 30, got 1e400")
    expect(one_video(tmp_path, ["guidance: 1e400"]), 5, "videos[0].guidance", "got 1e400")


def test_class_5_a_video_reused_through_an_alias_is_reported_at_its_own_line(tmp_path):
    path = write(tmp_path, """
        name: t
        videos:
          - &base
            id: a
            prompt: p
          - id: b
            prompt: q
          - *base
    """)
    with pytest.raises(ManifestError) as info:
        load(path)
    (issue,) = info.value.issues
    assert (issue.line, issue.field) == (8, "videos[2].id")
    assert issue.message == "duplicate id 'a': already used at line 4 (videos[0]) (video *base, written at line 3)"


def test_class_5_a_raw_nul_is_reported_with_its_field_and_value(tmp_path):
    yaml_path = write(tmp_path, b"name: t\nvideos:\n  - id: a\n    prompt: red\x00circle\n    seed: 1e400\n")
    expect(yaml_path, 4, "videos[0].prompt", r"control character '\x00'", r"'red\x00circle'", r"\u0000")
    expect(yaml_path, 5, "videos[0].seed", "1e400")  # the rest of the file is still checked
    jsonl = write(tmp_path, b'{"id": "a", "prompt": "red\x00circle", "steps": 0}\n', "m.jsonl")
    expect(jsonl, 1, "prompt", r"control character '\x00'", r"'red\x00circle'")
    expect(jsonl, 1, "steps", "got 0")
