"""The run fields of issue 20's last parts: `notify` (a webhook under REELBATCH_ALLOWED_WEBHOOKS) and the encoder's
`codec`, `crf` and `preset`; checked at submit like every field, with file, line, field and value."""

import pytest

from jobs.manifest.urls import BadUrl, allowed_prefixes, check_allowed
from storage.codecs import Encoding

from .manifest_helpers import expect, load, write

HOOKS = ("https://hooks.example.com/reelbatch", "http://127.0.0.1:8080/")


def run_file(tmp_path, *lines, name="m.yaml"):
    return write(tmp_path, "name: t\n" + "".join(f"{line}\n" for line in lines)
                 + "videos:\n  - {id: a, prompt: p}\n", name)


def test_run_fields_are_read_and_made_canonical(tmp_path):
    spec = load(run_file(tmp_path, "notify: HTTPS://Hooks.Example.com:443/reelbatch/done?src=rb", "codec: h265",
                         "crf: 28", "preset: veryslow"), allowed_webhooks=HOOKS)
    assert spec.notify == "https://hooks.example.com/reelbatch/done?src=rb"
    assert spec.encoding == Encoding("h265", 28, "veryslow")


def test_unset_fields_keep_the_hash_a_run_had_before_they_existed(tmp_path):
    """A manifest naming none of them keeps its old content hash, so submitting it again finds its run (the value is
    the hash this manifest had before these fields existed, taken from main)."""
    plain = load(run_file(tmp_path))
    assert plain.notify is None and plain.encoding == Encoding("h264", 18, "medium")
    assert plain.content_sha256 == "c645506a608331fe33661e81b1c3be1e6f3b9a79aa5898c4e3ed1ba71632c6cd"
    defaults_named = load(run_file(tmp_path, "codec: h264", "crf: 18", "preset: medium"))
    assert defaults_named.content_sha256 == plain.content_sha256, "the same bytes, the same run"
    changed = {load(run_file(tmp_path, extra), allowed_webhooks=HOOKS).content_sha256
               for extra in ("crf: 20", "preset: fast", "codec: h265", "notify: http://127.0.0.1:8080/x")}
    assert len(changed) == 4 and plain.content_sha256 not in changed


def test_notify_comes_from_the_option_for_jsonl(tmp_path):
    path = write(tmp_path, '{"id": "a", "prompt": "p"}\n', "m.jsonl")
    assert load(path, notify="http://127.0.0.1:8080/hook", allowed_webhooks=HOOKS).notify == \
        "http://127.0.0.1:8080/hook"
    expect(path, 0, "--notify", "'https://evil.example.net/' is not under an allowed webhook prefix",
           notify="https://evil.example.net/", allowed_webhooks=HOOKS)


@pytest.mark.parametrize("value, message", [
    ("https://evil.example.net/", "'https://evil.example.net/' is not under an allowed webhook prefix "
                                  "(https://hooks.example.com/reelbatch, http://127.0.0.1:8080/)"),
    ("https://hooks.example.com.evil.net/reelbatch", "is not under an allowed webhook prefix"),
    ("https://hooks.example.com/reelbatch-other", "is not under an allowed webhook prefix"),
    ("http://hooks.example.com/reelbatch", "is not under an allowed webhook prefix"),  # plain http: not allowed here
    ("https://127.0.0.1:8080/", "is not under an allowed webhook prefix"),  # https where the prefix says http
    ("http://127.0.0.1:8081/", "is not under an allowed webhook prefix"),
    ("https://hooks.example.com/reelbatch/../admin", "must not have '.' or '..' path segments"),
    ("https://hooks.example.com/reelbatch/%2e%2e/admin", "must not have '.' or '..' path segments"),
    ("https://hooks.example.com@evil.net/reelbatch", "must not carry a user name or password"),
    ("https://hooks.example.com/reelbatch#x", "must not have a #fragment"),
    ("ftp://hooks.example.com/reelbatch", "must be an https:// URL (or http:// where an allowed prefix says http)"),
    ("hooks.example.com/reelbatch", "must be an https:// URL"),
    ("https://hooks.example.com/reel batch", "contains a space, a control character or a backslash"),
    ("https://hooks.example.com:99999/reelbatch", "has a port that is not a number from 0 to 65535"),
    ("https:///reelbatch", "has no host"),
    (42, "must be a string, got 42"),
])
def test_a_bad_notify_names_the_line_the_field_and_the_value(tmp_path, value, message):
    shown = repr(value) if isinstance(value, str) else value
    expect(run_file(tmp_path, f"notify: {shown}"), 2, "notify", message, allowed_webhooks=HOOKS)


def test_without_allowed_prefixes_no_notify_is_accepted(tmp_path):
    expect(run_file(tmp_path, "notify: https://hooks.example.com/reelbatch"), 2, "notify",
           "cannot be used: the operator allows no webhook URLs (set REELBATCH_ALLOWED_WEBHOOKS)")


@pytest.mark.parametrize("line, field, message", [
    ("codec: av1", "codec", "must be one of h264, h265, got 'av1'"),
    ("codec: 264", "codec", "must be a string, got 264"),
    ("crf: 52", "crf", "must be an integer from 0 to 51, got 52"),
    ("crf: 18.5", "crf", "must be an integer from 0 to 51, got 18.5"),
    ("crf: '18'", "crf", "must be an integer from 0 to 51, got '18' (a string); write it without quotes"),
    ("preset: fastest", "preset", "must be one of ultrafast, superfast, veryfast, faster, fast, medium, slow, "
                                  "slower, veryslow, placebo (fastest to slowest), got 'fastest'"),
])
def test_a_bad_encoder_setting_names_the_line_the_field_and_the_value(tmp_path, line, field, message):
    expect(run_file(tmp_path, line), 2, field, message)


def test_a_codec_this_pyav_build_lacks_is_refused_naming_the_encoder(tmp_path, monkeypatch):
    import av

    real = av.codec.Codec

    def without_x265(name, mode="r"):
        if name == "libx265":
            raise av.codec.codec.UnknownCodecError(name)
        return real(name, mode)

    monkeypatch.setattr(av.codec, "Codec", without_x265)
    expect(run_file(tmp_path, "codec: h265"), 2, "codec",
           "'h265' needs the libx265 encoder, which this PyAV build lacks (av.codecs_available); use h264")


@pytest.mark.parametrize("raw, message", [
    ("ftp://x.example/", "prefix 'ftp://x.example/' must be an https:// URL"),
    ("https://x.example/?a=1", "prefix 'https://x.example/?a=1' an allowed prefix must not have a ?query"),
    ("https://user@x.example/", "must not carry a user name or password"),
])
def test_a_bad_allowed_prefix_is_refused(raw, message):
    with pytest.raises(BadUrl, match=message.replace("?", r"\?")):
        allowed_prefixes(raw)


def test_prefixes_match_whole_path_parts_and_default_ports():
    allowed = allowed_prefixes(" https://Hooks.example.com:443/a, http://[::1]:9000/b/ ,")
    assert allowed == ("https://hooks.example.com/a", "http://[::1]:9000/b/")
    assert check_allowed("https://hooks.example.com/a", allowed) == "https://hooks.example.com/a"
    assert check_allowed("https://hooks.example.com/a/b?x=1", allowed) == "https://hooks.example.com/a/b?x=1"
    assert check_allowed("http://[::1]:9000/b/c", allowed) == "http://[::1]:9000/b/c"
    for outside in ("https://hooks.example.com/ab", "https://hooks.example.com:8443/a", "http://[::1]:9000/b"):
        with pytest.raises(BadUrl, match="not under an allowed webhook prefix"):
            check_allowed(outside, allowed)


def test_h265_at_a_size_libx265_cannot_encode_is_refused_at_the_video(tmp_path):
    """This libx265 build corrupts its heap on frames 48 pixels wide (storage.codecs.UNSAFE_WIDTHS), and encodes a
    side of 16 to other bytes from run to run: each refused at submit, naming the video's line; 64x32 and h264 at
    48 pass."""
    path = write(tmp_path, "name: t\ncodec: h265\nvideos:\n  - {id: a, prompt: p, resolution: 48x32}\n"
                           "  - {id: b, prompt: p, resolution: 64x32}\n  - {id: c, prompt: p, resolution: 64x16}\n")
    expect(path, 4, "videos[0].resolution", "width 48 cannot be encoded as h265: libx265 corrupts memory at that "
                                            "width; use h264 or another size")
    expect(path, 6, "videos[2].resolution", "height 16 cannot be encoded as h265: libx265 encodes a side that small "
                                            "to different bytes from run to run; use h264 or another size")
    assert load(write(tmp_path, "name: t\nvideos:\n  - {id: a, prompt: p, resolution: 48x32}\n")).videos[0].width == 48
