"""A worker refuses to start on a configuration that would run a batch twice or never renew its lease."""

import subprocess
import sys

import pytest

from jobs.errors import UsageError
from jobs.settings import Settings
from jobs.work.app import check_worker_config, create_app
from tests.conftest import REPO


def settings(**changes):
    """Settings with changes by path, written with "__" for the dots (limits__lease_s=1)."""
    return Settings.from_env({}).with_values({k.replace("__", "."): v for k, v in changes.items()})


def test_redis_visibility_timeout_must_exceed_the_longest_render():
    with pytest.raises(UsageError, match=r"visibility timeout \(3600 s.*longest allowed render \(7200 s"):
        check_worker_config(settings(broker_url="redis://127.0.0.1:1/0", limits__visibility_timeout_s=3600,
                                     limits__max_render_s=7200))
    check_worker_config(settings(broker_url="redis://127.0.0.1:1/0", limits__visibility_timeout_s=7201,
                                 limits__max_render_s=7200))
    # The SQLite broker does not redeliver on a timer, so the check does not apply.
    check_worker_config(settings(limits__visibility_timeout_s=1, limits__max_render_s=7200))


def test_lease_too_short_to_renew_is_refused():
    with pytest.raises(UsageError, match="too short to renew"):
        check_worker_config(settings(limits__lease_s=1))


def test_celery_is_configured_for_long_gpu_work():
    conf = create_app(settings(broker_url="redis://127.0.0.1:1/0", worker__queue="gpu",
                               limits__max_render_s=100)).conf
    assert conf.task_acks_late and conf.task_reject_on_worker_lost and conf.worker_prefetch_multiplier == 1
    assert conf.task_routes["reelbatch.render_next"] == {"queue": "gpu"} and conf.task_time_limit == 100
    assert conf.task_routes["reelbatch.fire_schedules"] == {"queue": "gpu.control"}
    assert conf.broker_transport_options == {"visibility_timeout": 6 * 3600.0}
    assert conf.worker_send_task_events, "Flower needs task events"


def test_worker_command_refuses_a_bad_combination(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "REELBATCH_BROKER_URL": "redis://127.0.0.1:1/0",
           "REELBATCH_VISIBILITY_TIMEOUT_S": "60", "REELBATCH_MAX_RENDER_S": "600",
           "REELBATCH_DATABASE_URL": f"sqlite:///{tmp_path / 'w.db'}"}
    proc = subprocess.run([sys.executable, "-m", "jobs", "worker"], env=env, capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert proc.returncode == 2 and "visibility timeout (60 s" in proc.stderr and "Traceback" not in proc.stderr


def test_worker_command_refuses_a_broken_models_file(tmp_path):
    models = tmp_path / "models.yaml"
    models.write_text("wan: {path: /nowhere}\n")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "REELBATCH_MODELS": str(models),
           "REELBATCH_DATABASE_URL": f"sqlite:///{tmp_path / 'w.db'}"}
    proc = subprocess.run([sys.executable, "-m", "jobs", "worker"], env=env, capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "REELBATCH_MODELS" in proc.stderr and "/nowhere holds no model_index.json" in proc.stderr


@pytest.mark.parametrize(("raw", "expected"), [("", True), ("1", True), ("on", True), ("0", False), ("off", False),
                                                ("False", False)])
def test_engine_switches_come_from_the_environment(raw, expected):
    defaults = {"text_cache": True, "batched_guidance": True, "fast_vae_norm": True, "compile": False,
                "offload_text_encoder": False}
    for name, default in defaults.items():
        settings = Settings.from_env({f"REELBATCH_{name.upper()}": raw})
        want = default if raw == "" else expected
        assert getattr(settings.engine, name) is want and getattr(settings.engine_config(), name) is want
    # The worker's own switch: storing batch k while batch k+1 renders.
    assert Settings.from_env({"REELBATCH_OVERLAP": raw}).worker.overlap is (True if raw == "" else expected)


def test_a_bad_switch_value_names_the_variable():
    with pytest.raises(UsageError, match="REELBATCH_TEXT_CACHE: expected 1/0.*'maybe'"):
        Settings.from_env({"REELBATCH_TEXT_CACHE": "maybe"})


def test_lossy_accelerators_come_from_the_environment_off_by_default():
    assert Settings.from_env({}).engine_config().lossy() == ""
    config = Settings.from_env({"REELBATCH_STEP_CACHE": "0.1", "REELBATCH_GUIDANCE_FRACTION": "0.5",
                                "REELBATCH_STEP_SCALE": "0.75"}).engine_config()
    assert config.lossy() == "step_cache=0.1,guidance_fraction=0.5,step_scale=0.75"
    assert Settings.from_env({"REELBATCH_STEP_CACHE": "0"}).engine_config().lossy() == ""


@pytest.mark.parametrize(("name", "raw", "message"), [
    ("REELBATCH_STEP_SCALE", "0", r"must be in \(0, 1\], got '0'"),
    ("REELBATCH_GUIDANCE_FRACTION", "1.5", r"must be in \(0, 1\], got '1.5'"),
    ("REELBATCH_STEP_CACHE", "-1", r"must be in \[0, 1\], got '-1'"),
    ("REELBATCH_STEP_CACHE", "lots", r"expected a number \(ASCII digits, e.g. 2.5\), got 'lots'"),
])
def test_a_bad_lossy_value_names_the_variable(name, raw, message):
    with pytest.raises(UsageError, match=f"{name}: {message}"):
        Settings.from_env({name: raw})


def test_the_attention_backend_is_a_diffusers_name():
    """Checked where an engine is configured (a worker checks it at start), not by commands that never render:
    diffusers' list of backends imports torch."""
    assert Settings.from_env({}).engine_config().attention == "native"
    assert Settings.from_env({"REELBATCH_ATTENTION": "flash"}).engine_config().attention == "flash"
    with pytest.raises(UsageError, match="REELBATCH_ATTENTION: 'fastest' is not a diffusers attention backend"):
        Settings.from_env({"REELBATCH_ATTENTION": "fastest"}).engine_config()


def test_json_log_lines_carry_the_bound_batch():
    import io
    import json
    import logging

    from jobs.observe.logs import JsonFormatter, bound

    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("reelbatch-json-test")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    with bound(runs=["night"], videos=["a", "b"]):
        logger.info("claimed %d", 2)
    logger.warning("outside")
    first, second = (json.loads(line) for line in stream.getvalue().splitlines())
    assert (first["message"], first["runs"], first["videos"], first["level"]) == ("claimed 2", ["night"], ["a", "b"],
                                                                                  "INFO")
    assert second["message"] == "outside" and "videos" not in second


def test_a_bad_log_format_is_refused(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "jobs", "worker", "--log-format", "xml"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "--log-format must be text or json, got 'xml'" in proc.stderr


@pytest.mark.parametrize(("args", "env", "message"), [
    (["--models", "tiny,wan-14b"], {},
     "--models / REELBATCH_WORKER_MODELS: 'wan-14b' not registered here "
     "(registered: tiny, tiny-i2v, toy, toy-fast, toy-i2v)"),
    (["--models", "wan 14b"], {},
     "--models: expected comma-separated model names (letters, digits, '.', '_' and '-'), got 'wan 14b'"),
    ([], {"REELBATCH_WORKER_MODELS": ","},
     "environment variable REELBATCH_WORKER_MODELS: expected comma-separated model names"),
])
def test_worker_command_refuses_models_it_cannot_serve(tmp_path, args, env, message):
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "REELBATCH_DATABASE_URL": f"sqlite:///{tmp_path / 'w.db'}",
           "PYTHONPATH": str(REPO), **env}  # this checkout's code, whatever the venv's editable install points at
    proc = subprocess.run([sys.executable, "-m", "jobs", "worker", *args], env=env, capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert message in " ".join(proc.stderr.split()), proc.stderr


def test_a_worker_serves_every_registered_model_unless_narrowed():
    assert settings().served_models() == ("tiny", "tiny-i2v", "toy", "toy-fast", "toy-i2v")
    assert settings(worker__models=("toy", "toy")).served_models() == ("toy",)


@pytest.mark.parametrize("command", [["worker"], ["status"]])
def test_a_bad_database_is_named_before_a_bad_models_file(tmp_path, command):
    """A worker opens its database before it reads the models file, as the commands that read runs do: with both
    wrong, the database is the one line said (a server that refuses, then a file that is no database)."""
    models = tmp_path / "models.yaml"
    models.write_text("wan: {path: /nowhere}\n")
    not_a_db = tmp_path / "notes.db"
    not_a_db.write_text("these are notes, not a database\n")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONPATH": str(REPO), "REELBATCH_MODELS": str(models)}
    refused = "postgresql+psycopg://reel:hunter2@127.0.0.1:1/reelbatch"  # nothing listens on port 1
    proc = subprocess.run([sys.executable, "-m", "jobs", *command], env={**env, "REELBATCH_DATABASE_URL": refused},
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    (line,) = proc.stderr.splitlines()
    assert line.startswith("the database cannot be reached (REELBATCH_DATABASE_URL "
                           "'postgresql+psycopg://reel:***@127.0.0.1:1/reelbatch'): "), line
    assert line.endswith("; check the URL and that its server is running"), line
    url = f"sqlite:///{not_a_db}"
    proc = subprocess.run([sys.executable, "-m", "jobs", *command], env={**env, "REELBATCH_DATABASE_URL": url},
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert (proc.returncode, proc.stderr) == (2, f"the database cannot be opened (REELBATCH_DATABASE_URL '{url}'): "
                                                 "file is not a database; check that the URL names a reelbatch "
                                                 "database\n")
    assert not_a_db.read_text() == "these are notes, not a database\n"
