"""One way in for a manifest: `estimate` checks as `submit` does. Both commands, run through the real CLI on the same
manifests under the same settings (an allowed output, allowed webhooks, an allowed input folder, a default output),
accept the same ones and refuse the others with the same message. `estimate` once passed only the allowed outputs,
so it refused `notify:` and an allowed image that `submit` accepted, and checked ids against no output at all."""

import io
import json

import pytest
from PIL import Image
from typer.testing import CliRunner

from jobs.cli import app

SECRET = "a-secret-of-24-characters"


def png() -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (64, 64), (200, 30, 30)).save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.fixture
def deployment(tmp_path):
    """The settings both commands read: renders under out/ (the default, out/runs/), webhooks to one host, images
    from pictures/ (outside every manifest's folder, which is manifests/)."""
    (tmp_path / "manifests").mkdir()
    (tmp_path / "pictures").mkdir()
    (tmp_path / "pictures" / "a.png").write_bytes(png())
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "b.png").write_bytes(png())
    return tmp_path, {
        "REELBATCH_DATABASE_URL": f"sqlite:///{tmp_path / 'r.db'}",
        "REELBATCH_BROKER_URL": f"sqla+sqlite:///{tmp_path / 'broker.db'}",
        "REELBATCH_CACHE_DIR": str(tmp_path / "cache"),
        "REELBATCH_OUTPUT": f"file://{tmp_path}/out/runs/",
        "REELBATCH_ALLOWED_OUTPUTS": f"file://{tmp_path}/out/",
        "REELBATCH_ALLOWED_WEBHOOKS": "https://hooks.example.com/rb/",
        "REELBATCH_ALLOWED_INPUTS": f"file://{tmp_path}/pictures/",
        "REELBATCH_WEBHOOK_SECRET": SECRET,
        "COLUMNS": "400",
    }


def manifests(root) -> dict[str, tuple[str, str | tuple[str, str] | None]]:
    """Each case: the manifest's text and, for a refused one, the message both commands must print, or how it starts
    and ends where it shows a long value cut short (None: accepted). Written out by hand from the rule each breaks."""
    m = root / "manifests"
    video = "videos:\n  - {id: a, prompt: p}\n"
    return {
        "plain": ("name: plain\n" + video, None),
        "notify": ("name: notify\nnotify: https://hooks.example.com/rb/done\n" + video, None),
        "image": (f"name: image\nvideos:\n  - {{id: a, prompt: p, image: {root / 'pictures' / 'a.png'}}}\n", None),
        "output": (f"name: output\noutput: file://{root}/out/other/\n" + video, None),
        "notify-elsewhere": ("name: notify-elsewhere\nnotify: https://evil.example.com/rb/done\n" + video,
                             f"{m / 'notify-elsewhere.yaml'}:2: notify: 'https://evil.example.com/rb/done' is not "
                             f"under an allowed webhook prefix (https://hooks.example.com/rb/)\n"),
        "output-elsewhere": (f"name: output-elsewhere\noutput: file://{root}/elsewhere/\n" + video,
                             (f"{m / 'output-elsewhere.yaml'}:2: output: 'file:///",
                              f" is not under an allowed output prefix (file://{root}/out/)\n")),
        "image-elsewhere": (f"name: image-elsewhere\nvideos:\n  - {{id: a, prompt: p, image: "
                            f"{root / 'elsewhere' / 'b.png'}}}\n",
                            (f"{m / 'image-elsewhere.yaml'}:3: videos[0].image: '/",
                             f" is not under an allowed input prefix (REELBATCH_ALLOWED_INPUTS: {root}/pictures/); "
                             f"put the image beside the manifest or ask the operator to allow its folder\n")),
        # 128 CJK characters, 384 bytes: the local store's temporary name `.<id>.mp4.<16 hex>.tmp` would be
        # 1 + 384 + 4 + 1 + 16 + 4 = 410 bytes, so an id may have 255 - 26 = 229 (only `submit` was told of the
        # default output, so `estimate` checked ids against none).
        "id-too-long": ("name: id-too-long\nvideos:\n  - {id: " + "東" * 128 + ", prompt: p}\n",
                        (f"{m / 'id-too-long.yaml'}:3: videos[0].id: '東東東",
                         "would be 410 bytes, over the 255-byte limit: an id there may be at most 229 bytes\n")),
        "bad-field": ("name: bad-field\nmax_cost_usd: -3\n" + video,
                      f"{m / 'bad-field.yaml'}:2: max_cost_usd: must be more than 0 and at most 100000, got -3"),
    }


def invoke(env, *args):
    result = CliRunner().invoke(app, list(args), env=env)
    assert "Traceback" not in result.output, result.output
    return result


def test_estimate_and_submit_accept_and_refuse_the_same_manifests_with_the_same_message(deployment):
    root, env = deployment
    cases = manifests(root)
    for name, (text, refused) in cases.items():
        path = root / "manifests" / f"{name}.yaml"
        path.write_text(text, encoding="utf-8")
        estimated = invoke(env, "estimate", str(path), "--json")
        submitted = invoke(env, "submit", str(path), "--json")
        if refused is None:
            assert (estimated.exit_code, submitted.exit_code) == (0, 0), (name, estimated.output, submitted.output)
            assert json.loads(estimated.stdout)["videos"] == 1
            assert json.loads(submitted.stdout)["name"] == name
        else:
            assert (estimated.exit_code, submitted.exit_code) == (2, 2), (name, estimated.output, submitted.output)
            assert estimated.stderr == submitted.stderr, name
            start, end = refused if isinstance(refused, tuple) else (refused, "")
            assert estimated.stderr.startswith(start) and estimated.stderr.endswith(end), (name, estimated.stderr)
    # The refused recorded nothing; the accepted are runs, each under its output.
    runs = json.loads(invoke(env, "status", "--json").stdout)["runs"]
    assert sorted(r["name"] for r in runs) == ["image", "notify", "output", "plain"]


def test_without_the_webhook_secret_both_refuse_a_manifest_that_notifies(deployment):
    root, env = deployment
    env = {k: v for k, v in env.items() if k != "REELBATCH_WEBHOOK_SECRET"}
    path = root / "manifests" / "notify.yaml"
    path.write_text("name: notify\nnotify: https://hooks.example.com/rb/done\nvideos:\n  - {id: a, prompt: p}\n")
    expected = (f"{path}: notify 'https://hooks.example.com/rb/done': REELBATCH_WEBHOOK_SECRET is not set, so its "
                "deliveries could not be signed; set it here and on every worker")
    for command in ("estimate", "submit"):
        result = invoke(env, command, str(path))
        assert result.exit_code == 2 and " ".join(result.stderr.split()) == expected, (command, result.stderr)
