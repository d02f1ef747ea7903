"""engine.levers.fast_ops against the diffusers operators they replace."""

import pytest
import torch
from diffusers.models.autoencoders.autoencoder_kl_wan import WanRMS_norm

from engine.levers.fast_ops import use_fast_vae_norm


@pytest.mark.parametrize(("channel_first", "images", "shape", "dtype"), [
    (True, False, (2, 8, 3, 16, 16), torch.float32),  # the VAE's 3-D blocks
    (True, True, (2, 8, 16, 16), torch.float32),  # its 2-D attention
    (False, False, (2, 5, 8), torch.float32),
    (True, False, (2, 8, 3, 16, 16), torch.bfloat16),
])
def test_the_fast_norm_is_diffusers_norm_to_float_rounding(channel_first, images, shape, dtype):
    torch.manual_seed(0)
    norm = WanRMS_norm(8, channel_first=channel_first, images=images, bias=True)
    with torch.no_grad():
        norm.gamma.uniform_(0.5, 1.5)
        norm.bias.uniform_(-0.1, 0.1)
    x = (torch.randn(shape) * 3).to(dtype)
    x[0, ..., 0] = 0  # an all-zero vector: both clamp the norm at eps instead of dividing by zero
    expected = norm(x)
    holder = torch.nn.Sequential(norm)
    assert use_fast_vae_norm(holder) == 1
    got = norm(x)
    assert got.dtype == expected.dtype and torch.isfinite(got).all()
    tolerance = 1e-6 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(got.float(), expected.float(), rtol=tolerance, atol=tolerance)
