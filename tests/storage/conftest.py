"""The store tests' fixtures: two small MP4s, and each store on a fresh root."""

import numpy as np
import pytest

from storage.encode import encode_mp4
from storage.local import LocalStore
from storage.s3 import S3Store
from storage.stores import open_store


@pytest.fixture(scope="module")
def video() -> bytes:
    return encode_mp4(np.random.default_rng(1).integers(0, 256, (3, 16, 16, 3), dtype=np.uint8), 8)


@pytest.fixture(scope="module")
def other_video() -> bytes:
    return encode_mp4(np.random.default_rng(2).integers(0, 256, (3, 16, 16, 3), dtype=np.uint8), 8)


@pytest.fixture
def local_store(tmp_path) -> LocalStore:
    return open_store(f"file://{tmp_path / 'out'}/")


@pytest.fixture
def s3_store(s3_env) -> S3Store:
    # No endpoint_url: the store must find moto through AWS_ENDPOINT_URL, as it will find a real endpoint.
    return open_store(f"s3://{s3_env}/runs/")
