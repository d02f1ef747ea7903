"""Which URLs a run may name in `notify`: one under a prefix the operator allows (REELBATCH_ALLOWED_WEBHOOKS).

A prefix and a URL are compared by their parts, never as strings: the same scheme (so plain http only where a prefix
says http), the same host and port, and the prefix's path ending at a `/` of the URL's path. So
`https://hooks.example.com/reelbatch` allows `https://hooks.example.com/reelbatch/done` but neither
`https://hooks.example.com.evil.net/` nor `https://hooks.example.com/reelbatch-other`. A URL must not carry a user
name or password (`https://allowed@evil.net/` reads as host evil.net), a fragment, or `.`/`..` path segments (a
receiver would resolve `/reelbatch/../admin` out of the prefix).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

MAX_URL_CHARS = 2048
_DEFAULT_PORTS = {"http": 80, "https": 443}
_BAD_CHARS = re.compile(r"[\x00-\x20\x7f\\]")


class BadUrl(ValueError):
    """The text is not a webhook URL reelbatch will POST to; the message says why."""


@dataclass(frozen=True)
class WebhookUrl:
    scheme: str  # http or https
    host: str  # lower case
    port: int  # the scheme's default when the URL names none
    path: str  # at least "/"
    query: str

    def __str__(self) -> str:
        port = "" if self.port == _DEFAULT_PORTS[self.scheme] else f":{self.port}"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}{port}{self.path}" + (f"?{self.query}" if self.query else "")

    def under(self, prefix: WebhookUrl) -> bool:
        if (self.scheme, self.host, self.port) != (prefix.scheme, prefix.host, prefix.port):
            return False
        base = prefix.path if prefix.path.endswith("/") else prefix.path + "/"
        return self.path == prefix.path or self.path.startswith(base)


def parse_url(text: str, *, prefix: bool = False) -> WebhookUrl:
    """A webhook URL (or, `prefix`, an allowed prefix, which may not hold a query) in canonical form."""
    if len(text) > MAX_URL_CHARS:
        raise BadUrl(f"is {len(text)} characters, over the {MAX_URL_CHARS} limit")
    if _BAD_CHARS.search(text):
        raise BadUrl("contains a space, a control character or a backslash")
    parts = urlsplit(text)
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS:
        raise BadUrl("must be an https:// URL (or http:// where an allowed prefix says http)")
    if "@" in parts.netloc:
        raise BadUrl("must not carry a user name or password")
    if not parts.hostname:
        raise BadUrl("has no host")
    try:
        port = parts.port
    except ValueError:
        raise BadUrl("has a port that is not a number from 0 to 65535") from None
    if parts.fragment or text.endswith("#"):
        raise BadUrl("must not have a #fragment")
    if prefix and (parts.query or text.endswith("?")):
        raise BadUrl("an allowed prefix must not have a ?query")
    path = parts.path or "/"
    if any(unquote(segment) in (".", "..") for segment in path.split("/")):
        raise BadUrl("must not have '.' or '..' path segments")
    return WebhookUrl(scheme, parts.hostname.lower(), port or _DEFAULT_PORTS[scheme], path, parts.query)


def allowed_prefixes(raw: str) -> tuple[str, ...]:
    """REELBATCH_ALLOWED_WEBHOOKS: comma-separated prefixes, each checked and made canonical."""
    out = []
    for text in (p.strip() for p in raw.split(",")):
        if text:
            try:
                out.append(str(parse_url(text, prefix=True)))
            except BadUrl as exc:
                raise BadUrl(f"prefix {text!r} {exc}") from None
    return tuple(out)


def check_allowed(text: str, allowed: tuple[str, ...] | None) -> str:
    """The URL, canonical, if it lies under one of the `allowed` prefixes; else BadUrl saying why."""
    if not allowed:
        raise BadUrl("cannot be used: the operator allows no webhook URLs (set REELBATCH_ALLOWED_WEBHOOKS)")
    url = parse_url(text)
    if not any(url.under(parse_url(p, prefix=True)) for p in allowed):
        raise BadUrl(f"is not under an allowed webhook prefix ({', '.join(allowed)})")
    return str(url)
