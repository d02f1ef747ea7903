"""Helpers shared by the manifest tests: write a file, load it, expect one issue."""

import os
import textwrap

import pytest

from engine.models.registry import Registry
from jobs.manifest import ManifestError, ManifestIssue, RunSpec, load_manifest
from jobs.manifest.policy import ManifestPolicy

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


POLICY_FIELDS = ("allowed_outputs", "allowed_webhooks", "allowed_inputs", "default_output")


def load(path, **kwargs) -> RunSpec:
    """load_manifest with the tiny registry; a ManifestPolicy field given as a keyword goes into the policy."""
    policy = {name: kwargs.pop(name) for name in POLICY_FIELDS if name in kwargs}
    return load_manifest(path, registry=Registry(), policy=ManifestPolicy(**policy), **kwargs)


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
