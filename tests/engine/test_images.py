"""Pictures a video starts from: decoded from their bytes (never their name) and fitted to the video's size."""

import io

import numpy as np
import pytest
from PIL import Image

from engine.frames.images import ImageError, decode_image, fit_image

RED, BLUE = (200, 30, 30), (30, 30, 200)


def encoded(pixels: np.ndarray, fmt: str, **options) -> bytes:
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format=fmt, **options)
    return out.getvalue()


def halves(width: int, height: int) -> np.ndarray:
    """Left half red, right half blue."""
    pixels = np.empty((height, width, 3), dtype=np.uint8)
    pixels[:, : width // 2] = RED
    pixels[:, width // 2 :] = BLUE
    return pixels


def test_png_and_webp_decode_to_their_exact_pixels():
    pixels = halves(6, 4)
    assert np.array_equal(decode_image(encoded(pixels, "PNG")), pixels)
    assert np.array_equal(decode_image(encoded(pixels, "WEBP", lossless=True)), pixels)


def test_a_camera_jpeg_is_turned_upright_by_its_exif_orientation():
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90 CW to view": stored sideways, 40 wide and 20 tall
    data = encoded(halves(40, 20), "JPEG", exif=exif.tobytes(), quality=95)
    upright = decode_image(data)
    assert upright.shape == (40, 20, 3)
    # Rotated clockwise, the left (red) half is on top.
    assert np.abs(upright[5, 10].astype(int) - RED).max() < 20 and np.abs(upright[35, 10].astype(int) - BLUE).max() < 20


def test_palette_and_alpha_images_come_back_as_rgb():
    rgba = np.zeros((4, 4, 4), dtype=np.uint8)
    rgba[..., 0], rgba[..., 3] = 250, 255
    assert np.array_equal(decode_image(encoded(rgba, "PNG")), np.full((4, 4, 3), (250, 0, 0), np.uint8))
    out = io.BytesIO()
    Image.fromarray(halves(4, 4)).convert("P", palette=Image.Palette.ADAPTIVE, colors=2).save(out, format="PNG")
    assert np.array_equal(decode_image(out.getvalue()), halves(4, 4))


@pytest.mark.parametrize("data,message", [
    (b"GIF89a" + bytes(40), "is not a decodable image"),
    (encoded(halves(4, 4), "GIF"), "is GIF data; use PNG, JPEG, WEBP"),
    (encoded(halves(4, 4), "BMP"), "is BMP data; use PNG, JPEG, WEBP"),
    (b"just text, named .png", "is not a decodable image (not PNG, JPEG, WEBP data)"),
    (encoded(halves(64, 64), "PNG")[:60], "is not a decodable image"),
    (encoded(np.zeros((1, 8193, 3), np.uint8), "PNG"), "is 8193x1 px, over the 8192 px limit a side"),
])
def test_bytes_that_are_not_a_usable_image_are_refused(data, message):
    with pytest.raises(ImageError, match=message.replace("(", r"\(").replace(")", r"\)")):
        decode_image(data)


def test_an_image_of_the_videos_size_is_not_resampled():
    pixels = halves(32, 16)
    for fit in ("crop", "pad", "stretch"):
        assert fit_image(pixels, 32, 16, fit) is pixels


def test_crop_covers_the_frame_and_keeps_the_middle():
    # 64x32 into 32x32: already 32 tall, so no scaling; columns 16-47 are kept, 16 red then 16 blue.
    out = fit_image(halves(64, 32), 32, 32, "crop")
    assert out.shape == (32, 32, 3)
    assert (out[:, :16] == RED).all() and (out[:, 16:] == BLUE).all()


def test_pad_fits_inside_and_fills_the_rest_with_black():
    # 64x32 into 32x32: halved to 32x16, centred, rows 0-7 and 24-31 black.
    out = fit_image(halves(64, 32), 32, 32, "pad")
    assert out.shape == (32, 32, 3)
    assert (out[:8] == 0).all() and (out[24:] == 0).all()
    # Away from the seam Lanczos keeps flat colour within a step or two.
    assert np.abs(out[12:20, :12].astype(int) - RED).max() <= 2
    assert np.abs(out[12:20, 20:].astype(int) - BLUE).max() <= 2


def test_stretch_scales_each_side_on_its_own():
    out = fit_image(halves(64, 32), 32, 64, "stretch")
    assert out.shape == (64, 32, 3)
    assert np.abs(out[:, :12].astype(int) - RED).max() <= 2 and np.abs(out[:, 20:].astype(int) - BLUE).max() <= 2


def test_an_unknown_fit_is_a_caller_error():
    with pytest.raises(ValueError, match="fit must be one of crop, pad, stretch, got 'zoom'"):
        fit_image(halves(8, 8), 16, 16, "zoom")
