"""What a deployment lets a manifest name, as one value: the output prefixes a run may write under, the webhook URL
prefixes `notify` may name, the prefixes an image outside the manifest's folder may be read from, and the output a
run without one gets. Read from the settings in one place (Settings.manifest) and handed to load_manifest by
every way in (`submit`, `run`, `estimate`, a schedule's firing), so that what one accepts the others accept: the
four values were once unpacked at each call, and `estimate` had lost two of them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ManifestPolicy:
    """The defaults are the strictest reading of a missing setting, as load_manifest has always had them."""

    allowed_outputs: tuple[str, ...] | None = None  # REELBATCH_ALLOWED_OUTPUTS; None: any output
    allowed_webhooks: tuple[str, ...] | None = None  # REELBATCH_ALLOWED_WEBHOOKS; None: `notify` is refused
    allowed_inputs: tuple[str, ...] | None = None  # REELBATCH_ALLOWED_INPUTS; None: images in the folder only
    default_output: str | None = None  # REELBATCH_OUTPUT; None: a run without an output keeps none

    def __post_init__(self) -> None:
        # Held as tuples whatever sequence was given, so the value stays frozen all the way down.
        for name in ("allowed_outputs", "allowed_webhooks", "allowed_inputs"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, tuple):
                object.__setattr__(self, name, tuple(value))
