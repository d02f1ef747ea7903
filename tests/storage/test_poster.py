"""A video's poster: its MP4's middle frame as a JPEG, checked by opening the JPEG and reading its pixels."""

import io

import numpy as np
import pytest
from PIL import Image

from storage.encode import encode_mp4
from storage.poster import middle_frame, poster_jpeg


def grey_steps(count: int, height: int = 32, width: int = 64) -> np.ndarray:
    """Frame i is a flat grey of level 28 x i (mod 256), so each frame can be told from its neighbours by its mean."""
    frames = np.empty((count, height, width, 3), dtype=np.uint8)
    for i in range(count):
        frames[i] = (28 * i) % 256
    return frames


@pytest.mark.parametrize("count, middle", [(1, 0), (2, 1), (9, 4), (33, 16), (81, 40)])
def test_the_poster_frame_is_the_middle_one(count, middle):
    assert middle_frame(count) == middle


def test_the_poster_is_a_jpeg_of_the_middle_frame():
    data = poster_jpeg(encode_mp4(grey_steps(9), 8))
    image = Image.open(io.BytesIO(data))
    assert (image.format, image.size, image.mode) == ("JPEG", (64, 32), "RGB")
    # Frame 4 of 9 is grey 112; its neighbours are 84 and 140. H.264 then JPEG move a flat grey by a level or two.
    assert abs(np.asarray(image).astype(float).mean() - 112) < 3


def test_the_poster_of_a_long_video_is_frame_40_of_81():
    image = Image.open(io.BytesIO(poster_jpeg(encode_mp4(grey_steps(81, 16, 16), 16))))
    assert abs(np.asarray(image).astype(float).mean() - (28 * 40) % 256) < 3  # frame 40: grey 96


def test_the_same_mp4_always_makes_the_same_poster_bytes():
    """A retry that adopts an uploaded MP4 puts its poster again: the store must see the same bytes, not a conflict."""
    mp4 = encode_mp4(grey_steps(9), 8)
    assert poster_jpeg(mp4) == poster_jpeg(bytes(mp4))


def test_an_h265_video_has_a_poster_too():
    image = Image.open(io.BytesIO(poster_jpeg(encode_mp4(grey_steps(9), 8, codec="h265"))))
    assert abs(np.asarray(image).astype(float).mean() - 112) < 3


def test_bytes_that_are_no_mp4_are_refused():
    with pytest.raises(Exception):  # noqa: B017 - PyAV's own error type for an unreadable container
        poster_jpeg(b"not an mp4")
