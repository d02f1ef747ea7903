"""A store in an S3 bucket (AWS or any S3-protocol server): `s3://bucket/prefix/`.

The endpoint and credentials come from boto3's own configuration (AWS_ENDPOINT_URL / AWS_ENDPOINT_URL_S3,
AWS_ACCESS_KEY_ID, ~/.aws/config, ...), so pointing reelbatch at MinIO or another S3-compatible server needs no
reelbatch setting.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING
from urllib.parse import quote

from storage.base import (
    IntegrityError,
    KeyTooLong,
    ObjectConflict,
    ObjectNotFound,
    ObjectTooLarge,
    Store,
    StoredObject,
    StoreError,
    StoreUnavailable,
    TooLong,
    check_key,
    check_sha256,
    quoted,
    sha256_hex,
    utf8_len,
)

if TYPE_CHECKING:
    from botocore import exceptions as boto_errors

# botocore (its Config, its exceptions) and boto3 are imported where a client is made or its errors are caught, not
# at the top: every command imports this module (through the manifest loader and the stores), and botocore alone took
# 0.18 s of each command's start-up, `status` and `report` included, which never touch S3 (docs/PERFORMANCE.md).

# boto3 1.36 started sending CRC checksums on every request and validating them on every response by default;
# several S3-compatible servers reject or mangle those, so only send checksums where an API requires them.
# We pass our own SHA-256 on put and verify the stored bytes ourselves.
_CONFIG = dict(
    request_checksum_calculation="when_required",
    response_checksum_validation="when_required",
    # botocore waits 60 s for each by default and tries 4 times: a store that accepts connections but never answers
    # would hold a worker for minutes per call. The worker retries the video with backoff instead, so fail fast.
    retries={"total_max_attempts": 2, "mode": "standard"},
    connect_timeout=5,
    read_timeout=30,
    # Requests are signed with SigV4 either way; named, presigned URLs (the service's video links) are too, rather
    # than the legacy SigV2 botocore otherwise presigns with in us-east-1, which regions opened since 2014 refuse.
    signature_version="s3v4",
)

# An object key is at most 1,024 bytes of UTF-8 (Amazon S3 User Guide, "Naming Amazon S3 objects"), prefix included.
MAX_KEY_BYTES = 1024


def too_long(prefix: str, key: str) -> TooLong | None:
    """How `key` under `prefix` (the store's, ending in '/' or empty) overflows an S3 key, or None."""
    full = prefix + check_key(key)
    size = utf8_len(full)
    return TooLong(f"key {quoted(full)}", size, MAX_KEY_BYTES) if size > MAX_KEY_BYTES else None


def client(endpoint_url: str | None = None):
    """A boto3 S3 client with reelbatch's settings above; the endpoint (None: boto3's own, AWS_ENDPOINT_URL) and
    credentials come from boto3's configuration. A session of its own: boto3's default session is shared and not
    thread-safe, a client is."""
    import boto3  # here, not at the top: 0.3 s that commands which never touch S3 should not pay
    from botocore.config import Config  # likewise (above)

    return boto3.session.Session().client("s3", endpoint_url=endpoint_url, config=Config(**_CONFIG))


# Error codes that mean "try again later" even when the status is not 5xx (S3 error responses reference).
_RETRYABLE_CODES = {"SlowDown", "RequestTimeout", "RequestTimeTooSkewed", "ServiceUnavailable", "InternalError"}
# The server computed a different checksum than the ChecksumSHA256 we sent: the bytes do not match the hash.
_DIGEST_CODES = {"BadDigest", "InvalidDigest", "XAmzContentSHA256Mismatch"}


class S3Store(Store):
    def __init__(self, bucket: str, prefix: str = "", *, endpoint_url: str | None = None) -> None:
        if not bucket:
            raise ValueError("S3Store needs a bucket name")
        prefix = prefix.strip("/")
        self.bucket = bucket
        self.prefix = f"{check_key(prefix)}/" if prefix else ""
        # endpoint_url=None lets boto3 read AWS_ENDPOINT_URL(_S3) itself; tests pass one explicitly.
        self._client = client(endpoint_url)

    def __repr__(self) -> str:
        return f"S3Store({self.uri_for('')!r}, endpoint={self._client.meta.endpoint_url!r})"

    def put(
        self, key: str, data: bytes, *, sha256: str, content_type: str = "video/mp4", metadata: dict[str, str]
    ) -> StoredObject:
        from botocore import exceptions as boto_errors  # loaded with the client (not at the top: above)

        sha256 = check_sha256(sha256)
        uri = self.uri_for(key)
        full_key = self._full_key(key)
        with self._errors(uri):
            found = self._resolve_existing(key, sha256, len(data))
            if found is not None:
                return found
            try:
                self._client.put_object(
                    Bucket=self.bucket,
                    Key=full_key,
                    Body=data,
                    ContentType=content_type,
                    # Our sha256 wins over a caller's key of the same name: later puts compare against it.
                    Metadata={**{k: header_safe(v) for k, v in metadata.items()}, "sha256": sha256},
                    ChecksumSHA256=base64.b64encode(bytes.fromhex(sha256)).decode("ascii"),
                    # Create-if-absent: two workers racing on one key cannot overwrite each other.
                    IfNoneMatch="*",
                )
            except boto_errors.ClientError as exc:
                code = _code(exc)
                if code == "PreconditionFailed":  # lost the race: someone created the key since our head_object
                    found = self._resolve_existing(key, sha256, len(data))
                    if found is not None:
                        return found
                    raise StoreUnavailable(f"{uri}: the object appeared and vanished during the put; retry") from exc
                if code == "ConditionalRequestConflict":  # 409: another conditional write to the key is in flight
                    raise StoreUnavailable(f"{uri}: a concurrent write to this key is in progress; retry") from exc
                if code in _DIGEST_CODES:
                    raise IntegrityError(f"{uri}: the store rejected the bytes: they do not hash to {sha256}") from exc
                raise
            # Verify by reading back: some S3-compatible servers (moto among them) accept a wrong ChecksumSHA256.
            body = self._client.get_object(Bucket=self.bucket, Key=full_key)["Body"].read()
            actual = sha256_hex(body)
            if actual != sha256:
                self._client.delete_object(Bucket=self.bucket, Key=full_key)
                raise IntegrityError(f"{uri}: stored bytes hash to sha256 {actual}, expected {sha256}; object deleted")
        return StoredObject(uri=uri, key=key, bytes=len(data), sha256=sha256, existed=False)

    def uri_for(self, key: str) -> str:
        return f"s3://{self.bucket}/{self.prefix}{key}"

    def too_long(self, key: str) -> TooLong | None:
        return too_long(self.prefix, key)

    def get(self, key: str, *, max_bytes: int | None = None) -> bytes:
        from botocore import exceptions as boto_errors  # loaded with the client (not at the top: above)

        uri = self.uri_for(key)
        with self._errors(uri):
            try:
                found = self._client.get_object(Bucket=self.bucket, Key=self._full_key(key))
                if max_bytes is None:
                    return found["Body"].read()
                # The response's length comes before its body: a large object is refused without reading it.
                if found["ContentLength"] > max_bytes:
                    found["Body"].close()
                    raise ObjectTooLarge(f"{uri} is {found['ContentLength']:,} bytes, over the {max_bytes:,}-byte "
                                         f"limit")
                return found["Body"].read(max_bytes + 1)
            except boto_errors.ClientError as exc:
                if _code(exc) == "NoSuchKey":
                    raise ObjectNotFound(f"no object at {uri}") from exc
                raise

    def presigned_get(self, key: str, expires_s: int) -> str:
        """A URL that GETs the object at `key` for `expires_s` seconds without credentials (SigV4 query
        signing), for a server to redirect a client to rather than relay the bytes."""
        with self._errors(self.uri_for(key)):
            return self._client.generate_presigned_url(
                "get_object", Params={"Bucket": self.bucket, "Key": self._full_key(key)}, ExpiresIn=expires_s)

    def exists(self, key: str) -> bool:
        with self._errors(self.uri_for(key)):
            return self._head(self._full_key(key)) is not None

    def stat(self, key: str) -> StoredObject | None:
        full_key = self._full_key(key)
        with self._errors(self.uri_for(key)):
            head = self._head(full_key)
            if head is None:
                return None
            stored = head.get("Metadata", {}).get("sha256")
            if stored is None:  # written by something other than reelbatch: hash the bytes themselves
                stored = sha256_hex(self._client.get_object(Bucket=self.bucket, Key=full_key)["Body"].read())
        return StoredObject(uri=self.uri_for(key), key=key, bytes=head["ContentLength"], sha256=stored, existed=True)

    def replace(self, key: str, data: bytes, *, content_type: str) -> str:
        with self._errors(self.uri_for(key)):
            self._client.put_object(Bucket=self.bucket, Key=self._full_key(key), Body=data, ContentType=content_type,
                                    ChecksumSHA256=base64.b64encode(bytes.fromhex(sha256_hex(data))).decode("ascii"))
        return self.uri_for(key)

    def delete(self, key: str) -> None:
        with self._errors(self.uri_for(key)):
            self._client.delete_object(Bucket=self.bucket, Key=self._full_key(key))

    def _full_key(self, key: str) -> str:
        over = too_long(self.prefix, key)
        if over is not None:  # said plainly, before a request the server would refuse with KeyTooLongError
            raise KeyTooLong(f"{self.uri_for(key)}: {over}")
        return self.prefix + key

    def _head(self, full_key: str) -> dict | None:
        from botocore import exceptions as boto_errors  # loaded with the client (not at the top: above)

        try:
            return self._client.head_object(Bucket=self.bucket, Key=full_key)
        except boto_errors.ClientError as exc:
            # HEAD has no body, so a missing key and a missing bucket both arrive as a bare 404; put_object then
            # reports NoSuchBucket properly.
            if _status(exc) == 404:
                return None
            raise

    def _resolve_existing(self, key: str, sha256: str, size: int) -> StoredObject | None:
        """None if the key is free; StoredObject(existed=True) if it holds these bytes; else ObjectConflict."""
        found = self.stat(key)
        if found is None:
            return None
        # The length check is free and catches a truncated object whose metadata still claims the right hash.
        if found.sha256 != sha256 or found.bytes != size:
            raise ObjectConflict(
                # Not the existing object's hash or size: the message reaches whoever submitted, who may not own it.
                f"{found.uri} already holds different bytes; refusing to overwrite it with sha256 {sha256} "
                f"({size} bytes)"
            )
        return found

    @contextmanager
    def _errors(self, uri: str) -> Iterator[None]:
        """Translate botocore's exceptions into the store error tree, whose classes carry what the worker decides."""
        from botocore import exceptions as boto_errors  # loaded with the client (not at the top: above)

        endpoint = self._client.meta.endpoint_url
        try:
            yield
        except (boto_errors.ConnectionError, boto_errors.HTTPClientError) as exc:
            raise StoreUnavailable(f"{uri}: cannot reach the S3 endpoint {endpoint}: {exc}") from exc
        except boto_errors.NoCredentialsError as exc:
            raise StoreError(f"{uri}: no S3 credentials found (set AWS_ACCESS_KEY_ID / AWS_PROFILE)") from exc
        except boto_errors.ClientError as exc:
            code, status = _code(exc), _status(exc)
            message = exc.response.get("Error", {}).get("Message", "")
            if code == "NoSuchBucket":
                raise StoreError(f"{uri}: bucket {self.bucket!r} does not exist at {endpoint}") from exc
            if status >= 500 or code in _RETRYABLE_CODES:
                raise StoreUnavailable(f"{uri}: S3 endpoint {endpoint} answered {status} {code}: {message}") from exc
            if status == 403:
                raise StoreError(
                    f"{uri}: access denied ({code}); reelbatch needs s3:GetObject, s3:PutObject, s3:DeleteObject"
                    f" and s3:ListBucket (without ListBucket a missing key reads as 403, not 404)"
                ) from exc
            raise StoreError(f"{uri}: S3 endpoint {endpoint} answered {status} {code}: {message}") from exc


def _code(exc: boto_errors.ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def _status(exc: boto_errors.ClientError) -> int:
    return int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)


# S3 user metadata travels in HTTP headers, which carry ASCII only: percent-encode anything else (a video id may
# hold Unicode letters). Printable ASCII other than '%' is left as it is, so plain values read back unchanged.
_HEADER_SAFE = "".join(chr(c) for c in range(0x20, 0x7F) if chr(c) != "%")


def header_safe(value: str) -> str:
    return quote(value, safe=_HEADER_SAFE)
