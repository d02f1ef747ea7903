"""Smoke tests: each server fixture starts and answers a real client over loopback."""

import boto3
import redis
import sqlalchemy


def test_postgres_answers_select_1(postgres_url):
    engine = sqlalchemy.create_engine(postgres_url)
    try:
        with engine.connect() as conn:
            assert conn.execute(sqlalchemy.text("SELECT 1")).scalar_one() == 1
            # Each test gets its own fresh database, not the maintenance one.
            database = conn.execute(sqlalchemy.text("SELECT current_database()")).scalar_one()
            assert database == postgres_url.rsplit("/", 1)[1]
    finally:
        engine.dispose()


def test_redis_answers_ping(redis_server):
    client = redis.Redis.from_url(redis_server)
    try:
        assert client.ping() is True
        client.set("reelbatch-smoke", "1")
        assert client.get("reelbatch-smoke") == b"1"
    finally:
        client.close()


def test_s3_lists_the_fresh_bucket(s3_env, s3_server):
    # No endpoint_url here: the client must find moto through AWS_ENDPOINT_URL, as the S3 store does.
    client = boto3.session.Session().client("s3")
    assert client.meta.endpoint_url == s3_server.endpoint_url
    names = [bucket["Name"] for bucket in client.list_buckets()["Buckets"]]
    assert s3_env in names
    assert client.list_objects_v2(Bucket=s3_env)["KeyCount"] == 0
