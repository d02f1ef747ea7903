"""Objects reelbatch only reads (a manifest's images), by URI, from a local folder and a real S3-protocol server."""

import boto3
import pytest

from storage.inputs import input_store, read_input
from storage.stores import ObjectNotFound, ObjectTooLarge


def test_a_local_file_by_its_file_uri(tmp_path):
    path = tmp_path / "a picture #1.png"  # a space and a '#' travel percent-encoded in the URI
    path.write_bytes(b"12345")
    assert read_input(path.as_uri(), max_bytes=5) == b"12345"
    with pytest.raises(ObjectTooLarge, match="is 5 bytes, over the 4-byte limit"):
        read_input(path.as_uri(), max_bytes=4)
    with pytest.raises(ObjectNotFound):
        read_input((tmp_path / "none.png").as_uri(), max_bytes=5)
    with pytest.raises(ObjectNotFound, match="it is a folder"):
        read_input(tmp_path.as_uri(), max_bytes=5)


def test_an_s3_object_by_its_uri(s3_env):
    boto3.session.Session().client("s3").put_object(Bucket=s3_env, Key="in/a b.png", Body=b"123456")
    assert read_input(f"s3://{s3_env}/in/a b.png", max_bytes=6) == b"123456"
    with pytest.raises(ObjectTooLarge, match=f"s3://{s3_env}/in/a b.png is 6 bytes, over the 5-byte limit"):
        read_input(f"s3://{s3_env}/in/a b.png", max_bytes=5)
    with pytest.raises(ObjectNotFound, match=f"no object at s3://{s3_env}/in/gone.png"):
        read_input(f"s3://{s3_env}/in/gone.png", max_bytes=5)


@pytest.mark.parametrize("uri", ["relative/a.png", "file://a.png", "s3://bucket", "s3:///key", "https://x/a.png"])
def test_other_uris_are_a_caller_error(uri):
    with pytest.raises(ValueError, match="input URI must be file:///absolute/path or s3://bucket/key"):
        input_store(uri)
