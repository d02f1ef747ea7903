"""The run's own fields, and the keyword arguments that override them (`--model`, `--output`, `--priority`): a bad one
is one error naming the file (or the option), line, field and value."""

import pytest

from .manifest_helpers import expect, load, write


def test_unregistered_model_lists_the_registered(tmp_path):
    path = write(tmp_path, "name: t\nmodel: wan-14b\nvideos: [{id: a, prompt: p}]\n")
    expect(path, 2, "model", "'wan-14b'", "not registered", "registered: tiny")


def test_unregistered_model_from_keyword(tmp_path):
    expect(write(tmp_path, '{"id": "a", "prompt": "p"}\n', "m.jsonl"), 0, "--model", "'wan'", "tiny", model="wan")


@pytest.mark.parametrize("uri", ["http://example.com/x/", "/abs/path/", "file://relative/", "s3:///nobucket/",
                                 "s3://Bad_Bucket/x/", "s3://bucket/a/../b/", "s3://bucket/a//b/", "s3://bucket/a?x",
                                 "file:///srv/a/../b/", "file:///srv/./b/", "file:///srv//b/", "file://./a/../b/",
                                 "file:///srv/a%2Fb/", "s3://bucket/a%20b/", "file:///srv/a\\b/"])
def test_bad_output_uri(tmp_path, uri):
    path = write(tmp_path, f"name: t\noutput: '{uri}'\nvideos: [{{id: a, prompt: p}}]\n")
    expect(path, 2, "output", repr(uri)[:-1])


@pytest.mark.parametrize("uri, canonical", [
    ("file:///srv/out/", "file:///srv/out/"), ("file:///srv/out", "file:///srv/out/"), ("file:///", "file:///"),
    ("file://./out/", "file://{cwd}/out/"), ("file://../up/", "file://{parent}/up/"), ("file://.", "file://{cwd}/"),
    ("file:///srv/with space/#1?/", "file:///srv/with space/#1?/"),
    ("s3://bucket", "s3://bucket/"), ("s3://bucket/a/b/", "s3://bucket/a/b/"), ("s3://b.c-d/x", "s3://b.c-d/x/"),
])
def test_good_output_uri_is_held_in_its_canonical_form(tmp_path, monkeypatch, uri, canonical):
    monkeypatch.chdir(tmp_path)
    path = write(tmp_path, f"name: t\noutput: '{uri}'\nvideos: [{{id: a, prompt: p}}]\n")
    assert load(path).output == canonical.format(cwd=tmp_path, parent=tmp_path.parent)


@pytest.mark.parametrize("uri, ok", [
    ("s3://bucket/a/", True), ("s3://bucket/a/x/", True), ("s3://bucket/a", True),
    ("s3://bucket/ab/", False), ("s3://bucket/", False), ("s3://bucket2/a/", False),
    ("file:///srv/out/run/", True), ("file:///srv/outer/", False), ("file:///srv/", False), ("file://./x/", False),
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
