"""A video's `image`: where it may come from, and the checks at submit (read, decoded, measured and hashed).

An image is a path relative to the manifest's folder (and inside it), or an absolute path, `file:///` or `s3://` URI
under one of the operator's REELBATCH_ALLOWED_INPUTS prefixes (none by default, so a manifest cannot read arbitrary
files). Local paths are resolved with symlinks followed before they are checked, so a link cannot lead out. Each
image is read once per manifest, whatever the number of videos naming it; its SHA-256 becomes part of the video.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote

from engine.frames.images import MAX_IMAGE_BYTES, ImageError, decode_image
from engine.models.registry import ModelInfo
from jobs.errors import UsageError
from jobs.manifest.specs import VideoSpec
from jobs.manifest.values import FieldError, Map, shown
from storage.inputs import read_input
from storage.stores import ObjectNotFound, ObjectTooLarge, StoreError


@dataclass(frozen=True)
class InputImage:
    uri: str  # file:///real/path (percent-encoded) or s3://bucket/key
    sha256: str
    width: int
    height: int


class ImageChecker:
    """Field checker for `image` (called as `checker(value, source_text)`), bound to one manifest's folder."""

    def __init__(self, folder: str | Path, allowed: Sequence[str] | None):
        # `folder`: a local folder, or an s3://bucket/prefix/ (a manifest read from S3).
        self.folder = folder if isinstance(folder, str) and folder.startswith("s3://") else os.path.realpath(folder)
        self.allowed = tuple(allowed_input_key(a) for a in allowed or ())
        self._seen: dict[str, InputImage | FieldError] = {}

    def __call__(self, value: object, text: str | None) -> InputImage | None:
        if value is None:  # null: no image, over a default's
            return None
        if not isinstance(value, str) or not value.strip():
            raise FieldError(f"must be a path or URI of an image, got {shown(value, text)}")
        uri = self._locate(value)
        if uri not in self._seen:
            try:
                self._seen[uri] = _read(uri)
            except FieldError as exc:
                self._seen[uri] = exc
        found = self._seen[uri]
        if isinstance(found, FieldError):
            raise FieldError(f"{shown(value)}: {found}")
        return found

    def _locate(self, value: str) -> str:
        """The image's canonical URI, once it is known to be allowed."""
        if value.startswith("s3://"):
            return self._allowed(_s3_uri(value), value)
        if value.startswith("file://"):
            path = unquote(value[len("file://") :])
            if not path.startswith("/"):
                raise FieldError(f"a file URI must be absolute (file:///dir/image.png), got {shown(value)}")
            return self._allowed(Path(os.path.realpath(path)).as_uri(), value)
        if "://" in value:
            raise FieldError(f"must be a path, a file:/// URI or an s3:// URI, got {shown(value)}")
        if os.path.isabs(value):
            return self._allowed(Path(os.path.realpath(value)).as_uri(), value)
        return self._inside_folder(value)

    def _inside_folder(self, value: str) -> str:
        """A relative path, under the manifest's folder and inside it (no allowed prefix needed)."""
        if isinstance(self.folder, str) and self.folder.startswith("s3://"):
            joined = posixpath.normpath(posixpath.join(self.folder[len("s3://") :], value))
            uri = f"s3://{joined}"
            if not uri.startswith(self.folder):
                raise FieldError(f"{shown(value)} leads out of the manifest's folder {self.folder}")
            return uri
        real = os.path.realpath(os.path.join(self.folder, value))
        if os.path.commonpath([self.folder, real]) != self.folder:
            raise FieldError(f"{shown(value)} leads out of the manifest's folder {self.folder} (to {real}); "
                             f"use a path inside it or a prefix in REELBATCH_ALLOWED_INPUTS")
        return Path(real).as_uri()

    def _allowed(self, uri: str, value: str) -> str:
        key = input_key(uri)
        if not any(key.startswith(prefix) for prefix in self.allowed):
            where = ", ".join(self.allowed) if self.allowed else "none are set"
            raise FieldError(f"{shown(value)} is not under an allowed input prefix (REELBATCH_ALLOWED_INPUTS: "
                             f"{where}); put the image beside the manifest or ask the operator to allow its folder")
        return uri


def check_video_image(vmap: Map, prefix: str, defaults: dict, video: VideoSpec, info: ModelInfo, takers: list[str],
                      report) -> bool:
    """What the model makes of the video's image (or its lack of one): reported, and False, when it cannot."""
    def where(key: str) -> tuple[int, str]:
        if key in vmap.items:
            return vmap.items[key].line, prefix + key
        if key in defaults:
            return defaults[key][1], defaults[key][2]
        return vmap.line, prefix + key

    if video.image is None:
        if "fit" in vmap.items:
            report(*where("fit"), "applies only to a video with an image (give it an `image`)")
            return False
        if info.image_condition == "pipeline":
            report(*where("image"), f"model {info.name!r} renders every video from an image: give this video an "
                                    f"`image` (or one under `defaults`)")
            return False
        return True
    if info.image_condition is None:
        report(*where("image"), f"model {info.name!r} does not take images (models that do: "
                                f"{', '.join(takers) or 'none registered'})")
        return False
    return True


def _read(uri: str) -> InputImage:
    try:
        data = read_input(uri, max_bytes=MAX_IMAGE_BYTES)
    except ObjectNotFound:
        raise FieldError(f"no such image: {uri}") from None
    except ObjectTooLarge:
        raise FieldError(f"{uri} is over the {MAX_IMAGE_BYTES:,}-byte limit") from None
    except StoreError as exc:
        raise FieldError(f"cannot read {uri}: {exc}") from None
    try:
        pixels = decode_image(data)
    except ImageError as exc:
        raise FieldError(f"{uri} {exc}") from None
    return InputImage(uri, hashlib.sha256(data).hexdigest(), pixels.shape[1], pixels.shape[0])


def _s3_uri(value: str) -> str:
    bucket, _, key = value[len("s3://") :].partition("/")
    if not bucket or not key or key.endswith("/"):
        raise FieldError(f"must name one object: s3://bucket/key, got {shown(value)}")
    if any(part in (".", "..") for part in key.split("/")):
        raise FieldError(f"an S3 key may not hold '.' or '..' parts, got {shown(value)}")
    return f"s3://{bucket}/{key}"


def input_key(uri: str) -> str:
    """The form an input URI is compared with the allowed prefixes in: a real local path, or the s3:// URI."""
    return unquote(uri[len("file://") :]) if uri.startswith("file://") else uri


def allowed_input_key(prefix: str) -> str:
    """An allowed input prefix (`/dir/`, `file:///dir/` or `s3://bucket/prefix/`) in input_key's form, ending in
    '/' so that `a/` never allows `ab/`. UsageError naming the setting for anything else."""
    if prefix.startswith("s3://"):
        if not prefix[len("s3://") :].partition("/")[0]:
            raise UsageError(f"REELBATCH_ALLOWED_INPUTS: {prefix!r} names no bucket (s3://bucket/prefix/)")
        return prefix if prefix.endswith("/") else prefix + "/"
    path = unquote(prefix[len("file://") :]) if prefix.startswith("file://") else prefix
    if not os.path.isabs(path):
        raise UsageError(f"REELBATCH_ALLOWED_INPUTS: {prefix!r} must be an absolute folder, file:///dir/ or "
                         f"s3://bucket/prefix/")
    real = os.path.realpath(path)
    return real if real.endswith("/") else real + "/"
