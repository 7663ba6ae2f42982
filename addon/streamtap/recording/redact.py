"""Keep secrets off disk: credentials are replaced before a recording line is written.

Secrets are found by NAME: a header, query parameter, JSON body field or form field whose
name says it carries a credential (``SECRET_PATTERNS`` below, listed in the README). Only
values are touched; names, order, structure and the auth scheme stay, so a recording still
shows *how* a request authenticated (``Bearer``, ``AWS4-HMAC-SHA256``) without the secret,
and a redacted JSON field is still a string (``"[redacted]"``): replay matching ignores it.

Counts are not secrets: the patterns look at whole words (``token`` as the last word, never
``tokens`` or ``token_count``), and in JSON bodies a number under a ``…token`` name is kept.
"""

from __future__ import annotations

import base64
import codecs
import functools
import json
import re
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import quote_plus, unquote_plus

REDACTED = "[redacted]"
FORM_REDACTED = quote_plus(REDACTED)  # how a redacted value reads in a form or query string

# Names redacted whatever their words (headers; kept for the users of this module).
SECRET_HEADERS = frozenset(
    {"authorization", "proxy-authorization", "x-api-key", "api-key", "x-goog-api-key", "cookie", "set-cookie", "x-amz-security-token"}
)
SECRET_QUERY = frozenset({"key", "api_key", "api-key", "x-amz-signature", "x-amz-credential", "x-amz-security-token"})

# The patterns, by the words of a name (split at non-letters and at camelCase humps, lower-cased):
SECRET_SUBSTRINGS = ("secret", "password", "passwd")  # anywhere in the name: client_secret, x-app-secret, db_password
SECRET_LAST_WORDS = frozenset(  # the name's last word: access_token, x-session-token, sessionToken, sig, X-Amz-Signature
    {"token", "signature", "sig", "credential", "credentials", "apikey", "cookie", "cookies", "authorization",
     "authentication"}
)
# only for headers, where it names a value (x-auth, Helicone-Auth); in a body, "auth" is mostly an
# object whose fields are judged by their own names
HEADER_LAST_WORDS = frozenset({"auth"})
KEY_QUALIFIERS = frozenset(  # "<word> key(s)" as the name's last two words: api_key, x-api-key, privateKey, api_keys
    {"api", "access", "private", "secret", "subscription", "account", "signing", "master", "client", "functions", "session", "auth"}
)
# the name's last words: AWS's access key id (AWSAccessKeyId in an S3 presigned URL, whose
# X-Amz-Credential carries the same id, aws_access_key_id in a gateway's body)
SECRET_LAST_WORD_RUNS = (("access", "key", "id"),)
# only for headers: any x-...-key (x-goog-api-key, x-functions-key, x-vendor-key); only for queries: key= (Gemini)
SECRET_PATTERNS = (
    "any name containing " + ", ".join(SECRET_SUBSTRINGS),
    "last word " + ", ".join(sorted(SECRET_LAST_WORDS)),
    "last words '<" + "|".join(sorted(KEY_QUALIFIERS)) + "> key' or '... keys'",
    "last words " + ", ".join("'" + " ".join(run) + "'" for run in SECRET_LAST_WORD_RUNS),
    "headers: x-...-key, last word auth, authorization, proxy-authorization, cookie, set-cookie, and any value in an auth "
    "scheme (Bearer, Basic, Digest, AWS4-HMAC-SHA256) whatever its header's name",
    "a trailing number is no word of the name (api_key2)",
    "query parameters: key",
)

_WORD = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")
_SCHEME = re.compile(r"^\s*([A-Za-z][A-Za-z0-9._-]*)\s+\S")
_AUTH_VALUE = re.compile(r"\s*(?:bearer|basic|digest|aws4-hmac-sha256)\s+\S", re.IGNORECASE)
# Form fields: name=value, or a bare name (a flag: "&remember"), at least one with a value
_FORM = re.compile(rb"(?=\S*=)[^&=\s]+(?:=[^&\s]*)?(?:&[^&=\s]+(?:=[^&\s]*)?)*&?")
# A query parameter. Servers differ on whether ";" separates parameters as "&" does (Python's
# parse_qsl did before 3.9.2), so a ";" that starts another name=value starts a parameter of its
# own; any other ";" stays in the value (a secret ending ";tail" is redacted whole either way).
_QUERY_PARAM = re.compile(r"(?:[^&;]|;(?![^&;=]*=))+")
# A JSON string, whole (a scan that takes every string whole never starts inside one), and the
# separator after it when it is a member's name
_JSON_STRING = re.compile(rb'"((?:[^"\\]|\\.)*)"(\s*:\s*)?')
_JSON_STRING_OR_BRACKET = re.compile(rb'"(?:[^"\\]|\\.)*"|[\[\]{}]')
_JSON_SCALAR = re.compile(rb'[^\s,\]}]+')
# A URL's authority, as urlsplit finds its netloc: after the scheme (if any) and "//", up to the
# path (urlsplit also skips leading spaces and control characters)
_AUTHORITY = re.compile(r"[\x00-\x20]*(?:[A-Za-z][A-Za-z0-9+.-]*:)?//([^/]*)")
_URL_IGNORED = str.maketrans("", "", "\t\r\n")  # what URL parsers remove wherever it stands
_NOT_IN_A_NAME = re.compile(r"[\s:=&,;]")  # never part of a header or query parameter name
# A run of text without whitespace, which may hold a URL (Location, Link, Referer, a link in a
# message). Matched whole, and judged by ``_URL_SECRET_MARKS`` after: a pattern that looked for the
# mark itself would backtrack over every start of a long word (quadratic in the value's length).
_URL_IN_VALUE = re.compile(r"\S+")
# What ends a URL in text (<https://…>, href="…"), unless it stands in a query's value (see
# ``_url_end``), and the words between them, one of which may be a URL.
_URL_DELIMITER = re.compile(r'[<>"]')
_URL_WORD = re.compile(r'[^<>"]+')
# Where a query's next parameter starts: what ends a ``_QUERY_PARAM`` match, or the fragment's "#"
_QUERY_SEPARATOR = re.compile(r"[&#]|;(?=[^&;=]*=)")
# where a URL can carry a secret: its query, its fragment (OAuth's #access_token=...), its
# userinfo (https://user:password@host)
_URL_SECRET_MARKS = re.compile(r"[?#@]")
# what a URL's scheme is made of (after its first character, a letter)
_SCHEME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789+-.")
# URLs inside a parameter's value inside a parameter's value...: past this, a value holding one
# that could carry a secret is redacted whole rather than looked into
MAX_URL_NESTING = 4
# A lone surrogate: half an emoji, which a JSON escape ("\ud83d") carries and Python's parser
# reads. No UTF-8 text holds it raw, so JSON that redaction writes holds it as that escape.
_SURROGATE = re.compile(r"[\ud800-\udfff]")


def words(name: str) -> list[str]:
    """``x-amz-Security-Token`` -> x amz security token; ``clientSecret`` -> client secret."""
    return [w.lower() for w in _WORD.findall(name)]


@functools.lru_cache(maxsize=4096)  # a body repeats a few names many times ("role", "content")
def secret_name(name: str, where: str = "body") -> bool:
    """Whether the patterns take ``name`` (of a ``header``, ``query`` parameter or ``body`` field) for a secret."""
    lowered = name.lower()
    if any(part in lowered for part in SECRET_SUBSTRINGS):
        return True
    parts = words(name)
    while parts and parts[-1].isdigit():  # api_key2, x-api-key-2, Set-Cookie2: the name before the number
        parts.pop()
    if not parts:
        return False
    if parts[-1] in SECRET_LAST_WORDS or (where == "header" and parts[-1] in HEADER_LAST_WORDS):
        return True
    if any(tuple(parts[-len(run):]) == run for run in SECRET_LAST_WORD_RUNS):
        return True
    if parts[-1] in ("key", "keys") and len(parts) >= 2 and parts[-2] in KEY_QUALIFIERS:
        return True  # (a list of keys is as secret as one; "keys" alone names no secret)
    if parts[-1] == "key":
        if where == "header" and len(parts) >= 2 and parts[0] == "x":
            return True
        if where == "query" and len(parts) == 1:
            return True
    return where == "header" and lowered in SECRET_HEADERS


def redact_header_value(value: str) -> str:
    match = _SCHEME.match(value)
    if match and match.group(1).lower() in {"bearer", "basic", "aws4-hmac-sha256", "token", "digest"}:
        return f"{match.group(1)} {REDACTED}"
    return REDACTED


class Redactor:
    """The redaction rules in force: the patterns, plus ``extra`` names always redacted,
    minus ``allow`` names a pattern would catch wrongly (both case-insensitive, exact names)."""

    def __init__(self, extra: Iterable[str] = (), allow: Iterable[str] = ()) -> None:
        self.extra = frozenset(name.lower() for name in extra)
        self.allow = frozenset(name.lower() for name in allow)

    def secret(self, name: str, where: str) -> bool:
        lowered = name.lower()
        if lowered in self.extra:
            return True
        return lowered not in self.allow and secret_name(name, where)

    def headers(self, headers: Iterable[tuple[str, str]]) -> list[list[str]]:
        """Header pairs (order and repeats kept) with secret values replaced: by the header's
        name, or by its value when that is credentials in an auth scheme whatever the name
        (``Helicone-Auth: Bearer ...``), the userinfo of a ``Host``, the members of a JSON value as
        a body's, and the secrets in the query, fragment or userinfo of a URL in any value
        (``Location``, ``Link``, ``Referer``)."""
        out = []
        for name, value in headers:
            lowered = name.lower()
            if self.secret(name, "header") or (lowered not in self.allow and _AUTH_VALUE.match(value)):
                value = redact_header_value(value)
            elif lowered in ("host", ":authority") and "@" in value:
                value = f"{REDACTED}@{value.rpartition('@')[2]}"
            elif value.lstrip()[:1] in ("{", "[") and (members := self.string(value)) != value:
                value = members  # JSON (Portkey's x-portkey-config): its members judged as a body's
            elif _URL_SECRET_MARKS.search(value):  # a URL's query, fragment or userinfo may hold a key
                value = _URL_IN_VALUE.sub(lambda run: self._urls_in_run(run[0], _URL_SECRET_MARKS.search), value)
            out.append([name, value])
        return out

    def urls_in_text(self, text: str) -> str:
        """A body's text (an ``image_url``, an MCP ``server_url``, a link in a message) with the
        secrets in each URL's query, fragment or userinfo redacted, as in a header value; only
        words that hold ``://`` count as URLs here (prose is full of ``?`` and ``@``)."""
        if "://" not in text or not _URL_SECRET_MARKS.search(text):
            return text
        return _URL_IN_VALUE.sub(lambda run: self._urls_in_run(run[0], _url_word), text)

    def _urls_in_run(self, run: str, is_url: Callable[[str], Any]) -> str:
        """A run of text without whitespace, each word (split at ``<``, ``>`` and ``"``) that
        ``is_url`` takes for a URL redacted as one, with its query as long as ``_url_end`` reads it."""
        if not _URL_SECRET_MARKS.search(run) or ("=" not in run and "@" not in run):
            return run  # (redaction replaces a parameter's value or a userinfo: none here)
        out, done = [], 0
        separators = _Separators(run)
        for word in _URL_WORD.finditer(run):
            start, end, text = word.start(), word.end(), word[0]
            if start < done or not is_url(text):
                continue  # (a word inside the query of a URL already taken, or no URL)
            start += _url_start(text)  # its userinfo is read from its scheme on
            if "?" in text or "#" in text:
                end = _url_end(run, start, end, separators)
            url = run[start:end]
            out += (run[done:start], self.url(url) if "=" in url or "@" in url else url)
            done = end
        out.append(run[done:])
        return "".join(out)

    def url(self, url: str, nesting: int = 0) -> str:
        """The URL with credential query values and any userinfo replaced, every other byte as
        it was. Split where urlsplit splits it, but in place: urlsplit would drop a bare ``?`` or
        ``#`` on the way back, and refuses a host with an unbalanced ``[`` (mitmproxy builds the
        URL from the client's ``Host`` header), whose query may hold a key all the same. Tabs and
        line breaks go first, as urlsplit and browsers drop them: ``ap\ti_key`` is ``api_key``."""
        url = url.translate(_URL_IGNORED)
        if "@" in url:
            url = _userinfo_past_a_mark(url)
        head, hash_mark, fragment = url.partition("#")
        head, question_mark, query = head.partition("?")
        param = functools.partial(self._query_param, nesting=nesting)
        query = _QUERY_PARAM.sub(param, query)
        if "=" in fragment:  # a fragment in query form (OAuth's #access_token=...)
            fragment = _QUERY_PARAM.sub(param, fragment)
        return _without_userinfo(head) + question_mark + query + hash_mark + fragment

    def _query_param(self, match: re.Match[str], nesting: int = 0) -> str:
        """One ``name=value`` of a query, its value replaced when the name is a secret's, or when
        the value is a URL that carries one; every other byte as it was."""
        name, eq, value = match[0].partition("=")
        if eq and (self.secret(unquote_plus(name), "query") or self._nests_a_secret(value, nesting)):
            return f"{name}={REDACTED}"
        return match[0]

    def _nests_a_secret(self, value: str, nesting: int) -> bool:
        """Is a parameter's value a URL, raw or percent-encoded, with a secret of its own (a login's
        ``next``, an image proxy's ``url`` of a presigned S3 object)? The whole value is then
        redacted, so a replay matches it as it matches any redacted value."""
        value = unquote_plus(value)
        mark = value.find("://")
        if mark < 0 or not _URL_SECRET_MARKS.search(value, mark):
            return False
        if nesting >= MAX_URL_NESTING:
            return True
        inner = value[_url_start(value) :].translate(_URL_IGNORED)  # (url() drops them: no secret in that)
        return self.url(inner, nesting + 1) != inner

    def json(self, value: Any) -> Any:
        """A JSON value with the values of secret fields replaced, at any depth: under a secret
        name, a string, an object (whole) and every item of a list. Numbers under a ``…token`` name
        stay (unless the name was given to redact), as does the structure around the values. The
        one object kept under a secret name is a JSON Schema fragment (a tool's parameters may well
        describe a ``password`` property) that says what kind of value it describes, each keyword
        holding what it holds: its fields are judged by their own names, and the values it carries
        (``default``, ``const``, ``enum``, ``examples``) as the name's."""
        if isinstance(value, dict):
            out = {}
            for name, item in value.items():
                if isinstance(name, str) and self.secret(name, "body"):
                    item = self._under_secret_name(name, item)
                elif isinstance(item, (dict, list)) and isinstance(name, str) and words(name)[-1:] == ["headers"]:
                    item = self._header_map(item) if isinstance(item, dict) else [self._header_item(i) for i in item]
                else:
                    item = self.json(item)
                out[name] = item
            return out
        if isinstance(value, list):
            return [self.json(item) for item in value]
        if isinstance(value, str):
            return self.string(value)
        return value

    def _header_map(self, value: dict[Any, Any]) -> dict[Any, Any]:
        """The headers a request body gives for another request (an MCP tool's ``headers``, a
        client's ``extra_headers``): each string judged as a header is, by its name or by a value in
        an auth scheme, and anything else as a body's member."""
        return {name: self.headers([(name, item)])[0][1] if isinstance(name, str) and isinstance(item, str)
                else self.json({name: item})[name] for name, item in value.items()}

    def _header_item(self, item: Any) -> Any:
        """One item of headers given as a list: a ``[name, value]`` pair, or ``{"name", "value"}``
        (HAR's shape), judged as that header; anything else as a body's item."""
        if isinstance(item, list) and len(item) == 2 and isinstance(item[0], str) and isinstance(item[1], str):
            return [item[0], self.headers([(item[0], item[1])])[0][1]]
        if isinstance(item, dict) and isinstance(item.get("name"), str) and isinstance(item.get("value"), str):
            value = self.headers([(item["name"], item["value"])])[0][1]
            return {k: value if k == "value" else self.json({k: v})[k] for k, v in item.items()}
        return self.json(item)

    def string(self, text: str) -> str:
        """A string value, with the JSON it may carry redacted inside, or else the URLs it holds:
        the one rule for strings, whether the body was parsed (``json``) or scanned (``json_bytes``)."""
        head = text.lstrip()[:1]
        if head in ("{", "["):
            return self._json_in_text(text)
        if head == '"':
            redacted = self._json_text_in_text(text)
            if redacted != text:
                return redacted
        return self.urls_in_text(text)

    def _under_secret_name(self, name: str, value: Any, subschema: bool = False) -> Any:
        if isinstance(value, list):
            return [self._under_secret_name(name, item) for item in value]
        if name.lower() in self.extra and value is not None and not isinstance(value, bool):
            return REDACTED  # a name given to redact: whatever its value is, a schema's shape too
        if isinstance(value, dict):
            if not (_schema_fragment(value) if subschema else _schema(value)):  # (a subschema may only constrain)
                return REDACTED
            described = self.json(value)
            for keyword in _SCHEMA_VALUES.intersection(described):  # a default api_key is a key
                described[keyword] = self._under_secret_name(name, described[keyword])
            for keyword in _SAME_VALUE.intersection(described):  # {"anyOf": [{"const": "sk-…"}, …]}
                sub = described[keyword]
                described[keyword] = (self._under_secret_subschema(name, sub) if not isinstance(sub, list)
                                      else [self._under_secret_subschema(name, item) for item in sub])
            return described
        return REDACTED if _secret_scalar(name, value) else value

    def _under_secret_subschema(self, name: str, schema: Any) -> Any:
        """A subschema of a schema kept under a secret name: its values are the secret's too."""
        return self._under_secret_name(name, schema, subschema=True) if isinstance(schema, dict) and schema else schema

    def _json_in_text(self, text: str) -> str:
        """JSON carried as a string (a tool call's ``arguments``): redacted inside, re-serialized
        by ``dump_embedded`` only when something was redacted, else left as it was."""
        try:
            inner = json.loads(text)
            redacted = self.json(inner)
        except (ValueError, RecursionError):  # cut arguments, trailing junk, too deep: scanned instead
            scanned = self.json_bytes(text.encode("utf-8", "surrogatepass")).decode("utf-8", "surrogatepass")
            # and the URLs in it: a string of cut JSON, or no JSON at all ("[the docs](https://…?key=…)")
            return self.urls_in_text(scanned)
        return dump_embedded(redacted) if redacted != inner else text

    def _json_text_in_text(self, text: str) -> str:
        """Arguments encoded twice, as some models and compatible servers send them back: a JSON
        string literal holding the JSON, whole or cut (then it is read as if its quote closed it).
        Anything else that starts with a quote (a user's quoted words) is left as it was."""
        cut = False
        try:
            inner = json.loads(text)
        except (ValueError, RecursionError):
            try:  # cut: close the literal (a cut inside an escape loses its backslash)
                inner = json.loads(text.rstrip().rstrip("\\") + '"')
            except (ValueError, RecursionError):
                return text
            cut = True
        if not isinstance(inner, str) or inner.lstrip()[:1] not in ("{", "["):
            return text
        redacted = self._json_in_text(inner)
        if redacted == inner:
            return text
        out = dump_embedded(redacted)
        return out[:-1] if cut else out

    def form(self, body: bytes) -> bytes:
        """An ``a=1&b=2`` body with secret fields' values replaced; every other byte as it was."""
        def field(match: re.Match[str]) -> str:  # split as a query is: at "&", and at a ";" that starts a field
            name, eq, _value = match[0].partition("=")
            return f"{name}={FORM_REDACTED}" if eq and self.secret(unquote_plus(name), "body") else match[0]

        return _QUERY_PARAM.sub(field, body.decode("latin-1")).encode("latin-1")

    def request_part(self, part: dict[str, Any]) -> dict[str, Any]:
        """A recording header's ``request`` or ``response``, redacted."""
        part = dict(part)
        if "headers" in part:
            part["headers"] = self.headers(part["headers"])
        if "url" in part:
            part["url"] = self.url(part["url"])
        if "body" in part:
            try:
                part["body"] = self.json(part["body"])
            except RecursionError:  # nested deeper than Python recurses (orjson reads 1,024 levels)
                part["body"] = REDACTED
        if isinstance(part.get("body_b64"), str):
            try:
                raw = base64.b64decode(part["body_b64"], validate=True)
            except ValueError:
                raw = None
            if raw is not None:
                # JSON first: `curl -d` sends JSON as a form; a body that is both is redacted as both
                if (wide := _wide_json(raw)) is not None:  # (UTF-16 JSON may start with the byte of a "{")
                    raw = self._wide_json_bytes(*wide)
                elif raw.lstrip(b"\xef\xbb\xbf \t\r\n")[:1] in (b"{", b"["):
                    raw = self.json_bytes(raw)
                if looks_like_form(raw, part.get("headers")):
                    raw = self.form(raw)
                part["body_b64"] = base64.b64encode(raw).decode("ascii")
        return part

    def _wide_json_bytes(self, raw: bytes, bom: bytes, codec: str, text: str) -> bytes:
        """JSON in UTF-16 or UTF-32 (Python's ``json.loads`` reads bytes so, and apps built on it with
        it; ``text`` is ``raw`` after its ``bom``, decoded), redacted as ``json_bytes`` redacts UTF-8:
        every other byte as it was."""
        redacted = self.json_bytes(text.encode("utf-8", "surrogatepass")).decode("utf-8", "surrogatepass")
        return raw if redacted == text else bom + redacted.encode(codec, "surrogatepass")

    def _json_string_redacted(self, body: bytes) -> bytes | None:
        """A JSON string literal (its ``body`` between the quotes) redacted as ``json`` redacts
        the string it holds; None when that leaves it as it was."""
        text = _json_string(body)
        if text is None:
            return None
        redacted = self.string(text)
        if redacted == text:
            return None
        return _dumps(redacted).encode("utf-8")

    def json_bytes(self, raw: bytes) -> bytes:
        """JSON text the parser refused (a lone surrogate escape, 1e400, deep nesting, a BOM: all
        JSON to an app's own parser) with the values of secret members redacted as ``json`` does,
        found by a scan that reads every string whole; every other byte as it was. A value that
        no parser reads (nested too deep, say) is redacted whole."""
        out, done, at = [], 0, 0
        while match := _JSON_STRING.search(raw, at):
            at = match.end()
            if match[2] is None:  # a string that names no member: a value, which may carry JSON (arguments)
                replaced = self._json_string_redacted(match[1])
                if replaced is not None:
                    out += (raw[done : match.start()], replaced)
                    done = at
                continue
            try:
                name = json.loads(b'"' + match[1] + b'"')
            except ValueError:
                continue
            if not self.secret(name, "body"):
                continue
            end = _json_value_end(raw, at)
            if end is None:
                if raw[at : at + 1] not in (b'"', b"{", b"["):
                    continue  # no value follows the name
                # the text ends inside the value (a tool call cut short): what was sent of a secret is one
                end = len(raw)
            try:
                value = json.loads(raw[at:end])
            except (ValueError, RecursionError):
                replacement = json.dumps(REDACTED)
            else:
                redacted = self._under_secret_name(name, value)
                if redacted is value or (redacted == value and type(redacted) is type(value)):
                    continue  # kept (a count, a schema): the members inside are scanned in turn
                replacement = _dumps(redacted)
            out += (raw[done:at], replacement.encode("utf-8"))
            done = at = end
        out.append(raw[done:])
        return b"".join(out)


_WIDE_BOMS = ((codecs.BOM_UTF32_LE, "utf-32-le"), (codecs.BOM_UTF32_BE, "utf-32-be"),
              (codecs.BOM_UTF16_LE, "utf-16-le"), (codecs.BOM_UTF16_BE, "utf-16-be"))


def _wide_json(raw: bytes) -> tuple[bytes, bytes, str, str] | None:
    """(the body, its byte order mark, the codec of the rest, the rest decoded) of a body that is
    JSON text in UTF-16 or UTF-32 as ``json.detect_encoding`` reads bytes; None for any other body."""
    encoding = json.detect_encoding(raw)
    if not encoding.startswith(("utf-16", "utf-32")):
        return None
    bom, codec = next(((bom, codec) for bom, codec in _WIDE_BOMS if raw.startswith(bom)), (b"", encoding))
    try:
        text = raw[len(bom) :].decode(codec, "surrogatepass")
    except UnicodeDecodeError:
        return None
    return (raw, bom, codec, text) if text.lstrip(" \t\r\n")[:1] in ("{", "[") else None


def _url_end(run: str, start: int, end: int, separators: _Separators) -> int:
    """Where the URL that begins with the word ``run[start:end]`` (which holds its query or
    fragment) ends: at the first ``"``, ``<`` or ``>`` after it that stands in no parameter's
    value. One does when another parameter follows the value (``?q="exact"&api_key=…``, which a
    server reads as one query; or the fragment, ``#access_token=…``), or when it begins the value
    (``api_key="sk-…"``), which then runs on as any last value does. The URL ends all the same at
    one that a URL of its own follows (scanned as one), and at a ``>`` that closes a URL a ``<``
    opened, unless a ``&`` follows (``<…?page=2>;rel="next"``: the Link header's parameters are
    no query's)."""
    opened_by_angle = run[start - 1 : start] == "<"
    quoted = False  # in the last parameter, whose value began with a delimiter
    while end < len(run):  # at a delimiter
        following = _URL_DELIMITER.search(run, end + 1)
        following = following.start() if following else len(run)
        if opened_by_angle and run[end] == ">" and run[end + 1 : end + 2] != "&":
            return end
        if run.find("://", end + 1, following) != -1:
            return end
        if not quoted and separators.next(end) is None:  # the last parameter
            if run[end - 1] != "=":
                return end
            quoted = True
        end = following
    return end


class _Separators:
    """The next ``_QUERY_SEPARATOR`` in a run at or after a position, asked for at positions that
    only grow: a scan starts past the last one's find, so a run is read once however many URLs
    and delimiters it holds."""

    def __init__(self, run: str) -> None:
        self._run = run
        self._from, self._found = len(run) + 1, None  # the last scan: where it began, what it found

    def next(self, at: int) -> int | None:
        if not (self._from <= at and (self._found is None or at <= self._found)):
            match = _QUERY_SEPARATOR.search(self._run, at)
            self._from, self._found = at, match.start() if match else None
        return self._found


def _url_word(word: str) -> bool:
    """A word of a body's text taken for a URL that may carry a secret."""
    return "://" in word and _URL_SECRET_MARKS.search(word) is not None


def _url_start(word: str) -> int:
    """Where the URL in a word begins: at the scheme before its first ``://``, after whatever the
    word holds before it (a quote, a markdown link's ``[text](``, an .env line's ``NAME=``); 0
    without one. Walked back from the ``://``, so a long word costs one pass, where a pattern
    searched for would start again at each of its characters."""
    mark = word.find("://")
    if mark < 0:
        return 0
    start = mark
    while start and word[start - 1] in _SCHEME_CHARS:
        start -= 1
    while start < mark and not word[start].isalpha():  # a scheme begins with a letter
        start += 1
    return start if start < mark else 0


def _without_userinfo(head: str) -> str:
    """A URL's part before its query with the userinfo replaced, user and password both: a token
    is often sent as the user (https://TOKEN:@host)."""
    authority = _AUTHORITY.match(head)
    if authority is None:
        return head
    path = head[authority.end() :]
    if "@" in path:
        path = _nested_userinfo(path)
    if "@" not in authority[1]:
        return head[: authority.end()] + path
    return head[: authority.start(1)] + REDACTED + head[authority.start(1) + authority[1].rindex("@") : authority.end()] + path


def _userinfo_past_a_mark(url: str) -> str:
    """The URL with a ``user:password@`` whose password holds a ``#`` or ``?`` (a DSN's random
    password) replaced: urlsplit, and ``url``'s split, would end the userinfo at that mark."""
    authority = _AUTHORITY.match(url)
    if authority is None:
        return url
    at = authority[1].rfind("@")
    userinfo = authority[1][: max(at, 0)]
    marks = [i for i in (userinfo.find("?"), userinfo.find("#")) if i >= 0]
    if not marks or ":" not in userinfo[: min(marks)]:
        return url
    return url[: authority.start(1)] + REDACTED + url[authority.start(1) + at :]


def _nested_userinfo(path: str) -> str:
    """A URL's path with the userinfo of each URL inside it replaced (an image or CORS proxy's
    ``https://proxy/fetch/https://user:pw@host/x``). Found by ``://``, not by a scheme's pattern,
    which a long word would have searched again from each of its letters."""
    out, done = [], 0
    found = path.find("://")
    while found >= 0:
        start = found + 3
        end = path.find("/", start)
        end = len(path) if end < 0 else end
        at = path.rfind("@", start, end)
        if at >= 0:
            out += (path[done:start], REDACTED)
            done = at
        found = path.find("://", end)
    out.append(path[done:])
    return "".join(out)


def _json_string(body: bytes) -> str | None:
    try:
        return json.loads(b'"' + body + b'"')
    except ValueError:
        return None


def _json_value_end(raw: bytes, start: int) -> int | None:
    """Where the JSON value that begins at ``start`` ends (an object or array with its nesting,
    strings read whole), or None when the text ends first."""
    first = raw[start : start + 1]
    if first == b'"':
        match = _JSON_STRING_OR_BRACKET.match(raw, start)
        return match.end() if match else None
    if first not in (b"{", b"["):
        match = _JSON_SCALAR.match(raw, start)
        return match.end() if match else None
    depth = 0
    for token in _JSON_STRING_OR_BRACKET.finditer(raw, start):
        if token[0] in (b"{", b"["):
            depth += 1
        elif token[0] in (b"}", b"]"):
            depth -= 1
            if depth == 0:
                return token.end()
    return None


def name_problem(name: str) -> str | None:
    """Why ``name`` cannot be a header, query parameter or body field name to redact or allow
    (a list given as one value, say), or None."""
    if not name:
        return "an empty name"
    if _NOT_IN_A_NAME.search(name):
        return f"{name!r} is not a header or query parameter name (give each name on its own)"
    return None


def dump_embedded(value: Any) -> str:
    """How redacted JSON-in-a-string is written (replay matching writes a request's the same way)."""
    return _dumps(value, separators=(",", ":"))


def _dumps(value: Any, **options: Any) -> str:
    """``json.dumps`` keeping text as it is, but a lone surrogate as its escape: written raw, the
    JSON would be no UTF-8 (the header line could not be written, or a kept body no longer
    JSON), where the client sent valid JSON."""
    return _SURROGATE.sub(_surrogate_escape, json.dumps(value, ensure_ascii=False, **options))


def _surrogate_escape(char: re.Match[str]) -> str:
    return f"\\u{ord(char[0]):04x}"


# the keywords that carry values of what they describe
_SCHEMA_VALUES = frozenset({"enum", "const", "default", "examples", "example"})
# the keywords whose schemas describe the same value (the secret's too, under a secret name)
_SAME_VALUE = frozenset({"anyOf", "oneOf", "allOf", "not", "if", "then", "else", "prefixItems", "items", "contains"})
# the keywords that say what kind of value a schema describes: a schema under a secret name names
# one (``{"title": "sk-live-…"}`` alone describes nothing, and may be the secret)
_SCHEMA_KINDS = frozenset({"type", "properties", "items", "anyOf", "oneOf", "allOf", "not", "$ref", "enum", "const"})


def _schema(value: Any) -> bool:
    """A JSON Schema kept under a secret name: a fragment that says what kind of value it describes."""
    return _schema_fragment(value) and not _SCHEMA_KINDS.isdisjoint(value)


def _schema_fragment(value: Any) -> bool:
    """Schema keywords only, each holding what that keyword holds: a subschema where one belongs
    (``{"items": ["sk-live-…"]}`` names no schema, whatever its keys say), a type name under
    ``type``, a number under ``minLength`` (``{"type": "sk-live-…"}`` describes nothing)."""
    if not isinstance(value, dict) or not value:
        return False
    for key, item in value.items():
        holds = _SCHEMA_KEYWORDS.get(key)
        if holds is None or not holds(item):
            return False
    return True


def _subschema(value: Any) -> bool:
    """What a keyword that takes a schema holds: a schema, ``{}`` (anything) or true/false."""
    return isinstance(value, bool) or value == {} or _schema_fragment(value)


def _subschemas(value: Any) -> bool:
    return isinstance(value, list) and all(map(_subschema, value))


def _named_subschemas(value: Any) -> bool:
    return isinstance(value, dict) and all(map(_subschema, value.values()))


_TYPE_NAMES = frozenset({"null", "boolean", "object", "array", "number", "string", "integer"})


def _type_name(value: Any) -> bool:
    return isinstance(value, str) and value.lower() in _TYPE_NAMES  # Gemini writes them upper-case


def _text(value: Any) -> bool:
    return isinstance(value, str)


def _flag(value: Any) -> bool:
    return isinstance(value, bool)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _count(value: Any) -> bool:
    """A length: an integer, or one written as protobuf's JSON writes an int64 (``"8"``, as
    Gemini's clients may send it)."""
    if isinstance(value, str):
        return value.isascii() and value.isdigit()
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


# JSON Schema keywords, each with what it holds: an object made of these alone describes a value, it holds none
_SCHEMA_KEYWORDS = {
    "type": lambda v: _type_name(v) or isinstance(v, list) and bool(v) and all(map(_type_name, v)),
    "properties": _named_subschemas, "$defs": _named_subschemas, "definitions": _named_subschemas,
    "items": lambda v: _subschema(v) or _subschemas(v),  # (a list of schemas: draft 4's tuple "items")
    "additionalProperties": _subschema, "not": _subschema,
    "anyOf": _subschemas, "oneOf": _subschemas, "allOf": _subschemas,
    "$ref": lambda v: _text(v) and v.startswith("#"),  # a tool's schema resolves no other
    # (draft 3 marks a property required with true)
    "required": lambda v: _flag(v) or isinstance(v, list) and all(map(_text, v)),
    "minLength": _count, "maxLength": _count, "minItems": _count, "maxItems": _count,
    "minimum": _number, "maximum": _number, "multipleOf": _number,
    "exclusiveMinimum": lambda v: _number(v) or _flag(v),  # (draft 4's are true/false)
    "exclusiveMaximum": lambda v: _number(v) or _flag(v),
    "prefixItems": _subschemas, "contains": _subschema, "propertyNames": _subschema, "contentSchema": _subschema,
    "patternProperties": _named_subschemas, "dependentSchemas": _named_subschemas,
    "unevaluatedProperties": _subschema, "unevaluatedItems": _subschema,
    "if": _subschema, "then": _subschema, "else": _subschema,
    "minProperties": _count, "maxProperties": _count, "minContains": _count, "maxContains": _count,
    "dependentRequired": lambda v: isinstance(v, dict) and all(isinstance(n, list) and all(map(_text, n)) for n in v.values()),
    # pydantic's tagged unions; Gemini's order of an object's properties
    "discriminator": lambda v: isinstance(v, dict) and _text(v.get("propertyName")),
    "propertyOrdering": lambda v: isinstance(v, list) and all(map(_text, v)),
    "nullable": _flag, "uniqueItems": _flag, "deprecated": _flag, "readOnly": _flag, "writeOnly": _flag,
    # text, kept as a description is (the fragment's kind says it is a schema)
    "description": _text, "title": _text, "format": _text, "pattern": _text, "contentEncoding": _text,
    "contentMediaType": _text,
    # values of what is described, redacted under a secret name as the secret's
    "enum": lambda v: isinstance(v, list), "examples": lambda v: isinstance(v, list),
    "const": lambda v: True, "default": lambda v: True, "example": lambda v: True,  # (OpenAPI's, Gemini's)
}


def _secret_scalar(name: str, value: Any) -> bool:
    """A value to redact under a secret name: a string, or a number unless the name ends in
    ``token`` (a count such as ``max_token`` is a number; a PIN under ``password`` is a secret)."""
    if isinstance(value, str):
        return True
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return words(name)[-1:] != ["token"]


def looks_like_form(raw: bytes, headers: Any = None) -> bool:
    """A form body: so declared, or bytes that follow the ``a=1&b=2`` grammar."""
    for name, value in headers or ():
        if str(name).lower() == "content-type" and "x-www-form-urlencoded" in str(value).lower():
            return True
    return _FORM.fullmatch(raw.strip()) is not None


def redact_headers(headers: Iterable[tuple[str, str]], extra: Iterable[str] = ()) -> list[list[str]]:
    """Header pairs (order and repeats kept) with secret values replaced."""
    return Redactor(extra).headers(headers)


def query_pairs(query: str) -> list[tuple[str, str]]:
    """The decoded name/value pairs of a query string, split where ``Redactor.url`` splits it:
    what a recording's query and a live request's are compared by. Each ``&`` piece is decoded
    before it is split at ``;``, so a query that an older streamtap wrote re-encoded (``;`` as
    ``%3B``) reads as the live one does."""
    pairs = []
    for piece in query.split("&"):
        for param in _QUERY_PARAM.findall(unquote_plus(piece)):
            name, _, value = param.partition("=")
            pairs.append((name, value))
    return pairs


def redact_url(url: str, extra: Iterable[str] = ()) -> str:
    """The URL with credential query values (and any userinfo password) replaced."""
    return Redactor(extra).url(url)
