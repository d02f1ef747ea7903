"""The manifest: a YAML or JSONL file read (read, yaml_read; unquoted values by one number rule, scalars), its values
kept with their lines (values), each field checked (fields; the output in its one canonical form, outputs; a webhook
under an allowed prefix, urls), each video's fields over the defaults (videos), the run assembled (load) into frozen
specs (specs) whose names fit the store in bytes (room, by the key layout in keys), or every problem reported at
once."""

from jobs.manifest.load import load_manifest
from jobs.manifest.specs import ManifestError, ManifestIssue, RunSpec, VideoSpec, derive_seed

__all__ = ["ManifestError", "ManifestIssue", "RunSpec", "VideoSpec", "derive_seed", "load_manifest"]
