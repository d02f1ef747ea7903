"""Service settings: one table of environment variables (name, field, type, default, help), read once per process
into a frozen `Settings` and passed in explicitly. Its fields are groups, one per part of the service they configure
(jobs.settings.groups), and each part is handed its own group: the engine its EngineConfig, a manifest's reader its
ManifestPolicy, a cost record its Rate. A bad value stops the command with one line naming the variable and
the value (exit 2); nothing is silently truncated. docs/SETTINGS.md's table is made from this one (`reelbatch settings
--markdown`), and a test fails when they differ.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path

from engine.errors import ModelNotFound
from engine.levers.config import EngineConfig
from engine.models.file import load_registry
from engine.models.registry import Registry
from jobs.cost.prices import Price, Rate, StoragePrice
from jobs.errors import UsageError
from jobs.manifest.policy import ManifestPolicy
from jobs.settings.groups import Limits, Prices, Reports, Webhooks, Worker
from jobs.settings.variables import VARIABLES

__all__ = ["VARIABLES", "Limits", "Prices", "Reports", "Settings", "Webhooks", "Worker", "markdown_table"]


@dataclass(frozen=True)
class Settings:
    """Every setting of the service: where its state lives, then one group per part it configures. A variable of
    VARIABLES sets one field, named by its path here ("worker.max_batch", "prices.gpu.usd_per_hour")."""

    database_url: str
    broker_url: str
    models_file: Path | None
    manifest: ManifestPolicy  # what a manifest may name, and the output a run without one gets
    webhooks: Webhooks
    engine: EngineConfig
    worker: Worker
    limits: Limits
    prices: Prices
    reports: Reports

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if env is None else env
        tree: dict = {}
        for v in VARIABLES:
            *groups, name = v.field.split(".")
            node = tree
            for group in groups:
                node = node.setdefault(group, {})
            node[name] = v.value(env)
        return _build("", tree)

    def value(self, path: str) -> object:
        """The field a variable sets, by its path ("engine.device")."""
        node: object = self
        for name in path.split("."):
            node = getattr(node, name)
        return node

    def with_values(self, values: Mapping[str, object]) -> Settings:
        """These settings with values over them, by the paths the variables name ({"worker.max_batch": 2})."""
        settings = self
        for path, value in values.items():
            settings = _replace_at(settings, path.split("."), value)
        return settings

    def engine_config(self) -> EngineConfig:
        """The engine's group, its attention backend checked (diffusers, and so torch, is imported only where an
        engine is configured)."""
        if self.engine.attention != "native":
            _check_attention(self.engine.attention)
        return self.engine

    def registry(self) -> Registry:
        """The built-in models plus the operator's models file; a bad file is a usage error naming it."""
        try:
            return load_registry(self.models_file)
        except ModelNotFound as exc:
            raise UsageError(f"REELBATCH_MODELS: {exc}") from None
        except OSError as exc:
            raise UsageError(f"REELBATCH_MODELS: cannot read {self.models_file}: {exc.strerror}") from None

    def served_models(self, registry: Registry | None = None) -> tuple[str, ...]:
        """The models a worker with these settings serves: every registered model, or those of `worker_models`
        (each must be registered)."""
        registry = registry or self.registry()
        if self.worker.models is None:
            return tuple(registry.names())
        unknown = [m for m in self.worker.models if m not in registry]
        if unknown:
            raise UsageError(f"--models / REELBATCH_WORKER_MODELS: {', '.join(map(repr, unknown))} not registered "
                             f"here (registered: {', '.join(registry.names())})")
        return tuple(dict.fromkeys(self.worker.models))


# The class of each group, by its path in Settings.
GROUPS: dict[str, type] = {"": Settings, "manifest": ManifestPolicy, "webhooks": Webhooks, "engine": EngineConfig,
                           "worker": Worker, "limits": Limits, "prices": Prices, "prices.gpu": Rate,
                           "prices.storage": StoragePrice, "prices.sale": Price, "reports": Reports}


def _build(path: str, tree: dict) -> object:
    kwargs = {name: _build(f"{path}.{name}".lstrip("."), value) if isinstance(value, dict) else value
              for name, value in tree.items()}
    return GROUPS[path](**kwargs)


def _replace_at(node, names: list[str], value: object):
    name, rest = names[0], names[1:]
    if name not in {f.name for f in fields(node)}:
        raise AttributeError(f"{type(node).__name__} has no setting {name!r}")
    return replace(node, **{name: _replace_at(getattr(node, name), rest, value) if rest else value})


def _check_attention(name: str) -> None:
    """A diffusers attention-backend name; checked only where an engine is configured (diffusers imports torch)."""
    from diffusers.models.attention_dispatch import AttentionBackendName

    names = [b.value for b in AttentionBackendName]
    if name not in names:
        raise UsageError(f"environment variable REELBATCH_ATTENTION: {name!r} is not a diffusers attention backend "
                         f"(one of: {', '.join(names)})")


def markdown_table() -> str:
    """docs/SETTINGS.md's table: every variable, what it means and its default."""
    rows = ["| variable | sets | meaning | default |", "|---|---|---|---|"]
    rows += [f"| `{v.name}` | `{v.field}` | {v.help} | {v.shown} |" for v in VARIABLES]
    return "\n".join(rows) + "\n"
