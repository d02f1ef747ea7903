"""Wan 2.2's two architectures at tiny widths (engine.tiny), registered through a models file as an operator
registers a downloaded folder; shared by the engine's tests and the manifest's."""

from pathlib import Path

from engine.tiny import ensure_tiny, ensure_tiny_a14b, ensure_tiny_ti2v

# The registered names.
A14B, TI2V = "a14b", "ti2v"


def write_models_file(folder: Path, cache: Path, **extra: str) -> Path:
    """A models file registering the tiny Wan 2.2 folders (and tiny itself as `wan21`), built into `cache` on first
    use; `extra` adds YAML lines to an entry, e.g. a14b="offload_idle_expert: true"."""
    paths = {A14B: ensure_tiny_a14b(cache), TI2V: ensure_tiny_ti2v(cache), "wan21": ensure_tiny(cache)}
    text = ""
    for name, path in paths.items():
        text += f"{name}:\n  path: {path}\n  max_sequence_length: 64\n"
        text += "".join(f"  {line}\n" for line in extra.get(name, "").splitlines())
    models = folder / "models.yaml"
    models.write_text(text)
    return models
