"""Redaction where it used to differ or fail: JSON that orjson refuses is scanned with the same
rule for strings as parsed JSON (arguments encoded twice included); a URL is redacted in place
(a bare ``?`` or ``#`` kept) and also when its host has an unbalanced ``[``, as mitmproxy builds
it from a client's ``Host`` header; a ``--redact`` name takes a schema-shaped value too; an
import goes on past a flow that fails; and ``serve`` answers a target whose host urlsplit refuses."""

from __future__ import annotations

import base64
import json
import socket
import subprocess
import sys
import time
from urllib.parse import urlsplit

import pytest
from replay_streams import OPENAI_REQUEST, openai_chat_frames, write_recording, write_recordings

from streamtap.recording.header import request_body_fields
from streamtap.recording.importer import import_capture
from streamtap.recording.redact import REDACTED, Redactor
from streamtap.recording.writer import final_name
from streamtap.replay.faults import Timing, parse_faults
from streamtap.replay.match import Library
from streamtap.replay.server import ServeOptions, ServerThread

PASSWORD = "PW-LEAK-7731"


def _twice(value) -> str:
    return json.dumps(json.dumps(value))


# --- the scan of a body orjson refuses redacts what the parse redacts ---------------------------

TWICE_ENCODED = {
    "twice": _twice({"user": "alice", "password": PASSWORD}),
    "list twice": _twice([{"password": PASSWORD}]),
    "padded twice": "  " + _twice({"password": PASSWORD}),
    "cut twice": _twice({"password": PASSWORD, "more": "x" * 8})[:-5],
}


def _recorded_body(raw: bytes) -> tuple[str, bytes]:
    """How a request body is kept in a recording's header ("body" or "body_b64"), and its text."""
    part = Redactor().request_part({"headers": [["content-type", "application/json"]], **request_body_fields((raw, None))})
    if "body" in part:
        return "body", json.dumps(part["body"], ensure_ascii=False).encode("utf-8", "surrogatepass")
    return "body_b64", base64.b64decode(part["body_b64"])


@pytest.mark.parametrize("arguments", TWICE_ENCODED.values(), ids=TWICE_ENCODED.keys())
def test_arguments_encoded_twice_are_redacted_also_when_orjson_refuses_the_body(arguments):
    message = {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function",
                                                    "function": {"name": "login", "arguments": arguments}}]}
    parses = json.dumps({"model": "m", "stream": True, "messages": [message]}).encode()
    # the same body with a lone surrogate escape in a user message (an emoji cut in half)
    refused = parses.replace(b'"messages": [', b'"messages": [{"role": "user", "content": "\\ud83d"}, ')
    for raw, kept_as in ((parses, "body"), (refused, "body_b64")):
        how, text = _recorded_body(raw)
        assert how == kept_as
        assert PASSWORD.encode() not in text, (kept_as, text)
        assert REDACTED.encode() in text


def test_the_scan_leaves_a_string_of_quoted_words_as_it_was():
    raw = b'{"content": "\\"quoted words\\" and more", "x": 1e400}'
    assert Redactor().json_bytes(raw) == raw


# --- URLs ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("url, redacted", [
    ("http://[api.openai.com/v1/chat/completions?key=SECRET-Q",
     f"http://[api.openai.com/v1/chat/completions?key={REDACTED}"),
    ("http://api.openai.com]/v1/chat/completions?api_key=SECRET-Q&x=1",
     f"http://api.openai.com]/v1/chat/completions?api_key={REDACTED}&x=1"),
    ("https://tok:SECRET-U@[api.openai.com/v1?key=SECRET-Q",
     f"https://{REDACTED}@[api.openai.com/v1?key={REDACTED}"),
])
def test_a_host_with_an_unbalanced_bracket_is_redacted_not_refused(url, redacted):
    assert Redactor().url(url) == redacted


@pytest.mark.parametrize("url", [
    "https://api.openai.com/v1/chat/completions?",
    "https://api.openai.com/v1/chat/completions#",
    "https://api.openai.com/v1/chat/completions?#",
    "HTTPS://API.openai.com:443/v1/chat/completions?a=%41&&b",
    "https://[::1]:8080/v1?",
])
def test_a_url_without_secrets_is_recorded_byte_for_byte(url):
    assert Redactor().url(url) == url


def test_only_the_secrets_of_a_url_change():
    url = "HTTPS://user:pw@Host/v1/x?key=S1&&a=%41;sig=S2?#access_token=S3&state=ok"
    assert Redactor().url(url) == (
        f"HTTPS://{REDACTED}@Host/v1/x?key={REDACTED}&&a=%41;sig={REDACTED}#access_token={REDACTED}&state=ok"
    )


@pytest.mark.parametrize("url", [
    "https://u:p@host/x", "https://u@host", "//u:p@host/x?y", "http://host/a@b", "http://host?x=a@b",
    "mailto:u@host", "/v1/x?u@h", " https://u@host/", "https://host#u@x", "https://u@h@host/x",
])
def test_userinfo_is_found_where_urlsplit_finds_a_netloc(url):
    userinfo, at, _host = urlsplit(url).netloc.rpartition("@")
    expected = url.replace(userinfo + at, REDACTED + at, 1) if at else url
    assert Redactor().url(url) == expected


@pytest.mark.parametrize(("name", "value", "kept"), [
    ("Location", "https://gen.example/v1/x:streamGenerateContent?alt=sse&key=AIzaK1", "https://gen.example/v1/x:streamGenerateContent?alt=sse&key={}"),
    ("Link", "<https://gen.example/next?key=AIzaK2>; rel=next, </other?page=2>; rel=last", "<https://gen.example/next?key={}>; rel=next, </other?page=2>; rel=last"),
    ("Referer", "/v1/models?api_key=K3&x=1", "/v1/models?api_key={}&x=1"),
    # no "?": a fragment in query form (OAuth's implicit grant) and a userinfo password
    ("Location", "https://app.example/cb#access_token=K4&token_type=bearer", "https://app.example/cb#access_token={}&token_type=bearer"),
    ("Referer", "https://user:K5@dash.example/page", "https://{}@dash.example/page"),
    ("Link", "<//K6@cdn.example/next>; rel=next", "<//{}@cdn.example/next>; rel=next"),
    ("From", "bot@example.test", "bot@example.test"),
    ("X-Note", "see #42, key=K7", "see #42, key=K7"),
    ("Content-Type", "text/event-stream; charset=utf-8", "text/event-stream; charset=utf-8"),
    ("X-Note", "why? because", "why? because"),
])
def test_a_url_in_any_header_value_has_its_secrets_redacted(name, value, kept):
    """Only the header's name decided: a key in the query, fragment or userinfo of a URL in a
    Location, Link or Referer header was recorded as it came."""
    assert Redactor().headers([(name, value)]) == [[name, kept.format(REDACTED)]]


@pytest.mark.parametrize(("name", "value", "kept"), [
    ("Referer", 'https://app.example/search?q="exact"&api_key=K1', 'https://app.example/search?q="exact"&api_key={}'),
    ("Referer", "https://app.example/p?a=<b>&key=K2&z=1", "https://app.example/p?a=<b>&key={}&z=1"),
    ("Location", 'https://app.example/cb#x="y"&access_token=K3', 'https://app.example/cb#x="y"&access_token={}'),
    ("Link", '<https://gen.example/next?key=K4>; rel="next"', '<https://gen.example/next?key={}>; rel="next"'),
    ("Link", '<https://gen.example/p?q="a"&key=K5>; rel=next', '<https://gen.example/p?q="a"&key={}>; rel=next'),
])
def test_a_query_sent_on_past_a_quote_or_angle_bracket_is_still_scanned(name, value, kept):
    """The URL ended at the first ``"``, ``<`` or ``>``, and the key its server reads after it was recorded."""
    assert Redactor().headers([(name, value)]) == [[name, kept.format(REDACTED)]]


def test_a_query_in_a_body_string_is_scanned_past_a_quote_too():
    text = 'see https://d.example/s?q="exact"&token=K6 and <a href="https://d.example/x?q=1">https://e.example/?key=K7</a>'
    assert Redactor().json({"text": text}) == {"text": (
        f'see https://d.example/s?q="exact"&token={REDACTED} and '
        f'<a href="https://d.example/x?q=1">https://e.example/?key={REDACTED}</a>')}


@pytest.mark.parametrize(("text", "kept"), [
    ('see https://x.example/search?q="exact"&api_key="sk-live-Q1" now', 'see https://x.example/search?q="exact"&api_key={} now'),
    ('https://maps.example/api?center="paris"&key="AIzaQ2"', 'https://maps.example/api?center="paris"&key={}'),
    ('https://x.example/v1?api_key="sk-Q3"', "https://x.example/v1?api_key={}"),  # the URL's own word
    ('<https://x.example/n?token="Q4">; rel=next', "<https://x.example/n?token={}>; rel=next"),
    ('https://x.example/?q="<b>"&key=Q5&z=1', 'https://x.example/?q="<b>"&key={}&z=1'),
    ('https://x.example/?a=1"#access_token=Q6', 'https://x.example/?a=1"#access_token={}'),
    ('https://a.example/?x=1"https://b.example/?key=Q7&z=1', 'https://a.example/?x=1"https://b.example/?key={}&z=1'),
])
def test_a_quoted_query_value_is_redacted_whole(text, kept):
    """The value ran to the next quote, so ``api_key="sk-…"`` read as an empty value, marked
    redacted, with the secret written after the mark."""
    assert Redactor().string(text) == kept.format(REDACTED)
    assert Redactor().headers([("Referer", text)]) == [["Referer", kept.format(REDACTED)]]


@pytest.mark.parametrize(("name", "text"), [
    ("X-Note", 'Tool output: {"next":"https://api.example.com/items?page=2","sort":"key=desc"}'),
    ("X-Note", '<img src="https://cdn.example.com/a.png?w=1"alt="token=not-a-secret">'),
    ("X-Note", "https://example.com/?a=b<br>key=v"),
    ("Link", '<https://x.example/a?page=2>;rel="next";key="abc"'),
])
def test_text_after_a_url_that_a_quote_or_bracket_ended_is_no_query(name, text):
    """The scan read on past the quote or bracket that ended the URL, redacting whatever came after."""
    assert Redactor().string(text) == text
    assert Redactor().headers([(name, text)]) == [[name, text]]


def test_many_urls_in_one_run_are_scanned_in_linear_time():
    """Each URL looks ahead for the parameter after its quote: a look that started again from each
    would read the rest of the run once per URL."""
    text, value = 'https://x.example/?a=1"b"' * 10_000, '?a=1"' * 20_000  # (in a header, a word with "?" may be a URL)
    started = time.monotonic()
    assert Redactor().string(text) == text
    assert Redactor().headers([("Link", value)]) == [["Link", value]]
    assert time.monotonic() - started < 2


def test_a_long_header_value_is_scanned_for_urls_in_linear_time():
    """A pattern that looked for the ``?`` itself backtracked over every start of a long word."""
    started = time.monotonic()
    assert Redactor().headers([("X-Trace", "a" * 100_000 + " ?")]) == [["X-Trace", "a" * 100_000 + " ?"]]
    assert time.monotonic() - started < 1



def test_a_url_in_a_body_string_has_its_secrets_redacted():
    """Only a field's name decided: a presigned image URL's signature, an MCP server's key in its
    URL and a link in a message went to disk as they came."""
    presigned = ("https://bkt.s3.amazonaws.com/cat.png?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=ASIA1%2Fus"
                 "&X-Amz-Security-Token=URL-SECRET-1&X-Amz-Signature=URL-SECRET-2")
    body = {"messages": [{"role": "user", "content": [
                {"type": "text", "text": "What is this? Mail me@example.test, see [the docs](https://d.example/x?key=URL-SECRET-3)."},
                {"type": "image_url", "image_url": {"url": presigned}}]}],
            "tools": [{"type": "mcp", "server_url": "https://mcp.example.com/sse?api_key=URL-SECRET-4&v=2"}]}
    redacted = Redactor().json(body)
    content = redacted["messages"][0]["content"]
    # (the value runs to the end of the word, as in a header: a secret's last characters never stay)
    assert content[0]["text"] == f"What is this? Mail me@example.test, see [the docs](https://d.example/x?key={REDACTED}"
    assert content[1]["image_url"]["url"] == (
        "https://bkt.s3.amazonaws.com/cat.png?X-Amz-Algorithm=AWS4-HMAC-SHA256"
        f"&X-Amz-Credential={REDACTED}&X-Amz-Security-Token={REDACTED}&X-Amz-Signature={REDACTED}")
    assert redacted["tools"][0]["server_url"] == f"https://mcp.example.com/sse?api_key={REDACTED}&v=2"
    # the same in a body the parser refuses (scanned), and in text that merely starts like JSON
    raw = json.dumps({"m": "\ud83d", **body}).encode()
    assert b"URL-SECRET" not in _recorded_body(raw)[1]
    assert Redactor().json("[the docs](https://d.example/x?key=URL-SECRET-5)") == f"[the docs](https://d.example/x?key={REDACTED}"
    kept = {"text": "why? see https://d.example/x?page=2#top, or ask me@example.test", "url": "https://d.example/?"}
    assert Redactor().json(kept) == kept


@pytest.mark.parametrize("text", [
    "conn = psycopg2.connect('postgresql://app:PW-1@db.internal/prod')",
    "DATABASE_URL=postgres://app:PW-1@db.internal/prod",
    "see [dashboard](https://admin:PW-1@grafana.internal/d/1)",
    "(https://admin:PW-1@grafana.internal/d/1)",
])
def test_a_url_inside_a_word_is_read_from_its_scheme(text):
    """The userinfo was looked for from the start of the word: a quote, a markdown link or an
    .env name before the scheme kept the password (a query's key was found all the same)."""
    expected = text.replace("PW-1", "").replace("app:@", f"{REDACTED}@").replace("admin:@", f"{REDACTED}@")
    assert Redactor().json({"content": text}) == {"content": expected}
    assert Redactor().headers([("X-Db", text)]) == [["X-Db", expected]]


@pytest.mark.parametrize(("url", "kept"), [
    ("https://api.example/v1?relay=https://up.example/v1?key=NEST-1", "https://api.example/v1?relay={}"),
    ("https://app.example/chat?return_to=https://up.example/x?api_key=NEST-1&lang=en", "https://app.example/chat?return_to={}&lang=en"),
    ("https://app.example/_next/image?w=640&url=https%3A%2F%2Fbkt.s3.amazonaws.com%2Fcat.png%3FX-Amz-Signature%3DNEST-1",
     "https://app.example/_next/image?w=640&url={}"),
    ("https://app.example/login?next=https://u:NEST-1@up.example/cb", "https://app.example/login?next={}"),
    # a nested URL without a secret stays as it came, a line break or tab after it too (URL parsers drop them)
    ("https://app.example/login?next=https%3A%2F%2Fup.example%2Fcb%3Fpage%3D2", "https://app.example/login?next=https%3A%2F%2Fup.example%2Fcb%3Fpage%3D2"),
    ("https://api.example/s?q=see%20https%3A%2F%2Fd.example%2Fa%3Fpage%3D2%0Athanks&n=1", "https://api.example/s?q=see%20https%3A%2F%2Fd.example%2Fa%3Fpage%3D2%0Athanks&n=1"),
])
def test_a_url_in_a_parameter_value_has_its_secrets_redacted(url, kept):
    """Only the outer parameter's name decided: a login's ``next`` or an image proxy's presigned
    ``url`` kept its key. The whole value goes, so replay matches it as any redacted value."""
    assert Redactor().url(url) == kept.format(REDACTED)
    assert Redactor().json({"image_url": {"url": url}}) == {"image_url": {"url": kept.format(REDACTED)}}


def test_urls_nested_past_the_bound_are_redacted_whole_without_recursing_on():
    deep = "x"
    for _ in range(5000):
        deep = f"https://h.example/?u={deep}"
    assert Redactor().url(deep) == f"https://h.example/?u={REDACTED}"


def test_a_url_s_scheme_is_found_in_linear_time():
    """A pattern searched for the scheme started again at each letter of a long word before a
    ``://``: 80 kB in one query value took 9 s."""
    long = "a" * 1_000_000
    started = time.monotonic()
    assert Redactor().url(f"https://h.example/?u={long}_://?x") == f"https://h.example/?u={long}_://?x"
    assert Redactor().json({"c": f"x {long}://u:p@h ="}) == {"c": f"x {long}://{REDACTED}@h ="}
    assert time.monotonic() - started < 1


def test_cut_arguments_have_their_urls_scanned_after_a_secret_member():
    """Cut tool arguments are scanned, not parsed: once a member was redacted, the URLs in the
    same text were no longer looked at."""
    arguments = '{"password": "ARG-1", "url": "https://api.example.com/v1?api_key=ARG-2'
    redacted = Redactor().json({"arguments": arguments})["arguments"]
    assert "ARG-1" not in redacted and "ARG-2" not in redacted, redacted


def test_a_form_body_with_a_flag_field_is_a_form():
    """``&remember`` (a field without a value) made the body no form without its content type."""
    from streamtap.recording.redact import looks_like_form

    body = b"grant_type=password&username=u&password=FORM-1&remember"
    assert looks_like_form(body)
    assert b"FORM-1" not in Redactor().form(body)
    assert not looks_like_form(b"remember") and not looks_like_form(b"just words = here")


def test_replay_matches_a_request_whose_body_url_was_redacted():
    """A recording's body URL holds [redacted] for its key: the live request, with the real key,
    still finds it; one with another URL does not."""
    from streamtap.replay.match import mask_like

    def body(url):
        return {"model": "m", "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}]}

    live = body("https://bkt.example/cat.png?X-Amz-Signature=LIVE-SIG&size=2")
    recorded = Redactor().json(live)
    assert "LIVE-SIG" not in json.dumps(recorded)
    assert mask_like(live, recorded) == recorded
    other = body("https://bkt.example/dog.png?X-Amz-Signature=LIVE-SIG&size=2")
    assert mask_like(other, recorded) != recorded


@pytest.mark.parametrize("make", [
    lambda secret: {"tools": [{"type": "mcp", "headers": {"Authorization": "Bearer " + secret}}]},
    lambda secret: {"extra_headers": {"X-Thing": "Bearer " + secret}},
    lambda secret: {"headers": {"Host": secret + "@h.example"}},
], ids=["mcp authorization", "auth scheme in another header", "host userinfo"])
def test_replay_matches_a_header_map_in_the_body_as_the_recorder_redacted_it(make):
    """A body's header map (an MCP tool's headers) is redacted with the header rule, which keeps
    the scheme ("Bearer [redacted]"); replay masked it with the string rule, so even the very
    request recorded got a 404. Another scheme still differs."""
    from streamtap.replay.match import mask_like

    recorded = Redactor().json(make("REC-SECRET"))
    assert "REC-SECRET" not in json.dumps(recorded)
    assert mask_like(make("REC-SECRET"), recorded) == mask_like(make("LIVE-SECRET"), recorded) == recorded


def test_replay_tells_a_header_map_with_another_scheme_from_the_recorded_one():
    from streamtap.replay.match import mask_like

    recorded = Redactor().json({"extra_headers": {"Authorization": "Bearer REC-SECRET"}})
    assert mask_like({"extra_headers": {"Authorization": "Basic LIVE"}}, recorded) != recorded


@pytest.mark.parametrize("text", [
    "[the docs](https://d.example/x?key=SECRET-1) explain it",  # looks like JSON, is none
    "{name} is at https://d.example/x?token=SECRET-1",
    '"Hi" - https://d.example/x?token=SECRET-1',
    "see [the docs](https://d.example/x?key=SECRET-1)",
])
def test_replay_matches_text_that_only_looks_like_json_with_a_redacted_url(text):
    from streamtap.replay.match import mask_like

    live = {"messages": [{"role": "user", "content": text}]}
    recorded = Redactor().json(live)
    assert "SECRET-1" not in json.dumps(recorded)
    assert mask_like(live, recorded) == recorded


def test_a_json_header_value_has_its_secret_members_redacted():
    """Portkey's x-portkey-config carries the provider's key as a member of a JSON value."""
    value = '{"provider": "openai", "api_key": "HDR-SECRET-1", "override_params": {"model": "gpt-4o"}}'
    [[_, kept]] = Redactor().headers([("x-portkey-config", value)])
    assert json.loads(kept) == {"provider": "openai", "api_key": REDACTED, "override_params": {"model": "gpt-4o"}}
    plain = '{"provider": "openai"}'
    assert Redactor().headers([("x-portkey-config", plain)]) == [["x-portkey-config", plain]]  # byte for byte


def test_body_strings_are_scanned_for_urls_in_linear_time():
    started = time.monotonic()
    long_word = "https://h/" + "a" * 200_000 + "?q=1"
    assert Redactor().json({"text": long_word, "more": "://?@#" * 50_000}) == {"text": long_word, "more": "://?@#" * 50_000}
    assert time.monotonic() - started < 1


@pytest.mark.parametrize("refused", [False, True], ids=["parsed", "scanned"])
def test_a_lone_surrogate_escape_in_redacted_arguments_stays_an_escape(tmp_path, refused):
    """Tool arguments with a password and a lone surrogate escape (half an emoji): re-written
    with the surrogate raw, the header line was no UTF-8 and the whole recording was lost
    (parsed body), or the kept body was no longer UTF-8 JSON (scanned body)."""
    arguments = '{"password":"' + PASSWORD + '","note":"\\ud83d"}'
    messages = [{"role": "assistant", "tool_calls": [{"function": {"name": "login", "arguments": arguments}}]}]
    raw = json.dumps({"model": "m", "messages": messages}).encode()
    if refused:  # a lone surrogate escape in the body itself too: orjson refuses it
        raw = raw.replace(b'"messages": [', b'"messages": [{"role": "user", "content": "\\udc00"}, ')
    from streamtap.recording.writer import RecordingWriter

    part = Redactor().request_part(request_body_fields((raw, None)))
    json.dumps(part, ensure_ascii=False).encode("utf-8")  # no lone surrogate left raw (for the writer's last resort)
    writer = RecordingWriter.create(tmp_path, started=1.7e9, provider="openai-chat", flow_id="surrogate1")
    writer.header({"request": {"method": "POST", "url": "http://x/v1/chat/completions", "headers": [],
                               **request_body_fields((raw, None))}, "response": {"status": 200, "headers": []}})
    writer.close()
    header = json.loads(writer.path.read_bytes().decode("utf-8").splitlines()[0])  # UTF-8, strictly
    request = header["request"]
    body = json.loads(base64.b64decode(request["body_b64"]).decode("utf-8")) if refused else request["body"]
    assert ("body_b64" in request) == refused
    kept = body["messages"][-1]["tool_calls"][0]["function"]["arguments"]
    assert kept == '{"password":"[redacted]","note":"\\ud83d"}'
    assert json.loads(kept)["note"] == "\ud83d"  # the value the app reads, as sent

# --- a name given to redact -----------------------------------------------------------------------


def test_a_redact_name_takes_a_schema_shaped_value_whole():
    value = {"type": "string", "description": "postgres://admin:DBPW-991@db/prod"}
    redactor = Redactor(extra=["connection_string"])
    assert redactor.json({"connection_string": value}) == {"connection_string": REDACTED}
    assert redactor.json({"connection_string": ["a", "b"]}) == {"connection_string": [REDACTED, REDACTED]}
    scanned = redactor.json_bytes(json.dumps({"connection_string": value, "zz": 1}).encode().replace(b"1}", b"1e400}"))
    assert b"DBPW-991" not in scanned and json.dumps(REDACTED).encode() in scanned
    # a pattern's name still keeps a schema, which describes a password rather than holding one
    schema = {"type": "string", "description": "the database password"}
    assert Redactor().json({"password": schema}) == {"password": schema}


# --- streamtap import -------------------------------------------------------------------------------

SSE = (b'data: {"id":"c","object":"chat.completion.chunk","model":"gpt-4o","choices":[{"index":0,'
       b'"delta":{"content":"Hi"},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n')
CHAT_BODY = b'{"model":"gpt-4o","stream":true,"messages":[]}'


def _flow(host_header: str, query_secret: str):
    from mitmproxy import http
    from mitmproxy.test import tflow

    flow = tflow.tflow(resp=True)
    request = http.Request.make("POST", f"http://127.0.0.1:8080/v1/chat/completions?key={query_secret}", CHAT_BODY,
                                [(b"content-type", b"application/json")])
    request.headers["host"] = host_header
    request.timestamp_start = request.timestamp_end = time.time()
    flow.request = request
    response = http.Response.make(200, SSE, [(b"content-type", b"text/event-stream")])
    response.timestamp_start = time.time()
    response.timestamp_end = response.timestamp_start + 0.1
    flow.response = response
    return flow


def _capture(path, *flows):
    from mitmproxy import io

    with path.open("wb") as file:
        writer = io.FlowWriter(file)
        for flow in flows:
            writer.add(flow)
    return path


def test_import_records_a_flow_whose_host_header_has_an_unbalanced_bracket(tmp_path):
    capture = _capture(tmp_path / "capture.mitm", _flow("[api.openai.com", "QSECRET-bad"), _flow("api.openai.com", "QSECRET-good"))
    out = tmp_path / "out"
    result = subprocess.run([sys.executable, "-m", "streamtap.cli", "import", str(capture), "--out", str(out)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    recordings = sorted(out.glob("*_complete_*.jsonl"))
    assert len(recordings) == 2
    urls = {json.loads(path.read_text().splitlines()[0])["request"]["url"] for path in recordings}
    assert urls == {f"http://[api.openai.com/v1/chat/completions?key={REDACTED}",
                    f"http://api.openai.com/v1/chat/completions?key={REDACTED}"}
    assert "QSECRET" not in result.stdout + result.stderr
    # and serve answers from them
    library = Library.load([out])
    assert library.find("POST", "/v1/chat/completions?key=any", {}, CHAT_BODY) is not None


def test_a_flow_that_fails_otherwise_is_skipped_in_one_line_and_the_others_are_imported(tmp_path, monkeypatch, capsys):
    """A failure that is no RecordingError (a bug met by one flow's data) skips that flow only."""
    from streamtap.cli import main
    from streamtap.recording import importer

    broken, fine = _flow("api.openai.com", "QSECRET-1"), _flow("api.openai.com", "QSECRET-2")
    capture = _capture(tmp_path / "capture.mitm", broken, fine)
    real_flow_header = importer.flow_header

    def flow_header(flow, **kw):
        if flow.id == broken.id:
            raise ValueError("something in this flow\nthat spans lines")
        return real_flow_header(flow, **kw)

    monkeypatch.setattr(importer, "flow_header", flow_header)
    out = tmp_path / "out"
    code = main(["import", str(capture), "--out", str(out), "-q"])
    printed = capsys.readouterr()
    assert code == 1, printed  # some flows skipped
    [skipped] = [line for line in printed.out.splitlines() if line.startswith("skipped")]
    assert skipped == (f"skipped {broken.id[:12]} http://api.openai.com/v1/chat/completions?key={REDACTED}: "
                       "cannot be imported: ValueError: something in this flow that spans lines")
    assert "Traceback" not in printed.out + printed.err
    flow_part = final_name(0, "-", "-", fine.id).rsplit("_", 1)[1]  # how file names spell a flow id
    assert [path.name.endswith(f"_{flow_part}") for path in out.glob("*.jsonl")] == [True]
    assert not list(out.glob("*.partial*"))


@pytest.mark.parametrize("stop", [KeyboardInterrupt, OSError])
def test_an_interrupt_or_an_output_error_still_stops_the_import(tmp_path, monkeypatch, stop):
    from streamtap.recording import importer

    def flow_header(flow, **kw):
        raise stop("stop")

    monkeypatch.setattr(importer, "flow_header", flow_header)
    capture = _capture(tmp_path / "capture.mitm", _flow("api.openai.com", "Q"))
    with pytest.raises(stop):
        list(import_capture(capture, tmp_path / "out"))


# --- streamtap serve ------------------------------------------------------------------------------


@pytest.mark.parametrize("target, status", [
    ("http://[x/v1/chat/completions", 200),  # the host plays no part in matching
    ("//[x/v1/chat/completions", 200),
    ("http://[x/v1/chat/completions?key=SECRET-SERVE", 404),  # no recording has that query
])
def test_serve_answers_a_target_whose_host_urlsplit_refuses(tmp_path, caplog, target, status):
    library = Library.load([write_recordings(tmp_path)])
    body = json.dumps(OPENAI_REQUEST).encode()
    with caplog.at_level("ERROR"), ServerThread(library, ServeOptions(Timing.parse("fast"), parse_faults(None))) as server:
        host, port = server.base_url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(f"POST {target} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                         f"content-length: {len(body)}\r\nconnection: close\r\n\r\n".encode() + body)
            data = b""
            while piece := sock.recv(65536):
                data += piece
    assert data.startswith(f"HTTP/1.1 {status} ".encode()), data[:200]
    if status == 404:
        error = json.loads(data.partition(b"\r\n\r\n")[2])["error"]
        assert error["type"] == "streamtap_no_recording"
        assert "SECRET-SERVE" not in json.dumps(error) and f"key={REDACTED}" in error["message"]
    assert "Unhandled exception" not in caplog.text and "Traceback" not in caplog.text, caplog.text


# --- a request body's own headers, wide JSON, long integers; serve's deep bodies and 400s -------

def test_the_headers_a_body_gives_for_another_request_are_redacted_as_headers():
    """An MCP tool's ``headers`` (or a client's ``extra_headers``): their names and auth-scheme
    values say what is secret as a request's own headers do."""
    headers = {"Helicone-Auth": "Bearer sk-helicone-LEAK1", "X-Vendor-Key": "LEAK2", "x-auth": "LEAK3",
               "X-Note": "Basic TEAK4", "Content-Type": "application/json", "X-Retries": 3}
    body = {"model": "m", "stream": True, "input": "hi",
            "tools": [{"type": "mcp", "server_label": "x", "server_url": "https://mcp.example/sse", "headers": headers}],
            "extra_headers": {"x-api-key": "LEAK5"}}
    how, text = _recorded_body(json.dumps(body).encode())
    kept = json.loads(text)
    assert how == "body" and not any(leak in text for leak in (b"LEAK1", b"LEAK2", b"LEAK3", b"TEAK4", b"LEAK5")), text
    assert kept["tools"][0]["headers"] == {"Helicone-Auth": f"Bearer {REDACTED}", "X-Vendor-Key": REDACTED, "x-auth": REDACTED,
                                           "X-Note": f"Basic {REDACTED}", "Content-Type": "application/json", "X-Retries": 3}


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-32-le", "utf-32-be"])
def test_json_in_utf16_or_utf32_is_redacted_in_place(encoding):
    """Python's json.loads reads such bytes (and so do apps built on it): orjson does not, so they
    are kept as bytes, with the secrets in them redacted and every other byte as it was."""
    body = {"model": "m", "stream": True, "api_key": "sk-LEAK-W1", "messages": [{"role": "user", "content": "h\u00e9 \U0001F600"}]}
    raw = json.dumps(body, ensure_ascii=False).encode(encoding)
    how, kept = _recorded_body(raw)
    assert how == "body_b64" and json.loads(kept) == {**body, "api_key": REDACTED}
    assert kept.startswith(raw[:4]) and kept.endswith(raw[-8:])  # its byte order mark and byte order stay
    without = json.dumps({k: v for k, v in body.items() if k != "api_key"}, ensure_ascii=False).encode(encoding)
    assert _recorded_body(without) == ("body_b64", without)


def test_an_integer_past_64_bits_is_kept_as_sent():
    """orjson reads it as a double, which a replay would then compare with the live integer and miss."""
    raw = b'{"model":"m","stream":true,"seed":18446744073709551616,"api_key":"sk-LEAK-I1"}'
    how, kept = _recorded_body(raw)
    assert how == "body_b64" and json.loads(kept)["seed"] == 2**64 and b"LEAK" not in kept
    assert _recorded_body(b'{"seed":18446744073709551615}') == ("body", b'{"seed": 18446744073709551615}')


def _raw_exchange(server, raw: bytes) -> bytes:
    host, port = server.base_url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(raw)
        data = b""
        while piece := sock.recv(65536):
            data += piece
    return data


def test_serve_answers_a_body_too_deep_to_mask_with_a_404_not_a_dropped_connection(tmp_path, caplog):
    """A recording of a request nested deeper than Python recurses (kept as bytes, its key redacted),
    and that request again: masking the redacted key cannot descend that far."""
    body = b'{"model": "m", "stream": true, "api_key": "sk-x", "d": ' + b"[" * 1100 + b"]" * 1100 + b"}"
    path = write_recording(tmp_path / "deep.jsonl", "openai", openai_chat_frames())
    header, rest = path.read_bytes().split(b"\n", 1)
    header = json.loads(header)
    del header["request"]["body"]
    header["request"].update(Redactor().request_part(request_body_fields((body, None))))
    assert REDACTED in base64.b64decode(header["request"]["body_b64"]).decode()
    path.write_bytes(json.dumps(header).encode() + b"\n" + rest)
    with caplog.at_level("ERROR"), ServerThread(Library.load([tmp_path]), ServeOptions(Timing.parse("fast"), parse_faults(None))) as server:
        data = _raw_exchange(server, b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                                     b"content-length: %d\r\nconnection: close\r\n\r\n" % len(body) + body)
    assert data.startswith(b"HTTP/1.1 404 "), data[:200]
    assert "RecursionError" not in caplog.text and "handler failed" not in caplog.text, caplog.text


@pytest.mark.parametrize("raw", [b"GET /v1/models?key=sk-live-SECRET1\x01 HTTP/1.1\r\nhost: x\r\n\r\n",
                                 b"POST /v1/x HTTP/1.1\r\nhost: x\r\nx-api-key : sk-live-SECRET2\r\ncontent-length: 0\r\n\r\n"],
                         ids=["request-line", "header-line"])
def test_serve_refuses_a_malformed_request_without_echoing_its_line(tmp_path, raw):
    with ServerThread(Library.load([write_recordings(tmp_path)]), ServeOptions(Timing.parse("fast"), parse_faults(None))) as server:
        data = _raw_exchange(server, raw)
    message = json.loads(data.partition(b"\r\n\r\n")[2])["error"]["message"]
    assert data.startswith(b"HTTP/1.1 400 ") and message.startswith("malformed request: illegal"), data
    assert "SECRET" not in message and "bytearray" not in message, message


def test_a_recording_made_with_streamtap_redact_names_is_matched_and_shown_with_them_outside_the_proxy(tmp_path):
    """serve and the pytest plugin did not know the names the Tap was told to redact: a request
    that a recording holds redacted under such a name did not match, and a 404 and the log showed
    the live request's value. The recording now says the names, and replay redacts with them."""
    request = {**OPENAI_REQUEST, "tenant_id": "REC-TENANT"}
    path = write_recording(tmp_path / "r.jsonl", "openai", openai_chat_frames(), request=request,
                           url="https://api.openai.com/v1/chat/completions?tenant_id=REC-TENANT", redact=("Tenant_ID",))
    header = json.loads(path.read_bytes().split(b"\n", 1)[0])
    assert header["redaction"] == {"redact": ["tenant_id"], "redact_allow": []}
    assert "REC-TENANT" not in path.read_text()
    logged: list[str] = []

    def post(target: str, tenant: str) -> bytes:
        body = json.dumps({**OPENAI_REQUEST, "tenant_id": tenant}).encode()
        return _raw_exchange(server, b"POST %s HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
                                     b"connection: close\r\n\r\n%s" % (target.encode(), len(body), body))

    library = Library.load([tmp_path])
    with ServerThread(library, ServeOptions(Timing.parse("fast"), parse_faults(None)), log=logged.append) as server:
        answered = post("/v1/chat/completions?tenant_id=LIVE-TENANT-1", "LIVE-TENANT-1")
        refused = post("/v1/embeddings?tenant_id=LIVE-TENANT-2", "LIVE-TENANT-2")
    assert answered.startswith(b"HTTP/1.1 200 "), answered[:300]
    assert refused.startswith(b"HTTP/1.1 404 "), refused[:300]
    assert b"LIVE-TENANT" not in refused and not any("LIVE-TENANT" in line for line in logged), (refused, logged)
    assert any("tenant_id=[redacted]" in line or "tenant_id=%5Bredacted%5D" in line for line in logged), logged
    plain = write_recording(tmp_path / "plain.jsonl", "openai", openai_chat_frames())
    assert "redaction" not in json.loads(plain.read_bytes().split(b"\n", 1)[0])  # the default rules: nothing said


@pytest.mark.parametrize("url, kept", [
    ("https://app.example/proxy/https://u:NESTED-1@internal.example/x", "https://app.example/proxy/https://[redacted]@internal.example/x"),
    ("http://img.example/plain/http://u:NESTED-2@x.example/i.png", "http://img.example/plain/http://[redacted]@x.example/i.png"),
    ("postgres://admin:EDGE#MARK-1@db.example/app", "postgres://[redacted]@db.example/app"),
    ("mysql://root:EDGE?MARK-2@db.example/app", "mysql://[redacted]@db.example/app"),
    ("https://x.example/@user/status", "https://x.example/@user/status"),
    ("https://host.example:8080/a?x=a@b", "https://host.example:8080/a?x=a@b"),
])
def test_userinfo_in_a_nested_url_or_past_a_mark_is_redacted(url, kept):
    """The userinfo of a URL inside another's path, and a password holding # or ?, where urlsplit
    ends the userinfo, were recorded in clear."""
    assert Redactor().url(url) == kept
    assert Redactor().json({"content": f"see {url} now"}) == {"content": f"see {kept} now"}


def test_headers_given_as_a_list_are_judged_as_headers():
    body = {"headers": [["Authorization", "Bearer LIST-1"], ["Accept", "text/plain"]],
            "extra_headers": [{"name": "X-Api-Key", "value": "LIST-2", "comment": "k"}, {"name": "Accept", "value": "x"}]}
    assert Redactor().json(body) == {
        "headers": [["Authorization", "Bearer [redacted]"], ["Accept", "text/plain"]],
        "extra_headers": [{"name": "X-Api-Key", "value": "[redacted]", "comment": "k"}, {"name": "Accept", "value": "x"}]}
