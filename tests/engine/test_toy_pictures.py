"""Pictures of the toy world beyond training's sampling (toyworld.pictures): anti-aliased edges, sub-pixel positions
on the torus, other shades of the palette colours. Expected pixels worked out by hand."""

import numpy as np
import pytest

from toyworld.judge import judge_clip
from toyworld.pictures import PictureSpec, coverage, render_picture, sample_picture, shade_near, srgb_from_lab
from toyworld.sight import lab
from toyworld.world import COLOURS


def test_a_square_between_pixels_covers_half_of_each_edge_pixel():
    # A 2-px square whose left edge is at x = 0.5: column 0 half covered, column 1 whole, column 2 half.
    picture = render_picture(PictureSpec("red", "square", "black", 2.0, 0.5, 0.0, (200, 0, 0)), width=16, height=16)
    assert picture[0, :4, 0].tolist() == [100, 200, 100, 0]
    assert picture[1, :4, 0].tolist() == [100, 200, 100, 0]
    assert picture[2].max() == 0 and picture[..., 1:].max() == 0
    # On gray the edge is the mean of the shade and the background: (128 + 200) / 2 = 164, (128 + 0) / 2 = 64.
    gray = render_picture(PictureSpec("red", "square", "gray", 2.0, 0.5, 0.0, (200, 0, 0)), width=16, height=16)
    assert gray[0, 0].tolist() == [164, 64, 64] and gray[0, 3].tolist() == [128, 128, 128]


def test_a_shape_across_the_edge_wraps_around_the_torus():
    # x = 15.5 in a 16-px frame: half of column 15, all of column 0, half of column 1.
    share = coverage("square", 2.0, 15.5, 15.0, width=16, height=16)
    assert share[15, 15] == 0.5 and share[15, 0] == 1.0 and share[15, 1] == 0.5
    assert share[0, 0] == 1.0 and share[1, 0] == 0.0 and share.sum() == 4.0


def test_a_disc_covers_its_area():
    # A disc of diameter 8 covers pi * 4^2 = 50.27 px; 64 sample points a pixel put the sum within 0.3 of it.
    share = coverage("circle", 8.0, 3.3, 7.9, width=32, height=32)
    assert abs(share.sum() - 50.27) < 0.3
    assert share.max() == 1.0 and ((share > 0) & (share < 1)).sum() > 20, "anti-aliased: partly covered pixels"
    with pytest.raises(ValueError, match="shape must be one of circle, square"):
        coverage("triangle", 8.0, 0, 0, width=32, height=32)


def test_lab_back_to_srgb():
    for rgb in ((210, 30, 30), (100, 230, 90), (40, 60, 210), (230, 210, 40), (240, 240, 240), (0, 0, 0)):
        assert np.abs(srgb_from_lab(lab(np.array(rgb))) - rgb).max() < 0.01, rgb


@pytest.mark.parametrize("colour", list(COLOURS))
def test_a_shade_is_another_colour_at_the_asked_distance(colour):
    rng = np.random.default_rng(5)
    shades = [shade_near(rng, colour, (3.0, 10.0)) for _ in range(40)]
    for rgb in shades:
        distance = np.linalg.norm(lab(np.array(rgb)) - lab(np.array(COLOURS[colour])))
        assert 3.0 <= distance <= 10.0 and all(0 <= c <= 255 for c in rgb), rgb
    assert len(set(shades)) > 30, "shades in every direction, not one"
    with pytest.raises(ValueError, match="delta_e must be"):
        shade_near(rng, colour, (10.0, 3.0))


def test_sampled_pictures_are_seeded_in_range_and_read_as_their_colour_and_shape():
    sizes = ((9.6, 15.0), (18.9, 22.1))
    specs = [sample_picture(seed, width=32, height=32, sizes=sizes, delta_e=(3.0, 10.0)) for seed in range(200)]
    assert specs[7] == sample_picture(7, width=32, height=32, sizes=sizes, delta_e=(3.0, 10.0))
    assert all(9.6 <= s.size <= 15.0 or 18.9 <= s.size <= 22.1 for s in specs)
    assert all(0 <= s.x < 32 and 0 <= s.y < 32 for s in specs) and all(3.0 <= s.delta_e <= 10.0 for s in specs)
    for spec in specs[:60]:
        verdict = judge_clip(render_picture(spec, width=32, height=32)[None])
        assert (verdict.colour, verdict.shape, verdict.background) == (spec.colour, spec.shape, spec.background)
    fixed = sample_picture(1, width=32, height=32, sizes=sizes, delta_e=(3.0, 10.0), colour="blue", shape="circle",
                           background="gray")
    assert (fixed.colour, fixed.shape, fixed.background) == ("blue", "circle", "gray")
    with pytest.raises(ValueError, match="sizes must be ranges"):
        sample_picture(1, width=32, height=32, sizes=((10.0, 40.0),), delta_e=(3.0, 10.0))
