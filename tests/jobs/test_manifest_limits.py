"""A run's cost cap and deadline in a manifest or `--set`: checked like every field (file, line, field, value), a
deadline as a moment ahead or a duration after submission, and both part of the run's content."""

from datetime import datetime, timedelta, timezone

import pytest

from .manifest_helpers import expect, load, write

NOW = datetime(2026, 12, 1, 22, 0, tzinfo=timezone.utc)


def run_with(tmp_path, lines, name="m.yaml"):
    """A run whose limits are `lines` (from line 2); its one video starts after them."""
    return write(tmp_path, "name: night\n" + "".join(f"{line}\n" for line in lines)
                 + "videos:\n  - id: a\n    prompt: p\n", name)


def test_a_cap_and_a_moment_deadline_are_read_in_utc(tmp_path):
    spec = load(run_with(tmp_path, ["max_cost_usd: 12.5", "deadline: 2026-12-02T09:00:00+01:00"]), now=NOW)
    assert spec.max_cost_usd == 12.5
    assert spec.deadline == datetime(2026, 12, 2, 8, 0, tzinfo=timezone.utc)


def test_a_duration_deadline_counts_from_the_load(tmp_path):
    spec = load(run_with(tmp_path, ["deadline: PT10H"]), now=NOW)
    assert spec.deadline == datetime(2026, 12, 2, 8, 0, tzinfo=timezone.utc)
    spec = load(run_with(tmp_path, ["deadline: P1DT2H30M"]), now=NOW)
    assert spec.deadline == datetime(2026, 12, 3, 0, 30, tzinfo=timezone.utc)


def test_without_limits_there_are_none_and_the_hash_is_what_it_was(tmp_path):
    spec = load(run_with(tmp_path, []), now=NOW)
    assert (spec.max_cost_usd, spec.deadline) == (None, None)
    # The hash of this content before caps and deadlines existed (main at 2072a2e): runs recorded then still match.
    assert spec.content_sha256 == "6508febf2a21a4286367f7ada35661b831bb345853e4f3a850837fda85ed322b"


def test_set_gives_run_limits_and_still_video_defaults(tmp_path):
    path = run_with(tmp_path, ["max_cost_usd: 1", "deadline: PT1H"])
    spec = load(path, now=NOW, sets=["max_cost_usd=3.25", "deadline=2026-12-02T06:00:00Z", "steps=2"])
    assert spec.max_cost_usd == 3.25 and spec.deadline == datetime(2026, 12, 2, 6, tzinfo=timezone.utc)
    assert spec.videos[0].steps == 2


def test_a_jsonl_run_takes_its_limits_from_set(tmp_path):
    path = write(tmp_path, '{"id": "a", "prompt": "p"}\n', "night.jsonl")
    spec = load(path, now=NOW, sets=["max_cost_usd=2", "deadline=PT30M"])
    assert spec.max_cost_usd == 2.0 and spec.deadline == NOW + timedelta(minutes=30)


def test_limits_are_part_of_the_content(tmp_path):
    plain = load(run_with(tmp_path, []), now=NOW).content_sha256
    capped = load(run_with(tmp_path, ["max_cost_usd: 5"]), now=NOW).content_sha256
    due = load(run_with(tmp_path, ["deadline: PT10H"]), now=NOW).content_sha256
    # A duration is hashed as written, so the same scheduled manifest loaded later is the same content.
    due_later = load(run_with(tmp_path, ["deadline: PT10H"]), now=NOW + timedelta(hours=1)).content_sha256
    assert len({plain, capped, due}) == 3 and due == due_later


@pytest.mark.parametrize("line, fragments", [
    ("max_cost_usd: -5", ["more than 0", "got -5"]),
    ("max_cost_usd: 0", ["more than 0", "got 0"]),
    ("max_cost_usd: .nan", ["finite", ".nan"]),
    ("max_cost_usd: '5'", ["number", "'5'", "without quotes"]),
    ("max_cost_usd: 250000.0", ["at most 100000", "250000.0"]),
    ("max_cost_usd: true", ["number", "true"]),
    ("deadline: 2026-12-01T08:00:00Z", ["2026-12-01T08:00:00Z is in the past", "2026-12-01T22:00:00Z now"]),
    ("deadline: 2026-12-02T08:00:00", ["time zone", "add Z", "'2026-12-02T08:00:00'"]),
    ("deadline: 2026-12-02", ["time of day", "'2026-12-02'"]),
    ("deadline: tomorrow", ["ISO 8601", "PT10H", "'tomorrow'"]),
    ("deadline: 2026-13-02T08:00:00Z", ["ISO 8601", "'2026-13-02T08:00:00Z'"]),
    ("deadline: PT0S", ["more than 0", "'PT0S'"]),
    ("deadline: P400D", ["at most 366 days", "'P400D'"]),
    ("deadline: 8", ["ISO 8601", "got 8 (an integer)"]),
])
def test_bad_limits_name_line_field_and_value(tmp_path, line, fragments):
    field = line.split(":")[0]
    expect(run_with(tmp_path, [line]), 2, field, *fragments, now=NOW)


@pytest.mark.parametrize("entry, fragments", [
    ("max_cost_usd=-1", ["'max_cost_usd=-1'", "more than 0", "got -1"]),
    ("deadline=2020-01-01T00:00:00Z", ["'deadline=2020-01-01T00:00:00Z'", "in the past"]),
    ("deadline=noon", ["'deadline=noon'", "ISO 8601"]),
])
def test_bad_limits_given_with_set_name_the_option(tmp_path, entry, fragments):
    expect(run_with(tmp_path, []), 0, "--set", *fragments, now=NOW, sets=[entry])


def test_a_misspelt_limit_is_an_unknown_run_field(tmp_path):
    expect(run_with(tmp_path, ["max_cost: 5"]), 2, "max_cost", "unknown field", "did you mean 'max_cost_usd'?")
