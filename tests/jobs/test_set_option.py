"""`--set FIELD=VALUE`: video defaults and the run fields a JSONL manifest has no other way to give (priority, codec,
crf, preset, ...), checked as the file's own; and how a problem with an option or the file as a whole reads (no
`FILE:0:`)."""

import pytest
from sqlalchemy import create_engine, select
from typer.testing import CliRunner

from jobs.cli import app
from jobs.db.rows import Run
from jobs.manifest import ManifestError
from storage.codecs import Encoding

from .manifest_helpers import load, write

JSONL = '{"id": "a", "prompt": "p"}\n'


def test_run_fields_from_set_reach_a_jsonl_run(tmp_path):
    path = write(tmp_path, JSONL, "m.jsonl")
    spec = load(path, sets=["crf=23", "priority=3", "preset=fast", "codec=h264", "steps=4"])
    assert (spec.priority, spec.encoding) == (3, Encoding("h264", 23, "fast"))
    assert spec.videos[0].steps == 4, "a video field is still a default for every video"
    plain = load(path)
    assert (plain.priority, plain.encoding) == (0, Encoding("h264", 18, "medium"))


def test_set_wins_over_the_file_and_the_last_set_wins(tmp_path):
    path = write(tmp_path, "name: t\npriority: 1\ncrf: 30\nvideos: [{id: a, prompt: p}]\n")
    spec = load(path, sets=["crf=20", "priority=5", "crf=25"])
    assert (spec.priority, spec.encoding.crf) == (5, 25)
    assert load(path, sets=["priority=5"], priority=7).priority == 7, "the priority keyword wins over --set"


@pytest.mark.parametrize("entry, message", [
    ("crf=99", "--set: 'crf=99': must be an integer from 0 to 51, got 99"),
    ("priority=10", "--set: 'priority=10': must be an integer from 0 to 9, got 10"),
    ("codec=vp9", "--set: 'codec=vp9': must be one of h264, h265, got 'vp9'"),
    ("preset=quick", "--set: 'preset=quick': must be one of ultrafast, superfast, veryfast, faster, fast, medium, "
                     "slow, slower, veryslow, placebo (fastest to slowest), got 'quick'"),
    ("crf='23'", "--set: \"crf='23'\": must be an integer from 0 to 51, got '23' (a string); write it without quotes"),
    ("model=toy", "--set: 'model=toy': model is a run field with an option of its own: use --model"),
    ("prset=fast", "--set: 'prset=fast': unknown field 'prset' (did you mean 'preset'?)"),
])
def test_a_bad_set_names_the_option_and_the_entry(tmp_path, entry, message):
    with pytest.raises(ManifestError) as info:
        load(write(tmp_path, JSONL, "m.jsonl"), sets=[entry])
    assert str(info.value) == message


def test_the_same_value_in_the_file_reads_as_the_file_does(tmp_path):
    path = write(tmp_path, "name: t\ncrf: 99\nvideos: [{id: a, prompt: p}]\n")
    with pytest.raises(ManifestError) as info:
        load(path)
    assert str(info.value) == f"{path}:2: crf: must be an integer from 0 to 51, got 99"


def env_for(tmp_path, db):
    return {"REELBATCH_DATABASE_URL": f"sqlite:///{db}", "REELBATCH_BROKER_URL": f"sqla+sqlite:///{tmp_path / 'b.db'}",
            "REELBATCH_CACHE_DIR": str(tmp_path), "REELBATCH_OUTPUT": f"file://{tmp_path}/out/"}


def test_submit_records_the_set_run_fields(tmp_path):
    path = write(tmp_path, JSONL, "m.jsonl")
    db = tmp_path / "r.db"
    result = CliRunner().invoke(app, ["submit", str(path), "--set", "crf=23", "--set", "priority=3"],
                                env=env_for(tmp_path, db))
    assert result.exit_code == 0, result.output
    engine = create_engine(f"sqlite:///{db}")
    with engine.connect() as c:
        assert c.execute(select(Run.name, Run.crf, Run.priority, Run.codec, Run.preset)).all() == [
            ("m", 23, 3, "h264", "medium")]
    engine.dispose()


@pytest.mark.parametrize("command", ["submit", "estimate"])
def test_a_bad_set_on_the_command_line_exits_2_and_writes_nothing(tmp_path, command):
    path = write(tmp_path, JSONL, "m.jsonl")
    db = tmp_path / "r.db"
    result = CliRunner().invoke(app, [command, str(path), "--set", "crf=99"], env=env_for(tmp_path, db))
    assert result.exit_code == 2
    assert result.output.strip() == "--set: 'crf=99': must be an integer from 0 to 51, got 99"
    assert not db.exists() and not (tmp_path / "b.db").exists()


# --- Problems not on a line ------------------------------------------------------------------------------------------


def test_an_option_problem_names_the_option_not_line_0(tmp_path):
    path = write(tmp_path, JSONL, "m.jsonl")
    result = CliRunner().invoke(app, ["estimate", str(path), "--model", "nosuch"],
                                env=env_for(tmp_path, tmp_path / "r.db"))
    assert result.exit_code == 2
    assert result.output.strip() == ("--model: 'nosuch' is not registered "
                                     "(registered: tiny, tiny-i2v, toy, toy-fast, toy-i2v)")


def test_file_problems_name_the_file_not_line_0(tmp_path):
    with pytest.raises(ManifestError) as info:
        load(tmp_path / "nope.yaml")
    assert str(info.value) == f"{tmp_path / 'nope.yaml'}: cannot be read: No such file or directory"
    bad_stem = write(tmp_path, JSONL, "a b.jsonl")
    with pytest.raises(ManifestError) as info:
        load(bad_stem)
    assert str(info.value) == (f"{bad_stem}: name: the file's stem 'a b' cannot be the run name: may hold only "
                               "letters, digits, '.', '_' and '-', got 'a b' (has ' '); pass a name (--name)")


def test_the_count_of_unlisted_problems_names_the_file(tmp_path):
    # 600 lines of `{}`: each misses its id and its prompt, 1,200 problems; the first 1,000 are listed.
    path = write(tmp_path, "{}\n" * 600, "m.jsonl")
    with pytest.raises(ManifestError) as info:
        load(path)
    lines = str(info.value).splitlines()
    assert len(lines) == 1001
    assert lines[0] == f"{path}:1: id: missing required field 'id'"
    assert lines[-1] == f"{path}: 200 more problems not listed"
