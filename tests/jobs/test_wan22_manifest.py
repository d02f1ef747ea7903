"""A manifest naming a Wan 2.2 model: its registration's defaults and rules apply at submit (the manifest check)."""

import pytest

from engine.models.file import load_registry
from jobs.manifest import ManifestError, load_manifest
from tests.engine.wan22 import write_models_file

from .manifest_helpers import write


@pytest.fixture(scope="module")
def registry(model_cache, tmp_path_factory):
    return load_registry(write_models_file(tmp_path_factory.mktemp("wan22-models"), model_cache))


def test_a_ti2v_video_inherits_1280x704_at_24_fps_and_121_frames(tmp_path, registry):
    path = write(tmp_path, """
        name: t
        model: ti2v
        videos:
          - {id: a, prompt: p}
          - {id: long, prompt: p, duration_s: 10}
    """)
    a, long = load_manifest(path, registry=registry).videos
    assert (a.width, a.height, a.fps, a.frames, a.steps, a.guidance, a.chunks) == (1280, 704, 24, 121, 50, 5.0, 1)
    # 10 s at 24 fps: 241 frames, 3 chunks of the 121-frame window.
    assert (long.frames, long.chunks, long.window) == (241, 3, 121)


def test_a_ti2v_size_off_its_32_pixel_grid_is_refused_at_submit(tmp_path, registry):
    path = write(tmp_path, """
        name: t
        model: ti2v
        videos:
          - {id: a, prompt: p, resolution: 1280x720}
    """)
    with pytest.raises(ManifestError) as info:
        load_manifest(path, registry=registry)
    (issue,) = info.value.issues
    assert (issue.line, issue.field) == (4, "videos[0].resolution")
    # The tiny TI2V build's Wan 2.2 VAE compresses space by 16, its patches are 2x2: 16 x 2 = 32.
    assert issue.message == "height 720 in '1280x720' is not a multiple of 32 (ti2v: VAE factor 16 x patch 2)"


def test_an_a14b_video_takes_the_high_noise_scale_from_the_manifest(tmp_path, registry):
    path = write(tmp_path, """
        name: t
        model: a14b
        defaults: {guidance: 3.5}
        videos:
          - {id: a, prompt: p, resolution: 832x480}
    """)
    (a,) = load_manifest(path, registry=registry).videos
    assert (a.width, a.height, a.fps, a.frames, a.steps, a.guidance) == (832, 480, 16, 81, 40, 3.5)
    assert registry.get("a14b").guidance_2 == 3.0, "the low-noise scale stays the registration's"
