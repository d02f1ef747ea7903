"""The Wan 2.2 registry (tests/engine/wan22.py), built once per session into the model cache."""

import pytest

from engine.models.file import load_registry
from engine.models.registry import Registry

from .wan22 import write_models_file


@pytest.fixture(scope="session")
def wan22(model_cache, tmp_path_factory) -> Registry:
    return load_registry(write_models_file(tmp_path_factory.mktemp("wan22"), model_cache))
