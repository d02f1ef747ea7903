"""The store contract, run against a real folder and a real S3-protocol server (moto, over HTTP on loopback)."""

import errno
import hashlib
import os
import threading
from pathlib import Path

import boto3
import numpy as np
import pytest

from storage.encode import encode_mp4
from storage.local import LocalStore
from storage.s3 import S3Store
from storage.stores import (
    IntegrityError,
    KeyTooLong,
    ObjectConflict,
    ObjectNotFound,
    ObjectTooLarge,
    StoreError,
    StoreUnavailable,
    key_too_long,
    open_store,
    sha256_hex,
)
from tests.services import free_port

KEY = "myrun/video-1.mp4"
META = {"run": "myrun", "id": "1", "seed": "42", "model": "tiny-wan"}


@pytest.fixture(scope="module")
def video() -> bytes:
    return encode_mp4(np.random.default_rng(1).integers(0, 256, (3, 16, 16, 3), dtype=np.uint8), 8)


@pytest.fixture(scope="module")
def other_video() -> bytes:
    return encode_mp4(np.random.default_rng(2).integers(0, 256, (3, 16, 16, 3), dtype=np.uint8), 8)


@pytest.fixture
def local_store(tmp_path) -> LocalStore:
    return open_store(f"file://{tmp_path / 'out'}/")


@pytest.fixture
def s3_store(s3_env) -> S3Store:
    # No endpoint_url: the store must find moto through AWS_ENDPOINT_URL, as it will find a real endpoint.
    return open_store(f"s3://{s3_env}/runs/")


@pytest.fixture(params=["local", "s3"])
def store(request):
    return request.getfixturevalue(f"{request.param}_store")


def raw_s3():
    return boto3.session.Session().client("s3")


def count_calls(store, operation: str) -> list:
    """Record each `operation` request the S3 client sends (botocore's event hooks, no mocking)."""
    calls = []
    store._client.meta.events.register(f"before-call.s3.{operation}", lambda **kwargs: calls.append(operation))
    return calls


# -- the contract, for both stores --------------------------------------------------------------------------------


def test_put_then_get_returns_the_same_bytes(store, video):
    stored = store.put(KEY, video, sha256=sha256_hex(video), metadata=META)
    assert stored.key == KEY
    assert stored.uri == store.uri_for(KEY)
    assert stored.bytes == len(video)
    assert stored.sha256 == sha256_hex(video)
    assert stored.existed is False
    assert store.get(KEY) == video
    assert store.exists(KEY) is True
    assert store.exists("myrun/video-2.mp4") is False


def test_same_bytes_again_is_a_no_op(store, video):
    first = store.put(KEY, video, sha256=sha256_hex(video), metadata=META)
    before = _fingerprint(store, KEY)
    puts = count_calls(store, "PutObject") if isinstance(store, S3Store) else []
    again = store.put(KEY, video, sha256=sha256_hex(video).upper(), metadata=META)
    assert again.existed is True
    assert (again.uri, again.bytes, again.sha256) == (first.uri, first.bytes, first.sha256)
    assert puts == []
    assert _fingerprint(store, KEY) == before
    assert store.get(KEY) == video


def test_different_bytes_never_overwrite(store, video, other_video):
    store.put(KEY, video, sha256=sha256_hex(video), metadata=META)
    with pytest.raises(ObjectConflict) as caught:
        store.put(KEY, other_video, sha256=sha256_hex(other_video), metadata=META)
    assert caught.value.retryable is False
    message = str(caught.value)
    assert store.uri_for(KEY) in message
    assert sha256_hex(video) in message and sha256_hex(other_video) in message
    assert store.get(KEY) == video


def test_bytes_that_do_not_match_the_checksum_are_not_kept(store, video, other_video):
    with pytest.raises(IntegrityError) as caught:
        store.put(KEY, video, sha256=sha256_hex(other_video), metadata=META)
    assert caught.value.retryable is True
    assert store.exists(KEY) is False
    # The key is clean again: a correct put succeeds as a fresh write.
    assert store.put(KEY, video, sha256=sha256_hex(video), metadata=META).existed is False


def test_concurrent_writers_create_the_file_once(local_store, video):
    # Local only: moto's If-None-Match check is not atomic, so the same test against it would test moto.
    # The S3 store's side of the race is covered deterministically by test_s3_losing_the_race_between_head_and_put.
    store = local_store
    barrier = threading.Barrier(6)
    results, errors = [], []

    def write():
        barrier.wait()
        try:
            results.append(store.put(KEY, video, sha256=sha256_hex(video), metadata=META))
        except Exception as exc:  # collected so the assertion below names it
            errors.append(exc)

    threads = [threading.Thread(target=write) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert sorted(r.existed for r in results) == [False] + [True] * 5
    assert store.get(KEY) == video


def test_delete_removes_scratch_objects_and_ignores_missing_ones(store):
    data = b"chunk latents"
    store.put("_chunks/run/v/0-1.safetensors", data, sha256=sha256_hex(data), content_type="application/octet-stream",
              metadata={})
    assert store.exists("_chunks/run/v/0-1.safetensors")
    store.delete("_chunks/run/v/0-1.safetensors")
    assert not store.exists("_chunks/run/v/0-1.safetensors")
    store.delete("_chunks/run/v/0-1.safetensors")  # already gone: nothing to do
    with pytest.raises(ValueError):
        store.delete("../outside")


def test_replace_writes_whatever_is_there(store):
    assert store.replace("run/results.jsonl", b'{"id": "a"}\n', content_type="application/jsonl") == \
        store.uri_for("run/results.jsonl")
    store.replace("run/results.jsonl", b'{"id": "a"}\n{"id": "b"}\n', content_type="application/jsonl")
    assert store.get("run/results.jsonl") == b'{"id": "a"}\n{"id": "b"}\n'


@pytest.mark.parametrize("name", ["vidéo 東京 #1?.mp4", "a%2Fb.mp4"])
def test_an_objects_uri_is_the_stores_uri_and_its_key_as_written(store, name):
    data = b"x"
    stored = store.put(f"run/{name}", data, sha256=sha256_hex(data), metadata={})
    root = _root(store)
    assert stored.uri == store.uri_for(f"run/{name}") == f"{root}run/{name}"
    assert open_store(root).get(f"run/{name}") == data


def _root(store) -> str:
    return f"file://{store.root}/" if isinstance(store, LocalStore) else f"s3://{store.bucket}/{store.prefix}"


def _longest(store, extra: int) -> str:
    """A key whose longest name (or, in S3, whole key) is `extra` bytes over the store's limit."""
    if isinstance(store, LocalStore):
        # `.{name}.{16 hex}.tmp` must fit 255 bytes, so the name 233: 'é' (2 bytes) x 114 + 'x' + '.mp4'.
        return "run/" + "é" * 114 + "x" * (1 + extra) + ".mp4"
    # 1,024 bytes with the store's prefix 'runs/' (5 bytes): 1,019 bytes of key, here 'run/' + 1,011 + '.mp4'.
    return "run/" + "é" * 505 + "x" * (1 + extra) + ".mp4"


def test_a_key_at_the_stores_byte_limit_is_stored(store):
    key = _longest(store, 0)
    data = b"x"
    assert store.too_long(key) is None and key_too_long(_root(store), key) is None
    assert store.put(key, data, sha256=sha256_hex(data), metadata={}).existed is False
    assert store.get(key) == data
    store.replace(key, b"y", content_type="video/mp4")
    assert store.get(key) == b"y"


def test_a_key_one_byte_over_the_limit_is_refused_before_anything_is_written(store, tmp_path):
    key = _longest(store, 1)
    over = store.too_long(key)
    assert over is not None and (over.bytes, over.limit) == ((256, 255) if isinstance(store, LocalStore)
                                                             else (1025, 1024))
    assert key_too_long(_root(store), key) == over
    puts = count_calls(store, "PutObject") if isinstance(store, S3Store) else []
    for write in (lambda: store.put(key, b"x", sha256=sha256_hex(b"x"), metadata={}),
                  lambda: store.replace(key, b"x", content_type="video/mp4")):
        with pytest.raises(KeyTooLong) as caught:
            write()
        assert caught.value.retryable is False
        assert f"{over.bytes:,} bytes, over the {over.limit:,}-byte limit" in str(caught.value)
    assert puts == []
    if isinstance(store, LocalStore):
        assert not (store.root / "run").exists()


def test_the_local_limit_is_the_file_systems(tmp_path):
    # NAME_MAX is the file system's own limit, not a guess: 255 bytes open, 256 do not.
    (tmp_path / ("é" * 127 + "x")).write_bytes(b"")
    with pytest.raises(OSError) as caught:
        (tmp_path / ("é" * 128)).write_bytes(b"")
    assert caught.value.errno == errno.ENAMETOOLONG
def test_get_refuses_an_object_over_its_byte_limit_before_reading_it(store, video):
    store.put(KEY, video, sha256=sha256_hex(video), metadata=META)
    assert store.get(KEY, max_bytes=len(video)) == video, "at the limit: read"
    with pytest.raises(ObjectTooLarge, match=f"is {len(video):,} bytes, over the {len(video) - 1:,}-byte limit"):
        store.get(KEY, max_bytes=len(video) - 1)
    assert not ObjectTooLarge.retryable


def test_missing_object(store):
    with pytest.raises(ObjectNotFound):
        store.get("myrun/nothing.mp4")


@pytest.mark.parametrize("key", ["../escape.mp4", "/abs/video.mp4", "run/../../escape.mp4", "", "run//v.mp4", "run/"])
def test_keys_must_be_plain_relative_paths(store, video, key):
    with pytest.raises(ValueError, match="key"):
        store.put(key, video, sha256=sha256_hex(video), metadata=META)


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
    assert caught.value.retryable is False
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
    assert type(caught.value) is StoreError and caught.value.retryable is False
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
    assert caught.value.retryable is True
    assert closed in str(caught.value)


def _fingerprint(store, key):
    """Something that changes if the object is rewritten, even with the same bytes."""
    if isinstance(store, LocalStore):
        stat = (store.root / key).stat()
        return stat.st_ino, stat.st_mtime_ns
    head = raw_s3().head_object(Bucket=store.bucket, Key=store.prefix + key)
    return head["ETag"], head["LastModified"], head["Metadata"]


def test_stat_reports_size_and_checksum_or_none(tmp_path, s3_env):
    from storage.stores import open_store

    data = b"an mp4, as far as this test cares"
    digest = hashlib.sha256(data).hexdigest()
    for store in (open_store(f"file://{tmp_path}/"), open_store(f"s3://{s3_env}/p/")):
        assert store.stat("run/a.mp4") is None
        store.put("run/a.mp4", data, sha256=digest, metadata={"id": "a"})
        found = store.stat("run/a.mp4")
        assert (found.bytes, found.sha256, found.existed) == (len(data), digest, True)
        assert found.uri == store.uri_for("run/a.mp4")


def test_s3_metadata_with_unicode_ids_round_trips_percent_encoded(s3_env):
    from urllib.parse import unquote

    import boto3

    from storage.stores import open_store

    data = b"x" * 10
    store = open_store(f"s3://{s3_env}/")
    store.put("run/vidéo-東京.mp4", data, sha256=hashlib.sha256(data).hexdigest(),
              metadata={"id": "vidéo-東京", "run": "run"})
    head = boto3.client("s3").head_object(Bucket=s3_env, Key="run/vidéo-東京.mp4")
    assert unquote(head["Metadata"]["id"]) == "vidéo-東京" and head["Metadata"]["run"] == "run"
