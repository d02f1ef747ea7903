"""Manifests with images, end to end as a user runs them: the real CLI, a Celery worker, the embedded default
(SQLite, local output) and S3 inputs on a real S3-protocol server; MP4s decoded and their first frames compared."""

import hashlib
import io
import json
import os
import sqlite3

import boto3
import numpy as np
from PIL import Image

from engine.engine import Engine
from engine.frames.metrics import psnr
from engine.levers.config import EngineConfig
from engine.models.registry import Registry
from jobs.quality.images import vae_round_trip
from storage.encode import decode_frames
from toyworld.judge import judge_clip

from .conftest import REPO

EXAMPLE = REPO / "manifests" / "examples" / "images.yaml"


def first_frame_psnr(model_cache, model: str, video: np.ndarray, picture: np.ndarray) -> float:
    """PSNR of a stored video's frame 0 against its picture after the model's VAE round trip."""
    pipe = Engine(EngineConfig(cache_dir=model_cache), Registry()).pipeline(model)
    return psnr(video[:1], vae_round_trip(pipe, picture)[None])


def test_the_example_starts_each_toy_i2v_video_from_its_picture(cli, tmp_path, model_cache):
    report = cli.json("run", str(EXAMPLE))
    assert report["model"] == "toy-i2v" and report["counts"]["succeeded"] == 4
    results = {json.loads(line)["id"]: json.loads(line)
               for line in (tmp_path / "outputs" / "pictures" / "results.jsonl").read_text().splitlines()}
    for v in report["videos"]:
        name = v["image"].rsplit("/", 1)[1]
        picture_path = EXAMPLE.parent / "pictures" / name
        assert v["image"] == picture_path.resolve().as_uri() and v["fit"] == "crop"
        assert results[v["id"]]["image_sha256"] == v["image_sha256"] == \
            hashlib.sha256(picture_path.read_bytes()).hexdigest()
        video = decode_frames((tmp_path / "outputs" / "pictures" / f"{v['id']}.mp4").read_bytes())
        picture = np.asarray(Image.open(picture_path).convert("RGB"))
        assert first_frame_psnr(model_cache, "toy-i2v", video, picture) >= 25.0, v["id"]
        # The picture's colour, shape and background are the prompt's; the model keeps them and moves the shape.
        verdict = judge_clip(video).matches(v["prompt"])
        assert verdict["colour"] and verdict["background"] and verdict["direction"], (v["id"], verdict)


def test_images_from_s3_on_tiny(cli, cli_env, s3_env, tmp_path, model_cache):
    s3 = boto3.session.Session().client("s3")
    pixels = np.repeat(np.repeat(np.random.default_rng(4).integers(0, 256, (8, 12, 3), dtype=np.uint8), 8, 0), 8, 1)
    data = io.BytesIO()
    Image.fromarray(pixels).save(data, format="PNG")
    s3.put_object(Bucket=s3_env, Key="assets/shot.png", Body=data.getvalue())
    manifest = tmp_path / "s3.yaml"
    manifest.write_text(f"name: s3\ndefaults: {{steps: 2, fit: crop}}\nvideos:\n"
                        f"  - {{id: shot, prompt: a shot, image: s3://{s3_env}/assets/shot.png}}\n"
                        f"  - {{id: words, prompt: words only}}\n")
    cli.env = {**cli_env, **{k: v for k, v in os.environ.items() if k.startswith("AWS_")}}
    refused = cli("submit", str(manifest), check=False)
    assert refused.returncode == 2 and f"{manifest}:4: videos[0].image:" in refused.stderr
    assert "is not under an allowed input prefix" in refused.stderr and "Traceback" not in refused.stderr
    cli.env["REELBATCH_ALLOWED_INPUTS"] = f"s3://{s3_env}/assets/"
    gone = tmp_path / "gone.yaml"
    gone.write_text(f"name: gone\nvideos:\n  - {{id: a, prompt: p, image: s3://{s3_env}/assets/gone.png}}\n")
    refused = cli("submit", str(gone), check=False)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert refused.stderr.strip() == (f"{gone}:3: videos[0].image: 's3://{s3_env}/assets/gone.png': no such image: "
                                      f"s3://{s3_env}/assets/gone.png"), refused.stderr
    report = cli.json("run", str(manifest))
    assert report["counts"]["succeeded"] == 2
    videos = {v["id"]: v for v in report["videos"]}
    assert videos["shot"]["image"] == f"s3://{s3_env}/assets/shot.png" and videos["words"]["image"] is None
    video = decode_frames((tmp_path / "outputs" / "s3" / "shot.mp4").read_bytes())
    picture = pixels[:, 16:80]  # 96x64 cropped to the middle 64x64: no resampling
    assert first_frame_psnr(model_cache, "tiny", video, picture) >= 25.0


def test_a_manifest_with_bad_images_exits_2_and_writes_nothing(cli, tmp_path):
    (tmp_path / "fake.png").write_bytes(b"not a picture")
    Image.new("RGB", (8193, 1)).save(tmp_path / "wide.png")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\nmodel: toy-i2v\nvideos:\n  - {id: a, prompt: p, image: fake.png}\n"
                   "  - {id: b, prompt: p, image: /etc/hostname}\n  - {id: c, prompt: p, image: gone.png}\n"
                   "  - {id: d, prompt: p, image: wide.png}\n  - {id: e, prompt: p, image: wide.png, fit: squash}\n")
    proc = cli("submit", str(bad), check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines[0] == (f"{bad}:4: videos[0].image: 'fake.png': {(tmp_path / 'fake.png').as_uri()} is not a "
                        f"decodable image (not PNG, JPEG, WEBP data)")
    assert lines[1].startswith(f"{bad}:5: videos[1].image: '/etc/hostname' is not under an allowed input prefix")
    assert lines[2].startswith(f"{bad}:6: videos[2].image: 'gone.png': no such image: file://"), lines[2]
    assert lines[3].startswith(f"{bad}:7: videos[3].image: 'wide.png'") and \
        "is 8193x1 px, over the 8192 px limit a side" in lines[3], lines[3]
    assert any(line.startswith(f"{bad}:8: videos[4].fit:") and "'squash'" in line for line in lines), lines
    db = tmp_path / "reelbatch.db"
    if db.exists():
        assert sqlite3.connect(db).execute("select count(*) from runs").fetchone() == (0,)
