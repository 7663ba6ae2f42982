"""Keep secrets off disk: credentials are replaced before a recording line is written.

Only values are touched; names, order and the auth scheme stay, so a recording still
shows *how* a request authenticated (``Bearer``, ``AWS4-HMAC-SHA256``) without the secret.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

REDACTED = "[redacted]"

SECRET_HEADERS = frozenset(
    {
        "authorization",
        "proxy-authorization",
        "x-api-key",
        "api-key",
        "x-goog-api-key",
        "cookie",
        "set-cookie",
        "x-amz-security-token",
    }
)

# Query parameters that carry a credential: Gemini's `key=`, presigned SigV4 URLs.
SECRET_QUERY = frozenset(
    {
        "key",
        "api_key",
        "api-key",
        "x-amz-signature",
        "x-amz-credential",
        "x-amz-security-token",
    }
)

# "Bearer sk-..." keeps "Bearer"; "AWS4-HMAC-SHA256 Credential=..., Signature=..." keeps the scheme.
_SCHEME = re.compile(r"^\s*([A-Za-z][A-Za-z0-9._-]*)\s+\S")


def redact_header_value(value: str) -> str:
    match = _SCHEME.match(value)
    if match and match.group(1).lower() in {"bearer", "basic", "aws4-hmac-sha256", "token", "digest"}:
        return f"{match.group(1)} {REDACTED}"
    return REDACTED


def redact_headers(
    headers: Iterable[tuple[str, str]], extra: Iterable[str] = ()
) -> list[list[str]]:
    """Header pairs (order and repeats kept) with secret values replaced."""
    secret = SECRET_HEADERS | {name.lower() for name in extra}
    return [
        [name, redact_header_value(value) if name.lower() in secret else value]
        for name, value in headers
    ]


def redact_url(url: str, extra: Iterable[str] = ()) -> str:
    """The URL with credential query values (and any userinfo password) replaced."""
    parts = urlsplit(url)
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, _, hostport = netloc.rpartition("@")
        user = userinfo.split(":", 1)[0]
        netloc = f"{user}:{REDACTED}@{hostport}" if ":" in userinfo else f"{REDACTED}@{hostport}"
    query = parts.query
    if query:
        secret = SECRET_QUERY | {name.lower() for name in extra}
        pairs = parse_qsl(query, keep_blank_values=True)
        if any(name.lower() in secret for name, _ in pairs):
            query = urlencode(
                [(name, REDACTED if name.lower() in secret else value) for name, value in pairs],
                safe="[]/:",
            )
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))
