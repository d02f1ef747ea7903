"""A video's `image` at submit: where it may come from, every way it can be bad (one issue naming the line, field and
value, nothing written), and its SHA-256 as part of the run's identity. Local folders and a real S3 server."""

import dataclasses
import hashlib
import io
import os

import boto3
import numpy as np
import pytest
from PIL import Image

from engine.models.registry import TINY, Registry
from jobs.db.connect import session_factory
from jobs.db.submission import submit_run
from jobs.errors import RunNameTaken, UsageError
from jobs.manifest import ManifestError, load_manifest
from jobs.settings import Settings

from .manifest_helpers import expect, load, write


def png(width=20, height=10, colour=(200, 30, 30)) -> bytes:
    out = io.BytesIO()
    Image.fromarray(np.full((height, width, 3), colour, dtype=np.uint8)).save(out, format="PNG")
    return out.getvalue()


@pytest.fixture
def folder(tmp_path):
    """A manifest's folder with a picture in it."""
    (tmp_path / "shots").mkdir()
    (tmp_path / "shots" / "shoe.png").write_bytes(png())
    return tmp_path


def test_a_relative_image_is_read_hashed_and_recorded_with_its_fit(folder):
    path = write(folder, """
        name: ads
        defaults: {image: shots/shoe.png}
        videos:
          - {id: a, prompt: a shoe}
          - {id: b, prompt: a shoe, fit: pad}
          - {id: c, prompt: text only, image: null}
    """)
    a, b, c = load(path).videos
    uri = (folder / "shots" / "shoe.png").resolve().as_uri()
    digest = hashlib.sha256(png()).hexdigest()
    assert (a.image, a.image_sha256, a.fit) == (uri, digest, "crop")
    assert (b.image, b.image_sha256, b.fit) == (uri, digest, "pad")
    assert (c.image, c.image_sha256, c.fit) == (None, None, None)


def test_a_text_only_manifest_keeps_the_hash_it_had_before_images(tmp_path):
    """The content hash of a manifest without images is what the code before issue 21 computed (worked out on that
    commit), so resubmitting an existing run after the upgrade is still the same run."""
    path = write(tmp_path, """
        name: night
        model: tiny
        defaults:
          steps: 6
        videos:
          - id: a
            prompt: a red circle
          - id: b
            prompt: a blue square
            seed: 5
    """)
    assert load(path).content_sha256 == "6520e65abac81a1be9bcc5a5313a526912bec221bd6199e64d2d33a25d3a3b79"


def test_a_changed_image_is_a_different_manifest(folder):
    path = write(folder, """
        name: ads
        videos: [{id: a, prompt: a shoe, image: shots/shoe.png}]
    """)
    factory = session_factory(f"sqlite:///{folder / 'reelbatch.db'}")
    first = submit_run(factory, load(path), output="file:///out/")
    assert submit_run(factory, load(path), output="file:///out/").run_id == first.run_id, "same bytes: same run"
    (folder / "shots" / "shoe.png").write_bytes(png(colour=(30, 200, 30)))
    with pytest.raises(RunNameTaken, match="already used by run 1 with different content"):
        submit_run(factory, load(path), output="file:///out/")


@pytest.mark.parametrize("value,fragments", [
    ("shots/missing.png", ["'shots/missing.png': no such image: file://"]),
    ("shots/fake.png", ["'shots/fake.png'", "is not a decodable image (not PNG, JPEG, WEBP data)"]),
    ("shots/anim.gif", ["is GIF data; use PNG, JPEG, WEBP"]),
    ("shots/wide.png", ["is 8193x1 px, over the 8192 px limit a side"]),
    ("shots/huge.png", ["is over the 67,108,864-byte limit"]),
    ("shots/cut.png", ["is not a decodable image"]),
    ("shots", ["no such image"]),
    ("../elsewhere.png", ["'../elsewhere.png' leads out of the manifest's folder"]),
    ("shots/link.png", ["'shots/link.png' leads out of the manifest's folder"]),
    ("/etc/hostname", ["'/etc/hostname' is not under an allowed input prefix (REELBATCH_ALLOWED_INPUTS: none"]),
    ("file:///etc/hostname", ["is not under an allowed input prefix"]),
    ("file://shots/shoe.png", ["a file URI must be absolute"]),
    ("https://example.com/a.png", ["must be a path, a file:/// URI or an s3:// URI"]),
    ("s3://bucket/a.png", ["'s3://bucket/a.png' is not under an allowed input prefix"]),
    ("s3://bucket/", ["must name one object"]),
])
def test_each_bad_image_is_one_issue_naming_its_line_and_value(folder, value, fragments):
    shots = folder / "shots"
    (shots / "fake.png").write_bytes(b"not an image at all")
    Image.new("RGB", (4, 4)).save(shots / "anim.gif")
    (shots / "wide.png").write_bytes(png(width=8193, height=1))
    with open(shots / "huge.png", "wb") as f:  # sparse: refused by its size before a byte is read
        f.truncate(64 * 2**20 + 1)
    (shots / "cut.png").write_bytes(png()[:40])
    (folder.parent / "elsewhere.png").write_bytes(png())
    os.symlink(folder.parent / "elsewhere.png", shots / "link.png")
    path = write(folder, f"""
        name: ads
        videos:
          - id: a
            prompt: a shoe
            image: "{value}"
    """)
    expect(path, 5, "videos[0].image", *fragments)


def test_every_bad_image_is_reported_at_once_and_each_image_is_read_once(folder, monkeypatch):
    import jobs.manifest.images as images

    reads = []
    real = images.read_input
    monkeypatch.setattr(images, "read_input", lambda uri, **kw: reads.append(uri) or real(uri, **kw))
    path = write(folder, """
        name: ads
        videos:
          - {id: a, prompt: p, image: shots/shoe.png}
          - {id: b, prompt: p, image: ./shots/../shots/shoe.png}
          - {id: c, prompt: p, image: shots/none.png}
          - {id: d, prompt: p, image: shots/none.png}
    """)
    with pytest.raises(ManifestError) as info:
        load(path)
    assert [(i.line, i.field) for i in info.value.issues] == [(5, "videos[2].image"), (6, "videos[3].image")]
    assert len(reads) == 2, "one read per image, whatever the number of videos or the spelling of its path"


def test_allowed_prefixes_open_absolute_paths_by_whole_folder(folder, tmp_path_factory):
    outside = tmp_path_factory.mktemp("library")
    (outside / "a.png").write_bytes(png())
    (outside.parent / f"{outside.name}x").mkdir(exist_ok=True)
    (outside.parent / f"{outside.name}x" / "a.png").write_bytes(png())
    path = write(folder, f"""
        name: ads
        videos:
          - {{id: a, prompt: p, image: {outside / 'a.png'}}}
          - {{id: b, prompt: p, image: {(outside / 'a.png').as_uri()}}}
    """)
    a, b = load(path, allowed_inputs=[str(outside)]).videos
    assert a.image == b.image == (outside / "a.png").resolve().as_uri()
    sibling = write(folder, f"""
        name: ads
        videos: [{{id: a, prompt: p, image: {outside.parent / (outside.name + 'x') / 'a.png'}}}]
    """, name="sibling.yaml")
    expect(sibling, 2, "videos[0].image", "is not under an allowed input prefix", allowed_inputs=[str(outside)])


def test_a_plain_folder_in_the_setting_allows_its_images(folder, tmp_path_factory):
    """REELBATCH_ALLOWED_INPUTS=/dir/, read by the settings as the CLI reads it, opens that folder and no other."""
    outside = tmp_path_factory.mktemp("shots")
    (outside / "a.png").write_bytes(png())
    allowed = Settings.from_env({"REELBATCH_ALLOWED_INPUTS": f"{outside}/"}).manifest.allowed_inputs
    path = write(folder, f"name: ads\nvideos: [{{id: a, prompt: p, image: {outside / 'a.png'}}}]\n")
    (video,) = load(path, allowed_inputs=allowed).videos
    assert video.image == (outside / "a.png").resolve().as_uri()
    expect(path, 2, "videos[0].image", "is not under an allowed input prefix",
           allowed_inputs=Settings.from_env({"REELBATCH_ALLOWED_INPUTS": f"{outside}x/"}).manifest.allowed_inputs)


def test_a_bad_allowed_prefix_names_the_setting(folder):
    path = write(folder, "name: ads\nvideos: [{id: a, prompt: p}]\n")
    with pytest.raises(UsageError, match="REELBATCH_ALLOWED_INPUTS: 'relative/dir' must be an absolute folder"):
        load(path, allowed_inputs=["relative/dir"])


def test_images_in_s3_under_an_allowed_prefix(folder, s3_env):
    client = boto3.session.Session().client("s3")
    client.put_object(Bucket=s3_env, Key="shots/shoe.png", Body=png())
    client.put_object(Bucket=s3_env, Key="shots/notes.txt", Body=b"hello")
    path = write(folder, f"""
        name: ads
        videos:
          - {{id: a, prompt: p, image: s3://{s3_env}/shots/shoe.png}}
          - {{id: b, prompt: p, image: s3://{s3_env}/shots/gone.png}}
          - {{id: c, prompt: p, image: s3://{s3_env}/shots/notes.txt}}
    """)
    with pytest.raises(ManifestError) as info:
        load(path, allowed_inputs=[f"s3://{s3_env}/shots/"])
    assert [(i.line, i.field) for i in info.value.issues] == [(4, "videos[1].image"), (5, "videos[2].image")]
    assert f"no such image: s3://{s3_env}/shots/gone.png" in info.value.issues[0].message
    assert "is not a decodable image" in info.value.issues[1].message
    ok = write(folder, f"name: ads\nvideos: [{{id: a, prompt: p, image: s3://{s3_env}/shots/shoe.png}}]\n",
               name="ok.yaml")
    (video,) = load(ok, allowed_inputs=[f"s3://{s3_env}/shots"]).videos
    assert (video.image, video.image_sha256) == (f"s3://{s3_env}/shots/shoe.png", hashlib.sha256(png()).hexdigest())


def test_a_schedule_manifest_in_s3_reads_relative_images_beside_it(folder, s3_env):
    client = boto3.session.Session().client("s3")
    client.put_object(Bucket=s3_env, Key="nightly/shots/shoe.png", Body=png())
    path = write(folder, "name: ads\nvideos:\n  - {id: a, prompt: p, image: shots/shoe.png}\n"
                         "  - {id: b, prompt: p, image: ../../other/x.png}\n")
    with pytest.raises(ManifestError) as info:
        load(path, folder=f"s3://{s3_env}/nightly/")
    (issue,) = info.value.issues
    assert (issue.line, issue.field) == (4, "videos[1].image") and "leads out of the manifest's folder" in issue.message
    path = write(folder, "name: ads\nvideos: [{id: a, prompt: p, image: shots/shoe.png}]\n", name="ok.yaml")
    (video,) = load(path, folder=f"s3://{s3_env}/nightly/").videos
    assert video.image == f"s3://{s3_env}/nightly/shots/shoe.png"


def test_what_the_model_makes_of_an_image(folder, tmp_path):
    registry = Registry({"tiny": TINY, "words": dataclasses.replace(TINY, name="words", image_condition=None),
                         "i2v": dataclasses.replace(TINY, name="i2v", image_condition="pipeline")})

    def issues(text):
        with pytest.raises(ManifestError) as info:
            load_manifest(write(folder, text), registry=registry)
        return [(i.line, i.field, i.message) for i in info.value.issues]

    (issue,) = issues("name: a\nmodel: words\ndefaults: {image: shots/shoe.png}\nvideos: [{id: a, prompt: p}]\n")
    assert issue[:2] == (3, "defaults.image")
    assert issue[2] == "model 'words' does not take images (models that do: i2v, tiny)"
    (issue,) = issues("name: a\nmodel: i2v\nvideos:\n  - {id: a, prompt: p}\n")
    assert issue[:2] == (4, "videos[0].image") and "renders every video from an image" in issue[2]
    # Longer than the window (33 frames, 4.125 s at 8 fps): rendered in chunks from the picture (issue 32).
    (long,) = load_manifest(write(folder, "name: a\nmodel: i2v\nvideos:\n  - {id: a, prompt: p, image: shots/shoe.png, "
                                          "duration_s: 5}\n"), registry=registry).videos
    assert (long.frames, long.chunks) == (41, 2)
    (issue,) = issues("name: a\nvideos:\n  - {id: a, prompt: p, fit: pad}\n")
    assert issue == (3, "videos[0].fit", "applies only to a video with an image (give it an `image`)")


def test_a_model_that_keeps_image_videos_apart_gives_them_their_own_shape_key(folder):
    from jobs.db.rows import WorkUnit

    registry = Registry({"tiny": TINY, "apart": dataclasses.replace(TINY, name="apart", mixed_image_batches=False)})
    factory = session_factory(f"sqlite:///{folder / 'reelbatch.db'}")
    for model in ("tiny", "apart"):
        path = write(folder, f"name: {model}\nmodel: {model}\nvideos:\n  - {{id: a, prompt: p}}\n"
                             "  - {id: b, prompt: p, image: shots/shoe.png}\n")
        submit_run(factory, load_manifest(path, registry=registry), output="file:///out/")
    with factory() as s:
        keys = [u.shape_key for u in s.query(WorkUnit).order_by(WorkUnit.id)]
    assert keys == ["tiny|64x64|f9|s4|g5", "tiny|64x64|f9|s4|g5",
                    "apart|64x64|f9|s4|g5", "apart|64x64|f9|s4|g5|image"]
