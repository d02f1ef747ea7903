"""The models file's keys, and its text read with the line of every key, so that a key no registration knows (a typo
such as `precison: int8`, which would leave the model at full precision without a word) is refused as a manifest's
unknown field is: naming the file, the line, the model and the key, with the nearest known key.

Apart from engine.models.file (what each key's value must be) because this is about the file's shape: which keys
exist at which level. The engine stands below jobs (tests/test_imports.py), so jobs.manifest's reader is not used:
PyYAML's own nodes carry the lines.
"""

from __future__ import annotations

import difflib
from pathlib import Path

import yaml

from engine.errors import ModelNotFound
from engine.frames.video_checks import Thresholds
from engine.models.registry import ModelDefaults

# Every key a registration may hold (engine.models.file.load_registry reads each; docs/MODELS.md describes them).
REGISTRATION_KEYS = (
    "path", "base", "defaults", "max_frames", "chunk_overlap", "chunk_condition", "max_sequence_length", "max_batch",
    "temporal_factor", "spatial_multiple", "image_condition", "mixed_image_batches", "precision",
    "text_encoder_precision", "checks", "adapters", "sampler", "decoder", "teacher", "clip", "guidance_2",
    "offload_idle_expert", "boundary_ratio",
)
# The keys of a registration's mappings (an adapter is one item of `adapters`, a list).
SUB_KEYS: dict[str, tuple[str, ...]] = {
    "defaults": tuple(ModelDefaults.__dataclass_fields__),
    "checks": tuple(Thresholds.__dataclass_fields__),
    "sampler": ("name", "shift", "shift_terminal"),
    "adapters": ("path", "scale", "expert"),
}
_MERGE = "tag:yaml.org,2002:merge"


def read_models_file(models_file: Path) -> tuple[object, dict[str, int]]:
    """The file's value (as yaml.safe_load gives it) and each top-level name's line, every key checked: an unknown
    or repeated key at any level is a ModelNotFound naming `models_file`, the key's line, the model and the key."""
    text = Path(models_file).read_text(encoding="utf-8")
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        where = f"{models_file}:{mark.line + 1}" if mark is not None else str(models_file)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ModelNotFound(f"{where}: not valid YAML: {problem}") from None
    finally:
        loader.dispose()
    lines: dict[str, int] = {}
    if isinstance(node, yaml.MappingNode):
        for key, value in _pairs(models_file, node, "", None):
            name = str(key.value)
            lines[name] = key.start_mark.line + 1
            if isinstance(value, yaml.MappingNode):
                _check_registration(models_file, name, value)
    return data, lines


def _check_registration(models_file: Path, name: str, node: yaml.MappingNode) -> None:
    for key, value in _pairs(models_file, node, "", name):
        _known(models_file, name, "", key, REGISTRATION_KEYS)
        sub = SUB_KEYS.get(str(key.value))
        if sub is None:
            continue
        if isinstance(value, yaml.MappingNode):
            for inner, _ in _pairs(models_file, value, f"{key.value}: ", name):
                _known(models_file, name, f"{key.value}: ", inner, sub)
        elif isinstance(value, yaml.SequenceNode):
            for i, item in enumerate(value.value):
                if isinstance(item, yaml.MappingNode):
                    for inner, _ in _pairs(models_file, item, f"{key.value}[{i}]: ", name):
                        _known(models_file, name, f"{key.value}[{i}]: ", inner, sub)


def _pairs(models_file: Path, node: yaml.MappingNode, at: str, name: str | None) -> list[tuple[yaml.Node, yaml.Node]]:
    """A mapping's (key, value) nodes, YAML merges (`<<: *anchor`) taken in as safe_load takes them; a key given
    twice at one level is refused (safe_load would keep the last without a word)."""
    pairs, seen = [], {}
    for key, value in node.value:
        if key.tag == _MERGE:
            merged = value.value if isinstance(value, yaml.SequenceNode) else [value]
            pairs += [p for m in merged if isinstance(m, yaml.MappingNode) for p in _pairs(models_file, m, at, name)
                      if str(p[0].value) not in seen]
            continue
        line = key.start_mark.line + 1
        text = str(key.value)
        if text in seen:
            model = f"model {name!r}: " if name is not None else ""
            raise ModelNotFound(f"{models_file}:{line}: {model}{at}{text!r} given twice (first at line {seen[text]})")
        seen[text] = line
        pairs.append((key, value))
    return pairs


def _known(models_file: Path, name: str, at: str, key: yaml.Node, known: tuple[str, ...]) -> None:
    text = str(key.value)
    if text in known:
        return
    close = difflib.get_close_matches(text, known, n=1, cutoff=0.6)
    hint = f"did you mean {close[0]!r}?" if close else f"known: {', '.join(known)}"
    raise ModelNotFound(f"{models_file}:{key.start_mark.line + 1}: model {name!r}: {at}unknown key {text!r} ({hint})")
