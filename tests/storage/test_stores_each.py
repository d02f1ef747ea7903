"""What only one store does: the local folder's files and errors, `open_store`'s URIs, and S3's metadata, races and
endpoints (moto, over HTTP on loopback)."""

import hashlib
import os
from pathlib import Path

import boto3
import pytest

from faults import Decision
from storage.local import LocalStore
from storage.s3 import S3Store
from storage.stores import (
    IntegrityError,
    ObjectConflict,
    StoreError,
    StoreUnavailable,
    open_store,
    sha256_hex,
)
from tests.services import free_port
from tests.storage.stores_common import KEY, META, raw_s3

# -- local folder -------------------------------------------------------------------------------------------------


def test_local_store_writes_only_the_mp4_inside_its_root(tmp_path, video):
    root = tmp_path / "out"
    store = LocalStore(root)
    stored = store.put(KEY, video, sha256=sha256_hex(video), metadata=META)
    assert sorted(str(p.relative_to(root)) for p in root.rglob("*")) == ["myrun", KEY]
    assert stored.uri == f"file://{root}/{KEY}"
    assert (root / KEY).read_bytes() == video
    with pytest.raises(ValueError):
        store.put("../escape.mp4", video, sha256=sha256_hex(video), metadata=META)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_local_store_leaves_no_temp_file_after_a_failed_put(tmp_path, video):
    store = LocalStore(tmp_path)
    with pytest.raises(IntegrityError):
        store.put(KEY, video, sha256="0" * 64, metadata=META)
    assert list((tmp_path / "myrun").iterdir()) == []


def test_local_store_reports_os_errors_as_store_errors(tmp_path, video):
    (tmp_path / "myrun").write_text("a file where the run folder should be")
    with pytest.raises(StoreError) as caught:
        LocalStore(tmp_path).put(KEY, video, sha256=sha256_hex(video), metadata=META)
    assert caught.value.decision is Decision.FAIL_NOW
    assert "myrun" in str(caught.value)


def test_open_store_reads_local_uris(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert open_store(f"file://{tmp_path}/a/").root == tmp_path / "a"
    assert open_store("file://./rel/out/").root == tmp_path / "rel" / "out"
    assert open_store("plain/dir").root == tmp_path / "plain" / "dir"
    # Taken as written, never percent-decoded: the folder a caller checked is the folder written to.
    assert open_store("file:///tmp/with space/a%2Fb/").root == Path("/tmp/with space/a%2Fb")
    # The root is fixed when the store opens, not re-read from the working directory later.
    store = open_store("file://./rel/")
    monkeypatch.chdir("/")
    assert store.root == tmp_path / "rel"


def test_open_store_reads_s3_uris():
    store = open_store("s3://my-bucket/team/renders/")
    assert (store.bucket, store.prefix) == ("my-bucket", "team/renders/")
    assert store.uri_for(KEY) == f"s3://my-bucket/team/renders/{KEY}"
    assert open_store("s3://my-bucket").uri_for(KEY) == f"s3://my-bucket/{KEY}"


@pytest.mark.parametrize("uri", ["http://example.invalid/x", "s3://", "s3:///prefix", "file://host/path", "gs://b/p"])
def test_open_store_refuses_other_uris(uri):
    with pytest.raises(ValueError) as caught:
        open_store(uri)
    assert uri in str(caught.value)


# -- S3 -----------------------------------------------------------------------------------------------------------


def test_s3_object_has_content_type_metadata_and_prefix(s3_store, s3_env, video):
    s3_store.put(KEY, video, sha256=sha256_hex(video), metadata=META)
    head = raw_s3().head_object(Bucket=s3_env, Key=f"runs/{KEY}")
    assert head["ContentType"] == "video/mp4"
    assert head["Metadata"] == {**META, "sha256": sha256_hex(video)}
    assert head["ContentLength"] == len(video)


def test_s3_object_written_by_someone_else_is_compared_by_its_bytes(s3_store, s3_env, video, other_video):
    # No sha256 metadata on this object, so the store must download and hash it.
    raw_s3().put_object(Bucket=s3_env, Key=f"runs/{KEY}", Body=video)
    assert s3_store.put(KEY, video, sha256=sha256_hex(video), metadata=META).existed is True
    with pytest.raises(ObjectConflict):
        s3_store.put(KEY, other_video, sha256=sha256_hex(other_video), metadata=META)


def test_s3_losing_the_race_between_head_and_put(s3_store, s3_env, video, other_video):
    # Another writer creates the key just before our PutObject is sent: IfNoneMatch="*" must refuse ours (412).
    def rival_writes(data):
        def hook(**kwargs):
            raw_s3().put_object(Bucket=s3_env, Key=f"runs/{KEY}", Body=data, Metadata={"sha256": sha256_hex(data)})

        return hook

    s3_store._client.meta.events.register_first("before-call.s3.PutObject", rival_writes(video), unique_id="rival")
    assert s3_store.put(KEY, video, sha256=sha256_hex(video), metadata=META).existed is True
    raw_s3().delete_object(Bucket=s3_env, Key=f"runs/{KEY}")
    s3_store._client.meta.events.unregister("before-call.s3.PutObject", unique_id="rival")
    s3_store._client.meta.events.register_first("before-call.s3.PutObject", rival_writes(other_video), unique_id="r2")
    with pytest.raises(ObjectConflict):
        s3_store.put(KEY, video, sha256=sha256_hex(video), metadata=META)
    assert raw_s3().get_object(Bucket=s3_env, Key=f"runs/{KEY}")["Body"].read() == other_video


def test_s3_missing_bucket_is_a_permanent_error(s3_env, video):
    store = open_store("s3://no-such-bucket-reelbatch/")
    with pytest.raises(StoreError) as caught:
        store.put(KEY, video, sha256=sha256_hex(video), metadata=META)
    assert type(caught.value) is StoreError and caught.value.decision is Decision.FAIL_NOW
    assert "no-such-bucket-reelbatch" in str(caught.value) and "does not exist" in str(caught.value)


def test_s3_unreachable_endpoint_is_retryable(monkeypatch, video):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_CONFIG_FILE", os.devnull)
    closed = f"http://127.0.0.1:{free_port()}"  # nothing listens here
    store = S3Store("bucket", endpoint_url=closed)
    with pytest.raises(StoreUnavailable) as caught:
        store.put(KEY, video, sha256=sha256_hex(video), metadata=META)
    assert caught.value.decision is Decision.RETRY
    assert closed in str(caught.value)


def test_s3_metadata_with_unicode_ids_round_trips_percent_encoded(s3_env):
    from urllib.parse import unquote

    from storage.stores import open_store

    data = b"x" * 10
    store = open_store(f"s3://{s3_env}/")
    store.put("run/vidéo-東京.mp4", data, sha256=hashlib.sha256(data).hexdigest(),
              metadata={"id": "vidéo-東京", "run": "run"})
    head = boto3.client("s3").head_object(Bucket=s3_env, Key="run/vidéo-東京.mp4")
    assert unquote(head["Metadata"]["id"]) == "vidéo-東京" and head["Metadata"]["run"] == "run"
