"""What the store tests share besides fixtures (tests/storage/conftest.py): a key and its metadata, raw S3 access."""

import boto3

KEY = "myrun/video-1.mp4"
META = {"run": "myrun", "id": "1", "seed": "42", "model": "tiny-wan"}


def raw_s3():
    return boto3.session.Session().client("s3")


def count_calls(store, operation: str) -> list:
    """Record each `operation` request the S3 client sends (botocore's event hooks, no mocking)."""
    calls = []
    store._client.meta.events.register(f"before-call.s3.{operation}", lambda **kwargs: calls.append(operation))
    return calls
