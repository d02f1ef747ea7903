"""Settings: one typed table read once; bad values stop a command with one line naming the variable and the value;
docs/SETTINGS.md's table is the code's."""

import subprocess
import sys
from pathlib import Path

import pytest

from jobs.cost.prices import Rate
from jobs.errors import UsageError
from jobs.settings import Settings, markdown_table
from tests.conftest import REPO


@pytest.mark.parametrize("name, raw, message", [
    ("REELBATCH_MAX_BATCH", "0.5", "must be a whole number of at least 1, got '0.5'"),
    ("REELBATCH_MAX_BATCH", "-1", "must be a whole number of at least 1, got '-1'"),
    ("REELBATCH_MAX_BATCH", "abc", "must be a whole number of at least 1, got 'abc'"),
    ("REELBATCH_MAX_BATCH", "0", "must be a whole number of at least 1, got '0'"),
    ("REELBATCH_MAX_ATTEMPTS", "2.0", "must be a whole number of at least 1, got '2.0'"),
    ("REELBATCH_DEVICE", "gpu", "must be auto, cpu, cuda, cuda:N or mps, got 'gpu'"),
    ("REELBATCH_LEASE_S", "-5", "must be a positive finite number, got '-5'"),
    ("REELBATCH_LEASE_S", "1e400", "expected a finite number, got '1e400'"),
    ("REELBATCH_LEASE_S", "inf", "expected a number (ASCII digits, e.g. 2.5), got 'inf'"),
    ("REELBATCH_LEASE_S", "１２", "expected a number (ASCII digits, e.g. 2.5), got '１２'"),
    ("REELBATCH_MAX_BATCH", "٨", "must be a whole number of at least 1, got '٨'"),
    ("REELBATCH_OUTPUT", "file:///srv/a%20b/", "contains '%': an output is not percent-decoded, so write each "
                                               "character itself (a space as a space), got 'file:///srv/a%20b/'"),
    ("REELBATCH_ALLOWED_OUTPUTS", "s3://bkt/x/,file:///srv/../etc/", "must be plain folder names after the start "
                                  "(no empty, '.' or '..' part), got 'file:///srv/../etc/', got 's3://bkt/x/,file:///"
                                  "srv/../etc/'"),
    ("REELBATCH_EGRESS_GB_USD", "-0.01", "must be zero or a positive finite number, got '-0.01'"),
    ("REELBATCH_STEP_SCALE", "0", "must be in (0, 1], got '0'"),
    ("REELBATCH_STEP_CACHE", "1.5", "must be in [0, 1], got '1.5'"),
    ("REELBATCH_TEXT_CACHE", "maybe", "expected 1/0 (or on/off, true/false), got 'maybe'"),
    ("REELBATCH_METRICS_PORT", "70000", "must be a TCP port, a whole number from 1 to 65535, got '70000'"),
    ("REELBATCH_ALLOWED_WEBHOOKS", "https://a.example/, ftp://b.example/",
     "prefix 'ftp://b.example/' must be an https:// URL (or http:// where an allowed prefix says http), "
     "got 'https://a.example/, ftp://b.example/'"),
    ("REELBATCH_ALLOWED_WEBHOOKS", "https://a.example/?k=1",
     "prefix 'https://a.example/?k=1' an allowed prefix must not have a ?query, got 'https://a.example/?k=1'"),
    # A secret is never printed, not even when it is refused.
    ("REELBATCH_WEBHOOK_SECRET", "hunter2", "must be at least 16 characters, got a value of 7 characters"),
    ("REELBATCH_WEBHOOK_SECRET", " 0123456789abcdef", "must not begin or end with white space (receivers would "
                                                     "sign with another key), got a value of 17 characters"),
    ("REELBATCH_WEBHOOK_BACKOFF_S", "0", "must be a positive finite number, got '0'"),
    ("REELBATCH_ALLOWED_INPUTS", "/srv/in/, relative/dir/", "'relative/dir/' must be an absolute folder (/dir/), "
                                 "file:///dir/ or s3://bucket/prefix/, got '/srv/in/, relative/dir/'"),
    ("REELBATCH_ALLOWED_INPUTS", "/srv/../etc/", "must be plain folder names after the start (no empty, '.' or '..' "
                                 "part), got 'file:///srv/../etc/', got '/srv/../etc/'"),
    ("REELBATCH_STORE_THREADS", "0", "must be auto or a whole number of at least 1, got '0'"),
    ("REELBATCH_STORE_THREADS", "many", "must be auto or a whole number of at least 1, got 'many'"),
])
def test_a_bad_value_names_the_variable_and_the_value(name, raw, message):
    with pytest.raises(UsageError) as caught:
        Settings.from_env({name: raw})
    assert str(caught.value) == f"environment variable {name}: {message}"


def test_values_are_read_as_their_types_and_unset_ones_take_the_defaults(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    settings = Settings.from_env({"REELBATCH_MAX_BATCH": "8", "REELBATCH_OVERLAP": "off", "REELBATCH_DEVICE": "cuda:1",
                                  "REELBATCH_ALLOWED_OUTPUTS": " s3://bkt/x/, file:///srv/ ,",
                                  "REELBATCH_METRICS_PORT": "9400", "REELBATCH_EGRESS_GB_USD": "0"})
    assert (settings.worker.max_batch, settings.worker.overlap, settings.engine.device) == (8, False, "cuda:1")
    assert settings.manifest.allowed_outputs == ("s3://bkt/x/", "file:///srv/")
    assert (settings.worker.metrics_port, settings.prices.storage.egress_gb_usd) == (9400, 0.0)
    assert settings.database_url == f"sqlite:///{tmp_path / 'reelbatch.db'}"
    assert (settings.limits.lease_s, settings.limits.max_attempts) == (120.0, 3)
    assert (settings.prices.gpu.usd_per_hour, settings.worker.queue) == (5.41, "render")
    assert Settings.from_env({}).worker.store_threads == 0  # auto
    assert Settings.from_env({"REELBATCH_STORE_THREADS": "auto"}).worker.store_threads == 0
    assert Settings.from_env({"REELBATCH_STORE_THREADS": "3"}).worker.store_threads == 3


def test_allowed_inputs_take_plain_folders_as_docs_settings_says():
    settings = Settings.from_env({"REELBATCH_ALLOWED_INPUTS": "/srv/in/, file:///srv/b/,s3://bkt/x/"})
    assert settings.manifest.allowed_inputs == ("/srv/in/", "file:///srv/b/", "s3://bkt/x/")


def test_the_webhook_settings_are_read_and_the_secret_is_never_shown(tmp_path):
    secret = "s3cr3t-webhook-key-0123"
    settings = Settings.from_env({"REELBATCH_ALLOWED_WEBHOOKS": "HTTPS://Hooks.Example.com:443/rb, http://127.0.0.1:9/",
                                  "REELBATCH_WEBHOOK_SECRET": secret})
    assert settings.manifest.allowed_webhooks == ("https://hooks.example.com/rb", "http://127.0.0.1:9/")
    assert settings.webhooks.secret == secret and settings.webhooks.backoff_s == 30.0
    assert secret not in repr(settings)
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "HOME": str(tmp_path), "REELBATCH_WEBHOOK_SECRET": secret}
    for args in (["settings"], ["settings", "--json"]):
        proc = subprocess.run([sys.executable, "-m", "jobs", *args], cwd=tmp_path, capture_output=True, text=True,
                              env=env, timeout=120)
        assert proc.returncode == 0 and "REELBATCH_WEBHOOK_SECRET" in proc.stdout and secret not in proc.stdout
        assert "(set, not shown)" in proc.stdout


def test_a_command_stops_with_one_line_and_exit_2(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "jobs", "status"], cwd=tmp_path, capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "REELBATCH_MAX_BATCH": "0.5",
                               "HOME": str(tmp_path)}, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr == "environment variable REELBATCH_MAX_BATCH: must be a whole number of at least 1, got '0.5'\n"
    assert not (tmp_path / "reelbatch.db").exists(), "nothing written"


def test_the_settings_page_holds_the_table_the_code_makes():
    page = Path(REPO / "docs" / "SETTINGS.md").read_text(encoding="utf-8")
    start = page.index("<!-- settings table")
    body = page[page.index("\n", start) + 1 : page.index("<!-- end of settings table -->")]
    assert body == markdown_table(), "docs/SETTINGS.md is stale: regenerate it with `reelbatch settings --markdown`"


def test_each_variable_sets_the_field_of_the_part_it_configures():
    settings = Settings.from_env({"REELBATCH_DEVICE": "cuda:1", "REELBATCH_CACHE_DIR": "/srv/cache",
                                  "REELBATCH_MAX_MODELS": "3", "REELBATCH_GPU_HOUR_USD": "2.5",
                                  "REELBATCH_RETENTION_MONTHS": "6", "REELBATCH_OUTPUT": "s3://bkt/renders/",
                                  "REELBATCH_REPORT_PARALLEL": "0", "REELBATCH_LEASE_S": "45"})
    # The engine's group is the engine's own config, handed over whole: no field is copied by matching names.
    assert settings.engine_config() is settings.engine
    engine = settings.engine
    assert (engine.device, engine.cache_dir, engine.max_models) == ("cuda:1", Path("/srv/cache"), 3)
    assert settings.prices.gpu == Rate(2.5, settings.prices.gpu.source)
    assert (settings.prices.storage.months, settings.prices.storage.gb_month_usd) == (6.0, 0.023)
    assert settings.manifest.default_output == "s3://bkt/renders/"
    assert (settings.reports.sql, settings.reports.parallel, settings.limits.lease_s) == (True, False, 45.0)
    assert settings.value("prices.storage.months") == 6.0


def test_values_over_settings_go_by_path_and_an_unknown_path_is_refused():
    settings = Settings.from_env({})
    changed = settings.with_values({"limits.lease_s": 0.5, "prices.gpu.usd_per_hour": 3.6, "worker.metrics_port": None})
    assert (changed.limits.lease_s, changed.prices.gpu.usd_per_hour, changed.worker.metrics_port) == (0.5, 3.6, None)
    assert changed.limits.max_attempts == 3 and settings.limits.lease_s == 120.0, "the rest kept; the original intact"
    with pytest.raises(AttributeError, match="Limits has no setting 'lease'"):
        settings.with_values({"limits.lease": 1.0})
