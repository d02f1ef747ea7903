"""Properties over generated input (Hypothesis), issue 23: whatever ids, run names and outputs a manifest holds,
plain or percent-encoded, with dot parts or hundreds of bytes, `reelbatch submit` either accepts it, and every object
the run will write then lands inside its allowed prefix and within the store's limits (written for real, to a local
folder and to the S3-protocol server), or refuses it with exit 2 and writes nothing. And whatever string a user
gives, every way the CLI prints one shows it unchanged (control and bidi characters escaped), without a crash.
The named cases behind these are in test_hostile_input.py."""

import json
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from rich.progress import BarColumn, Progress
from rich.table import Table
from sqlalchemy import select, update
from typer.testing import CliRunner

from jobs.cli.app import app
from jobs.cli.console import err, fail, literal, out, progress_text, visible
from jobs.db.connect import session_factory
from jobs.db.rows import Run, Video
from jobs.errors import UsageError
from jobs.manifest.keys import longest_video_keys, result_keys, store_for
from jobs.reports.text import print_report

# Bounded so that the file's tests take about half a minute on one core (S3's, over HTTP, the most).
EXAMPLES = settings(max_examples=40, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
S3_EXAMPLES = settings(EXAMPLES, max_examples=25)

# Pieces of names: plain, accented (2 bytes) and CJK (3 bytes) letters and a combining mark, some long enough to pass
# a store's limit in bytes; and what must be refused: separators and encodings of them, dot parts, an emoji, a space,
# NUL, a bidi override, markup.
NAME_OK = st.sampled_from(["a", "Z", "0", ".", "_", "-", "é", "東", "e\u0301", "東" * 40, "é" * 30, "x" * 60])
NAME_BAD = st.sampled_from(["..", "/", "%2F", "%2e", " ", "\\", "\x00", "\u202e", "[b]", "\U0001F600"])
# Pieces of an output's folders under the allowed prefix: plain, with characters a URI would encode, long ones
# (towards PATH_MAX and an S3 key's 1,024 bytes); and dot parts, empty parts and percent-encodings.
PART_OK = st.sampled_from(["x", "é", "東東", "[b]", " ", "d" * 250, "東" * 80])
PART_BAD = st.sampled_from(["..", ".", "", "%2F", "%2e%2e", "a%2Fb"])


def case(name, part):
    return st.fixed_dictionaries({
        "name": st.lists(name, min_size=1, max_size=6).map("".join),
        "ids": st.lists(st.lists(name, min_size=1, max_size=6).map("".join), min_size=1, max_size=3, unique=True),
        "parts": st.lists(st.lists(part, min_size=1, max_size=3).map("".join), max_size=16),
        "duration": st.sampled_from([1, 5]),  # tiny's window is 33 frames: 5 s at 8 fps is 2 chunks, checkpointed
    })


def manifests(part_ok):
    """Three in four made of good pieces only, so that most get as far as the limits in bytes."""
    good = case(NAME_OK, part_ok)
    return st.one_of(good, good, good, case(st.one_of(NAME_OK, NAME_BAD), st.one_of(part_ok, PART_BAD)))


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """One database and broker for every example of a test: `--new-run` keeps the generated names apart."""
    folder = tmp_path_factory.mktemp("work")
    (folder / "meta").mkdir()  # the manifest, the database and the broker; every other file is a store's
    return folder, {"REELBATCH_DATABASE_URL": f"sqlite:///{folder / 'meta' / 'r.db'}",
                    "REELBATCH_BROKER_URL": f"sqla+sqlite:///{folder / 'meta' / 'broker.db'}"}


def runs(env) -> list:
    with session_factory(env["REELBATCH_DATABASE_URL"])() as s:
        videos = {}
        for v in s.scalars(select(Video).order_by(Video.id)):
            videos.setdefault(v.run_id, []).append((v.key, v.chunks))
        return [(r.id, r.name, r.output, videos.get(r.id, [])) for r in s.scalars(select(Run).order_by(Run.id))]


def submit(work, case: dict, root: str, allowed: str):
    """`reelbatch submit --new-run` in this process on a manifest made of `case`, its output under `root`: the new
    run (id, name, output, [(id, chunks)]), or None when it was refused (exit 2, and no run was recorded)."""
    folder, env = work
    output = root + "/".join(case["parts"]) + ("/" if case["parts"] else "")
    quoted = lambda text: json.dumps(text, ensure_ascii=False)  # noqa: E731 - a YAML double-quoted string
    videos = "".join(f"  - id: {quoted(i)}\n    prompt: p\n    duration_s: {case['duration']}\n" for i in case["ids"])
    path = folder / "meta" / "m.yaml"
    path.write_text(f"name: {quoted(case['name'])}\noutput: {quoted(output)}\nvideos:\n{videos}",
                    encoding="utf-8")
    before = runs(env)
    result = CliRunner().invoke(app, ["submit", str(path), "--new-run"],
                                env={**env, "REELBATCH_ALLOWED_OUTPUTS": allowed})
    assert result.exit_code in (0, 2), result.output
    assert "Traceback" not in result.output
    event("accepted" if result.exit_code == 0 else "refused, a limit in bytes" if " bytes" in result.stderr
          else "refused")
    after = runs(env)
    if result.exit_code == 2:
        assert after == before, "a refused manifest records nothing"
        return None
    assert len(after) == len(before) + 1
    return after[-1]


def write_as_a_worker_would(output: str, name: str, videos) -> list[str]:
    """Store an object at the longest key of each kind the run's worker writes (a video's MP4, or its last chunk's
    checkpoint, the longer; the results file), through the real store; their URIs."""
    store = store_for(output)
    keys = [max(result_keys(name), key=len)] + [max(longest_video_keys(name, key, chunks), key=len)
                                                for key, chunks in videos]
    return [store.put(k, b"x", sha256="2d711642b726b04401627ca9fbac32f5c8530fb1903cc4db02258717921a4881",
                      metadata={}).uri for k in keys]


def files_under(folder: Path) -> set[str]:
    """Every file in the work folder and below, but the manifest, database and broker."""
    return {os.path.join(d, f) for d, _, files in os.walk(folder) for f in files} - files_in(folder / "meta")


def files_in(folder: Path) -> set[str]:
    return {os.path.join(d, f) for d, _, files in os.walk(folder) for f in files}


@EXAMPLES
@given(case=manifests(st.one_of(PART_OK, st.sampled_from(["#1", "?"]))))  # literal characters in a folder name
def test_a_local_run_stays_in_its_allowed_folder_and_fits_the_file_system(work, case):
    area = work[0] / "area"
    allowed = area / "allowed"
    before = files_under(work[0])
    run = submit(work, case, f"file://{allowed}/", f"file://{allowed}/")
    if run is None:
        assert files_under(work[0]) == before, "a refused manifest writes nothing"
        return
    _, name, output, videos = run
    assert output.startswith(f"file://{allowed}/")
    uris = write_as_a_worker_would(output, name, videos)
    assert all(uri.startswith(output) for uri in uris)
    # Every new file, resolved, is inside the allowed folder: nothing was written beside or above it.
    new = files_under(work[0]) - before
    assert new and all(os.path.realpath(f).startswith(f"{allowed}/") for f in new)


@pytest.fixture
def s3_client(s3_env):
    import boto3

    return boto3.session.Session().client("s3")


@S3_EXAMPLES
@given(case=manifests(PART_OK))
def test_an_s3_run_stays_under_its_allowed_prefix_and_fits_a_key(s3_env, s3_client, work, case):
    client = s3_client

    def listed() -> set[str]:
        pages = client.get_paginator("list_objects_v2").paginate(Bucket=s3_env)
        return {o["Key"] for page in pages for o in page.get("Contents", [])}

    before = listed()
    run = submit(work, case, f"s3://{s3_env}/allowed/", f"s3://{s3_env}/allowed/")
    if run is None:
        assert listed() == before, "a refused manifest writes nothing"
        return
    _, name, output, videos = run
    assert output.startswith(f"s3://{s3_env}/allowed/")
    uris = write_as_a_worker_would(output, name, videos)
    assert all(uri.startswith(output) for uri in uris)
    new = listed() - before
    assert new and all(key.startswith("allowed/") and len(key.encode()) <= 1024 for key in new)


# --- Printing ---------------------------------------------------------------------------------------------------------

# Markup, emoji codes, escapes that drive a terminal, bidi controls, and anything else Unicode holds (no newline: a
# table cell would put the rest of its line between the halves).
HOSTILE = st.lists(st.one_of(st.sampled_from(["[", "]", "[/]", "[bold]", "[/x]", "[red]x[/red]", ":smile:", "\\",
                                              "\x1b[31m", "\x1b]0;title\x07", "\x00", "\r", "\t", "\u202e", "\u200f",
                                              "\u2066", "\u2028", "é", "東", "\U0001F600", "\u0301"]),
                             st.text(st.characters(exclude_characters="\n"), max_size=5)),
                   min_size=1, max_size=12).map("".join).filter(bool)


@pytest.fixture
def wide():
    """The CLI's own consoles, wide enough that no table cell is folded (the width a pipe gets; see console.py)."""
    widths = out.width, err.width
    out.width = err.width = 100_000
    yield
    out.width, err.width = widths


def shown_in(text: str, printed: str) -> None:
    """`text` is in what was printed, as it is (control and bidi characters escaped), and nothing raw leaked."""
    assert visible(text) in printed
    assert visible(printed) == printed


@EXAMPLES
@given(text=HOSTILE)
def test_every_way_the_cli_prints_user_text_shows_it_unchanged(wide, capsys, text):
    assert visible(text) == text or any(ord(c) < 32 or 0x7f <= ord(c) <= 0x9f or c in "\u202e\u200f\u2066\u2028"
                                        for c in text)
    # An error, as every command ends on bad input.
    with pytest.raises(Exception):  # typer.Exit
        fail(UsageError(text))
    shown_in(text, capsys.readouterr().err)
    # A run's report (run and report): its name, model, output, a video's id and error, a failure reason.
    video = {"id": text, "status": "failed", "frames": 9, "fps": 8, "width": 32, "height": 32, "chunks": 1,
             "seam_score": None, "needs_review": False, "bytes": None, "sha256": None, "cost_usd": 0.0, "error": text,
             "flagged": True, "checks": {"motion": {"value": 0.5, "limit": 4.0, "passed": False}}}
    data = {"run_id": 1, "name": text, "model": text, "output": text, "videos": [video], "counts": {"failed": 1},
            "cost": {"per_successful_video_usd": None, "idle_usd": 0, "total_usd": 0.0}, "failures_by_reason":
            {text: 1}, "throughput": {"videos_per_hour": 0}, "queue_wait_s": None, "render_latency_s": None,
            "stages_s": {}, "gross_margin": None, "cancelled_by_reason": {}, "max_cost_usd": None, "deadline": None,
            "checks": {"on_fail": "flag", "flagged": 1}}
    print_report(out, data)
    printed = capsys.readouterr().out
    shown_in(f"run 1 {text} ({text}) -> {text}", printed)
    shown_in(f"  {text}: {text}", printed)
    shown_in(f"failures: 1 {text}", printed)
    shown_in(f"  FLAGGED {text}: motion 0.5 < 4", printed)
    row = printed.splitlines()[2]  # the table's id cell, whole, then the status
    assert row.startswith(visible(text)) and row[len(visible(text)):].lstrip(" ").startswith("failed")
    # A table of names (status, schedule list, ledger, settings) and a plain line (cancel, resume, wrote ...).
    table = Table("name", "other", box=None, pad_edge=False)
    table.add_row(text, literal(text))
    out.print(table)
    out.print(f"run {text}: 0 pending videos cancelled", highlight=False)
    printed = capsys.readouterr().out
    row = printed.splitlines()[1]
    assert row.startswith(visible(text)) and row[len(visible(text)):].lstrip(" ").startswith(visible(text).lstrip(" "))
    shown_in(f"run {text}: 0 pending videos cancelled", printed)
    # A progress bar (submit, run) and the spinner while a manifest is read.
    with Progress(progress_text(), BarColumn(), console=err) as bar:
        bar.add_task(visible(f"rendering {text}"), total=1)
    with err.status(literal(f"validating {text}")):
        pass
    shown_in(f"rendering {text}", capsys.readouterr().err)


@pytest.fixture(scope="module")
def failed_run(tmp_path_factory):
    """A run with one failed video, in a database of this module's own; the report command reads it."""
    folder = tmp_path_factory.mktemp("report")
    (folder / "m.yaml").write_text("name: r\nvideos: [{id: a, prompt: p}]\n")
    env = {"REELBATCH_DATABASE_URL": f"sqlite:///{folder / 'r.db'}",
           "REELBATCH_BROKER_URL": f"sqla+sqlite:///{folder / 'broker.db'}",
           "REELBATCH_OUTPUT": f"file://{folder}/[out]/[/]/"}
    assert CliRunner().invoke(app, ["submit", str(folder / "m.yaml")], env=env).exit_code == 0
    return env


@EXAMPLES
@given(text=HOSTILE)
def test_report_and_status_print_what_the_database_holds_as_it_is(wide, failed_run, text):
    factory = session_factory(failed_run["REELBATCH_DATABASE_URL"])
    with factory.begin() as s:
        s.execute(update(Video).values(status="failed", last_error=text))
    runner = CliRunner()
    result = runner.invoke(app, ["report", "r"], env=failed_run)
    assert result.exit_code == 0, result.output
    assert f"(tiny) -> {failed_run['REELBATCH_OUTPUT']}\n" in result.stdout
    shown_in(f"  a: {text}", result.stdout)
    assert json.loads(runner.invoke(app, ["report", "r", "--json"], env=failed_run).stdout)["videos"][0]["error"] \
        == text
    missing = runner.invoke(app, ["status", "--", text], env=failed_run)
    assert missing.exit_code == 2 and repr(text) in missing.stderr
