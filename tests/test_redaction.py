"""Secrets stay off disk: by name pattern, in the query string, request and response
headers, JSON bodies at any depth and form bodies, through a real mitmdump; token counts
survive; a redacted recording still answers the request with the real secret."""

from __future__ import annotations

import base64
import binascii
import gzip
import hashlib
import json
import shutil
import subprocess
import zlib
from pathlib import Path
from urllib.parse import unquote_plus

import brotli
import httpx
import orjson
import pytest
from upstream import CHAT, Mitmdump, Script, Upstream, find_recording

import provider_streams as streams
from streamtap.recording import REDACTED, read_recording
from streamtap.recording.redact import Redactor, secret_name
from streamtap.replay.faults import Timing
from streamtap.replay.match import Library, MatchOptions
from streamtap.replay.server import ServeOptions, ServerThread

try:
    from compression import zstd  # Python 3.14
except ImportError:
    from backports import zstd

# every secret is distinct and grep-able; none is a substring of another
QUERY_SECRETS = {
    "access_token": "qAccessTok3n91",
    "refresh_token": "qRefreshTok3n92",
    "client_secret": "qClientS3cret93",
    "db_password": "qDbPassw0rd94",
    "sig": "qSasSig95",
    "signature": "qSignatur396",
    "key": "qGeminiKey97",
    "X-Amz-Credential": "qAmzCred98",
}
SEMICOLON_SECRET = "qSemicolonKey99"  # a secret parameter after a ";", which some servers split at
HEADER_SECRETS = {
    "Authorization": "Bearer hAuthBearer01",
    "Ocp-Apim-Subscription-Key": "hApimKey02",
    "x-session-token": "hSessionTok03",
    "x-custom-token": "hCustomTok04",
    "x-vendor-key": "hVendorKey05",
    "x-app-secret": "hAppSecret06",
    "x-goog-api-key": "hGoogKey07",
    "Cookie": "sid=hCookieSid08",
    "x-amz-security-token": "hAmzTok09",
}
BODY_SECRETS = ["bApiKey11", "bClientSecret12", "bPassword13", "bToken14", "bNestedTok15", "bListSecret16", "bPrivKey17", "bToolArg18"]
JSON_BODY = {
    "model": "gpt-test",
    "stream": True,
    "max_tokens": 77,
    "max_completion_tokens": 78,
    "api_key": BODY_SECRETS[0],
    "messages": [
        {"role": "user", "content": "hello"},
        {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function", "function": {
            "name": "login", "arguments": json.dumps({"user": "alice", "password": BODY_SECRETS[7]})}}]},
    ],
    "metadata": {"client_secret": BODY_SECRETS[1], "deeper": [{"password": BODY_SECRETS[2]}, {"auth": {"token": BODY_SECRETS[3]}}]},
    "account": {"pin_password": 918273645},  # a number under a secret name
    "connection": {"accessToken": BODY_SECRETS[4], "secrets": [BODY_SECRETS[5]], "privateKey": BODY_SECRETS[6], "budget_tokens": 1024},
}
FORM_SECRETS = ["fPassw0rd21", "fClientSecret22", "fApiKey23", "fToken24"]
FORM_BODY = (
    f"grant_type=password&username=alice&password={FORM_SECRETS[0]}&client_secret={FORM_SECRETS[1]}"
    f"&api_key={FORM_SECRETS[2]}&token={FORM_SECRETS[3]}&max_tokens=12"
)
RESPONSE_SECRETS = {"set-cookie": "rSetCookie31=abc; Path=/; HttpOnly", "x-upstream-token": "rUpstreamTok32", "x-auth-token": "rAuthTok33"}
ALLOWED = "page_token"  # the test's allow-listed name: its value is kept
ALLOWED_VALUE = "keptPageTok41"
QUERY = (
    "&".join(f"{k}={v}" for k, v in QUERY_SECRETS.items())
    + f"&{ALLOWED}={ALLOWED_VALUE};api_key={SEMICOLON_SECRET};model=m"
)


def all_secrets() -> list[str]:
    out = list(QUERY_SECRETS.values()) + [SEMICOLON_SECRET] + BODY_SECRETS + FORM_SECRETS + ["918273645"]
    out += [value.split(" ")[-1].split("=")[-1] for value in HEADER_SECRETS.values()]
    out += ["rSetCookie31", "rUpstreamTok32", "rAuthTok33"]
    return out


def everything_written(directory: Path) -> bytes:
    """Every byte under ``directory``, plus every base64 field decoded and every string URL-decoded."""
    out = []
    for path in sorted(directory.rglob("*")):
        if not path.is_file():
            continue
        data = path.read_bytes()
        out.append(data)
        for line in data.splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            out += list(_decoded_strings(record))
    return b"\n".join(out)


def _decoded_strings(value):
    if isinstance(value, dict):
        for item in value.values():
            yield from _decoded_strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _decoded_strings(item)
    elif isinstance(value, str):
        yield unquote_plus(value).encode()
        try:
            yield base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            pass


# --- the patterns ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, where",
    [("max_tokens", "body"), ("input_tokens", "body"), ("output_tokens", "body"), ("cache_read_input_tokens", "body"),
     ("totalTokenCount", "body"), ("maxOutputTokens", "body"), ("budget_tokens", "body"), ("prompt_cache_key", "body"),
     ("key", "body"), ("keys", "body"), ("max_keys", "body"), ("key_id", "body"), ("x-ratelimit-remaining-tokens", "header"), ("anthropic-ratelimit-tokens-reset", "header"),
     ("Idempotency-Key", "header"), ("content-type", "header"), ("x-request-id", "header"), ("model", "query")],
)
def test_counts_and_ordinary_names_are_no_secrets(name, where):
    assert not secret_name(name, where)


@pytest.mark.parametrize(
    "name, where",
    [("api_keys", "body"), ("accessKeys", "body"), ("private_keys", "body"), ("AWSAccessKeyId", "query"),
     ("aws_access_key_id", "body"), ("accessKeyId", "body"), ("Signature", "query")],
)
def test_a_list_of_keys_and_an_access_key_id_are_secrets(name, where):
    """``api_keys`` (a gateway's list of keys) and the id of an AWS access key (an S3 presigned
    URL's ``AWSAccessKeyId``, whose ``X-Amz-Credential`` twin was redacted) were kept."""
    assert secret_name(name, where)


def test_a_legacy_presigned_s3_url_keeps_neither_the_key_id_nor_the_signature():
    url = "https://bkt.s3.amazonaws.com/cat.png?AWSAccessKeyId=AKIAEXAMPLE123&Expires=1780000000&Signature=sIg%2B%3D"
    assert Redactor().url(url) == f"https://bkt.s3.amazonaws.com/cat.png?AWSAccessKeyId={REDACTED}&Expires=1780000000&Signature={REDACTED}"
    assert Redactor().json({"api_keys": ["sk-1", "sk-2"], "keys": ["a"], "max_keys": 3}) == {
        "api_keys": [REDACTED, REDACTED], "keys": ["a"], "max_keys": 3}


def test_token_counts_survive_in_a_body_even_under_secret_looking_names():
    usage = {"usage": {"input_tokens": 12, "output_tokens": 34, "prompt_token": 5, "total_token_count": 46}, "max_tokens": 99}
    assert Redactor().json(usage) == usage
    assert Redactor().json({"token": "s3", "n": {"max_token": 7}}) == {"token": REDACTED, "n": {"max_token": 7}}
    # a number under any other secret name is a secret (a PIN), true/false/null are not
    assert Redactor().json({"password": 123456, "pin_secret": [1, 2], "api_key": None, "client_secret": True}) == {
        "password": REDACTED, "pin_secret": [REDACTED, REDACTED], "api_key": None, "client_secret": True}


def test_explicit_names_and_the_allow_list():
    redactor = Redactor(extra=["x-team"], allow=["x-session-token", "Page_Token"])
    assert redactor.headers([("X-Team", "t"), ("x-session-token", "kept"), ("x-other-token", "s")]) == [
        ["X-Team", REDACTED], ["x-session-token", "kept"], ["x-other-token", REDACTED]]
    assert redactor.url("https://h/p?page_token=a&access_token=b") == "https://h/p?page_token=a&access_token=[redacted]"
    assert redactor.form(b"a=1&password=x&page_token=2") == b"a=1&password=%5Bredacted%5D&page_token=2"


def test_a_query_is_redacted_in_place_at_both_separators_and_in_a_query_like_fragment():
    redactor = Redactor()
    # every byte but a secret's value as it was: the escapes, the "+" and a bare name stay
    assert redactor.url("https://h/p?q=a+b%2C;key=k1&&x=%7E;flag&Api-Key=k2#s") == (
        "https://h/p?q=a+b%2C;key=[redacted]&&x=%7E;flag&Api-Key=[redacted]#s")
    assert redactor.url("https://h/cb#state=1&access_token=k3") == "https://h/cb#state=1&access_token=[redacted]"
    assert redactor.url("https://h/p?x=1&y=2#frag") == "https://h/p?x=1&y=2#frag"
    # a ";" that starts no name=value stays in the value: a secret holding one is redacted whole
    assert redactor.url("https://h/p?api_key=AAAA;BBBB&model=m") == "https://h/p?api_key=[redacted]&model=m"


def test_a_recording_an_older_streamtap_wrote_re_encoded_still_answers_its_request():
    """Before ";" was a separator, a query holding a secret was re-encoded whole when recorded
    (";" as %3B); the matcher decodes each piece first, so such a recording still answers."""
    from streamtap.replay.source import Source

    recorded = Source.from_frames([b"data: {}\n\n"], url="http://h/v1/x?api_key=[redacted]&filter=a%3Bb&n=1")
    library = Library([recorded])
    assert library.match("POST", "/v1/x?api_key=live-secret&filter=a;b&n=1", {}, b"") is recorded
    assert library.match("POST", "/v1/x?api_key=live-secret&filter=a;c&n=1", {}, b"") is None


# --- a real mitmdump -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    if not shutil.which("curl"):
        pytest.skip("curl is not installed")
    work = tmp_path_factory.mktemp("redaction")
    body = streams.openai_chat(["secret-free ", "answer"])
    with Upstream() as upstream:
        upstream.add("json", Script(body, headers=list(RESPONSE_SECRETS.items())))
        upstream.add("form", Script(body, headers=list(RESPONSE_SECRETS.items()), encoding="gzip"))
        options = {"streamtap_redact_allow": ALLOWED}
        with Mitmdump(upstream.url, work, options=options) as proxy:
            query = QUERY
            headers = [arg for name, value in HEADER_SECRETS.items() for arg in ("-H", f"{name}: {value}")]
            common = ["curl", "-sS", "-N", "--max-time", "10", "--compressed", *headers]
            out = subprocess.run([*common, "-H", "content-type: application/json", "--data-binary", json.dumps(JSON_BODY),
                                  f"{proxy.url}/s/json{CHAT}?{query}"], capture_output=True)
            assert out.returncode == 0 and out.stdout == body, out.stderr
            out = subprocess.run([*common, "-H", "content-type: application/x-www-form-urlencoded", "--data-binary", FORM_BODY,
                                  f"{proxy.url}/s/form{CHAT}?{query}"], capture_output=True)
            assert out.returncode == 0 and out.stdout == body, out.stderr
            as_json = find_recording(proxy.record_dir, "json")
            as_form = find_recording(proxy.record_dir, "form")
            assert upstream.last("json").headers["x-session-token"] == HEADER_SECRETS["x-session-token"]  # traffic untouched
            assert upstream.last("form").body == FORM_BODY.encode()
        yield proxy.record_dir, as_json, as_form


def test_no_secret_reaches_any_byte_written(recorded):
    record_dir, _, _ = recorded
    written = everything_written(record_dir)
    assert written
    leaked = [secret for secret in all_secrets() if secret.encode() in written]
    assert not leaked, f"secrets on disk: {leaked}"
    assert ALLOWED_VALUE.encode() in written, "the allow-listed name lost its value"


def test_redacted_recordings_keep_their_structure_and_counts(recorded):
    _, as_json, as_form = recorded
    request = as_json.header["request"]
    body = request["body"]
    assert body["max_tokens"] == 77 and body["max_completion_tokens"] == 78 and body["connection"]["budget_tokens"] == 1024
    assert body["api_key"] == REDACTED and body["metadata"]["deeper"][1]["auth"]["token"] == REDACTED
    assert body["connection"]["secrets"] == [REDACTED] and body["messages"][0] == JSON_BODY["messages"][0]
    arguments = body["messages"][1]["tool_calls"][0]["function"]["arguments"]  # JSON in a string: redacted inside
    assert json.loads(arguments) == {"user": "alice", "password": REDACTED}
    headers = dict(request["headers"])
    assert headers["Authorization"] == "Bearer [redacted]" and headers["x-custom-token"] == REDACTED
    assert request["url"].endswith(f"&{ALLOWED}={ALLOWED_VALUE};api_key={REDACTED};model=m")
    response = dict(as_json.header["response"]["headers"])
    assert response["set-cookie"] == response["x-upstream-token"] == REDACTED
    form = base64.b64decode(as_form.header["request"]["body_b64"]).decode()
    assert form.startswith("grant_type=password&username=alice&password=%5Bredacted%5D&") and form.endswith("&max_tokens=12")
    assert as_json.end["verdict"]["kind"] == "complete"


def test_a_redacted_recording_answers_the_request_with_the_real_secrets(recorded):
    _, as_json, as_form = recorded
    library = Library.load([as_json.path, as_form.path])
    query = QUERY
    with ServerThread(library, ServeOptions(Timing.parse("fast"))) as server:
        url = f"{server.base_url}/s/json{CHAT}?{query}"
        assert httpx.post(url, json=JSON_BODY, timeout=10).status_code == 200
        other_secret = json.loads(json.dumps(JSON_BODY))
        other_secret["metadata"]["deeper"][0]["password"] = "another one"
        assert httpx.post(url, json=other_secret, timeout=10).status_code == 200
        other_secret["messages"][1]["tool_calls"][0]["function"]["arguments"] = json.dumps({"user": "alice", "password": "x"})
        assert httpx.post(url, json=other_secret, timeout=10).status_code == 200
        other_secret["messages"][1]["tool_calls"][0]["function"]["arguments"] = json.dumps({"user": "bob", "password": "x"})
        assert httpx.post(url, json=other_secret, timeout=10).status_code == 404
        changed = JSON_BODY | {"max_tokens": 5}
        assert httpx.post(url, json=changed, timeout=10).status_code == 404  # what is not redacted still counts
        form_url = f"{server.base_url}/s/form{CHAT}?{query}"
        form_headers = {"content-type": "application/x-www-form-urlencoded"}
        assert httpx.post(form_url, content=FORM_BODY, headers=form_headers, timeout=10).status_code == 200
        assert httpx.post(form_url, content=FORM_BODY.replace("alice", "bob"), headers=form_headers, timeout=10).status_code == 404
        other_query = url.replace("model=m", "model=n")
        assert httpx.post(other_query, json=JSON_BODY, timeout=10).status_code == 404


def test_a_matched_header_recorded_redacted_matches_the_real_secret_and_a_404_names_only_what_differs(recorded):
    """--match-header authorization on a recording that holds it as `Bearer [redacted]`: the
    request with the real key matches (the recorder's rule gives the recorded value), another
    scheme does not; and a 404 names only the fields that differ, not those the recording
    holds redacted (its query key, its body secrets, the header)."""
    _, as_json, _ = recorded
    library = Library.load([as_json.path], MatchOptions(match_headers=("authorization",)))
    url = f"/s/json{CHAT}?{QUERY}"
    bearer = {"authorization": HEADER_SECRETS["Authorization"]}
    assert library.has_match("POST", url, bearer, json.dumps(JSON_BODY).encode())
    assert library.has_match("POST", url, {"authorization": "Bearer another-key"}, json.dumps(JSON_BODY).encode())
    assert not library.has_match("POST", url, {"authorization": "Basic another-key"}, json.dumps(JSON_BODY).encode())
    changed = json.loads(json.dumps(JSON_BODY))
    changed["messages"][0] = {"role": "user", "content": "another question"}
    changed["metadata"]["deeper"][0]["password"] = "another one"
    explained = library.explain("POST", url, bearer, json.dumps(changed).encode())
    assert explained["error"]["nearest"][0]["differs_in"] == ["body.messages"], explained["error"]["nearest"]


def test_streamtap_import_redacts_alike_and_takes_an_allow_list(tmp_path):
    if not shutil.which("curl"):
        pytest.skip("curl is not installed")
    body = streams.openai_chat(["imported"])
    capture = tmp_path / "capture.mitm"
    with Upstream() as upstream:
        upstream.add("json", Script(body, headers=list(RESPONSE_SECRETS.items())))
        with Mitmdump(upstream.url, tmp_path / "m", script=None, options={"save_stream_file": str(capture)}) as proxy:
            query = "&".join(f"{k}={v}" for k, v in QUERY_SECRETS.items()) + f"&{ALLOWED}={ALLOWED_VALUE}"
            headers = [arg for name, value in HEADER_SECRETS.items() for arg in ("-H", f"{name}: {value}")]
            out = subprocess.run(["curl", "-sS", "--max-time", "10", *headers, "-H", "content-type: application/json",
                                  "--data-binary", json.dumps(JSON_BODY), f"{proxy.url}/s/json{CHAT}?{query}"], capture_output=True)
            assert out.returncode == 0 and out.stdout == body, out.stderr
    streamtap = Path(__file__).resolve().parents[1] / ".venv" / "bin" / "streamtap"
    result = subprocess.run([str(streamtap), "import", str(capture), "--out", str(tmp_path / "out"), "--redact-allow", ALLOWED, "-q"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode in (0, 1), result.stderr
    [path] = (tmp_path / "out").glob("*.jsonl")
    written = everything_written(tmp_path / "out")
    leaked = [secret for secret in all_secrets() if secret not in FORM_SECRETS and secret.encode() in written]
    assert not leaked, f"secrets on disk: {leaked}"
    assert ALLOWED_VALUE.encode() in written
    assert read_recording(path).header["request"]["body"]["max_tokens"] == 77
    again = subprocess.run([str(streamtap), "import", str(capture), "--out", str(tmp_path / "out")],
                           capture_output=True, text=True, timeout=60)  # "already imported (URL)"
    assert "already imported" in again.stdout, again.stdout
    assert not [s for s in QUERY_SECRETS.values() if s in again.stdout + again.stderr], again.stdout


def test_a_replay_404_and_the_replay_log_keep_the_requests_credentials_out(recorded):
    """The 404 names what was looked for; inside mitmproxy the Tap records that answer, and the
    server logs every request: neither may carry the live request's ?key= or a matched header."""
    _, as_json, _ = recorded
    library = Library.load([as_json.path], MatchOptions(match_headers=("authorization",)))
    lines: list[str] = []
    query = "&".join(f"{k}={v}" for k, v in QUERY_SECRETS.items())
    with ServerThread(library, ServeOptions(Timing.parse("fast")), log=lines.append) as server:
        answer = httpx.post(f"{server.base_url}/nowhere{CHAT}?{query}", json={"model": "x"},
                            headers={"authorization": "Bearer hAuth404Secret77"}, timeout=10)
    assert answer.status_code == 404
    shown = answer.text + "\n".join(lines)
    leaked = [s for s in [*QUERY_SECRETS.values(), "hAuth404Secret77"] if s in shown]
    assert not leaked, f"in the 404 or the log: {leaked}\n{shown}"
    assert "access_token=%5Bredacted%5D" in answer.text or "access_token=[redacted]" in answer.text, answer.text


def test_a_replay_404_keeps_a_secret_behind_an_escaped_question_mark_and_the_taps_own_names_out():
    lines: list[str] = []
    library = Library([], MatchOptions(redact=("my_org_pin",)))
    with ServerThread(library, ServeOptions(Timing.parse("fast")), log=lines.append) as server:
        answer = httpx.post(f"{server.base_url}/v1/chat%3Fx?key=qEscaped81&my_org_pin=qOwnName82", json={}, timeout=10)
    assert answer.status_code == 404
    shown = answer.text + "\n".join(lines)
    assert "qEscaped81" not in shown and "qOwnName82" not in shown, shown
    assert "/v1/chat%3Fx?" in answer.text, answer.text  # the path as sent: its query is the request's


def test_values_under_secret_names_are_redacted_whatever_their_shape():
    redactor = Redactor(extra=["metadata", "pin"])
    body = {
        "credentials": {"value": "s1"},  # an object under a secret name: whole
        "api_key": [["s2"], {"k": "s3"}],  # lists of lists and objects
        "tools": [{"parameters": {"properties": {"password": {"type": "string", "description": "the user's"}}}}],
        "arguments": ' {"password": "s4"}',  # JSON in a string, after a space
        "metadata": {"user_id": "s5"},  # a name given to redact: its object
        "pin": 4321,  # ... its number
        "max_tokens": 9,
    }
    redacted = redactor.json(body)
    assert redacted["credentials"] == REDACTED and redacted["api_key"] == [[REDACTED], REDACTED]
    assert redacted["tools"] == body["tools"]  # a JSON Schema fragment describes a password, it holds none
    assert "s4" not in redacted["arguments"] and redacted["metadata"] == REDACTED and redacted["pin"] == REDACTED
    assert redacted["max_tokens"] == 9


@pytest.mark.parametrize("raw, secret", [
    (b'{"api_key": "bSecret1", "emoji": "\\ud83d"}', b"bSecret1"),  # a lone surrogate escape: orjson refuses it
    (b'{"password": "bSecret2", "n": 1e400}', b"bSecret2"),  # a number past a double
    (b"[" * 1100 + b'{"client_secret": "bSecret3"}' + b"]" * 1100, b"bSecret3"),  # deeper than orjson goes
    (b'\xef\xbb\xbf{"api_key": "bSecret4"}', b"bSecret4"),  # a byte order mark
    # a string that begins with ":" once made the scan read a member's name as a value, and skip the next member
    (b'\xef\xbb\xbf{"stop": [":"], "api_key": "bSecret5"}', b"bSecret5"),
    (b'{"n": 1e400, "stop": ["\\n", ":"], "api_key": "bSecret6"}', b"bSecret6"),
    (b'{"n": 1e400, "tools": {"api_key": {"type": "string", "default": "bSecret7"}}}', b"bSecret7"),  # a schema's value
], ids=["surrogate", "huge-number", "deep", "bom", "colon-string-bom", "colon-string-number", "schema-default"])
def test_json_the_parser_refuses_is_still_redacted_in_the_kept_bytes(raw, secret):
    from streamtap.recording.header import request_body_fields

    part = Redactor().request_part({"headers": [["content-type", "application/json"]], **request_body_fields((raw, None))})
    kept = base64.b64decode(part["body_b64"])
    assert secret not in kept
    assert kept.replace(b'"[redacted]"', b'"' + secret + b'"') == raw  # every other byte as it was


CODINGS = {"gzip": gzip.compress, "deflate": zlib.compress, "br": brotli.compress, "zstd": zstd.compress,
           "gzip, br": lambda data: brotli.compress(gzip.compress(data))}
COMPRESSED_SECRET = b'"api_key": "cSecret1"'
REFUSED_WHEN_COMPRESSED = {  # JSON orjson refuses and an app's parser may take, each a way a client sends it
    "gzip-surrogate": ("gzip", b'{"messages": [{"content": "\\ud83d"}], ' + COMPRESSED_SECRET + b"}"),
    "gzip-huge-number": ("gzip", b'{"temperature": 1e400, ' + COMPRESSED_SECRET + b"}"),
    "gzip-bom": ("gzip", b"\xef\xbb\xbf{" + COMPRESSED_SECRET + b"}"),
    "deflate-nan": ("deflate", b'{"x": NaN, ' + COMPRESSED_SECRET + b"}"),
    "br-deep": ("br", b'{"x": ' + b"[" * 1100 + b"]" * 1100 + b", " + COMPRESSED_SECRET + b"}"),
    "zstd-surrogate": ("zstd", b'{"x": "\\udc00", ' + COMPRESSED_SECRET + b"}"),
    "stacked-surrogate": ("gzip, br", b'{"x": "\\ud83d", ' + COMPRESSED_SECRET + b"}"),
}


@pytest.mark.parametrize("coding, raw", REFUSED_WHEN_COMPRESSED.values(), ids=REFUSED_WHEN_COMPRESSED.keys())
def test_compressed_json_the_parser_refuses_is_kept_decoded_and_redacted(coding, raw):
    """Kept as the compressed bytes as sent, the body's secret members were never seen by the scan."""
    from streamtap.recording.header import request_body_fields

    with pytest.raises(ValueError):
        orjson.loads(raw)  # the case: the parser refuses it
    fields = request_body_fields((CODINGS[coding](raw), coding))
    assert fields["body_decoded_from"] == coding
    part = Redactor().request_part({"headers": [["content-type", "application/json"], ["content-encoding", coding]], **fields})
    kept = base64.b64decode(part["body_b64"])
    assert b"cSecret1" not in kept
    assert kept.replace(b'"[redacted]"', b'"cSecret1"') == raw  # decoded, every other byte as it was


def test_json_under_stacked_codings_is_parsed_and_redacted():
    from streamtap.recording.header import request_body_fields

    raw = b'{"model": "m", ' + COMPRESSED_SECRET + b"}"
    fields = request_body_fields((CODINGS["gzip, br"](raw), "gzip, br"))
    assert Redactor().request_part(fields) == {"body": {"model": "m", "api_key": REDACTED}}


@pytest.mark.parametrize("coding, raw", [
    ("gzip", b"not gzip at all: " + COMPRESSED_SECRET),  # damaged
    ("compress", b"\x1f\x9d" + COMPRESSED_SECRET),  # a coding streamtap cannot undo
    ("gzip, gzip, gzip, gzip, gzip", b"{" + COMPRESSED_SECRET + b"}"),  # more codings than it undoes
], ids=["damaged", "unknown", "too-many"])
def test_a_compressed_body_that_cannot_be_decoded_is_kept_as_its_length_and_hash(coding, raw):
    """Its secrets may be in there, unseen: the bytes as sent are never kept."""
    from streamtap.recording.header import request_body_fields

    if coding.startswith("gzip,"):
        for _ in range(5):
            raw = gzip.compress(raw)
    fields = request_body_fields((raw, coding))
    assert list(fields) == ["body_omitted"]
    assert fields["body_omitted"]["bytes"] == len(raw)
    assert fields["body_omitted"]["sha256"] == hashlib.sha256(raw).hexdigest()
    assert f"{coding} content-encoding could not be undone" in fields["body_omitted"]["reason"]


@pytest.mark.parametrize("content_type", ["application/json", "application/x-www-form-urlencoded"])
def test_tool_arguments_in_json_the_parser_refuses_are_redacted_inside(content_type):
    """A lone surrogate anywhere in a chat history (half an emoji from a JS slice) sends the body
    to the byte scan, which must still open the JSON a string carries; `curl -d` labels JSON a form."""
    from streamtap.recording.header import request_body_fields

    arguments = json.dumps(json.dumps({"password": "bArgs1", "city": "Paris"}))
    raw = (b'{"messages": [{"role": "user", "content": "\\ud83d"}, {"role": "assistant", "tool_calls": [{"function": '
           b'{"name": "login", "arguments": ' + arguments.encode() + b'}}]}], "api_key": "bKey2"}')
    with pytest.raises(ValueError):
        orjson.loads(raw)  # the case: the parser refuses it
    part = Redactor().request_part({"headers": [["content-type", content_type]], **request_body_fields((raw, None))})
    kept = base64.b64decode(part["body_b64"])
    assert b"bArgs1" not in kept and b"bKey2" not in kept, kept
    assert b"Paris" in kept and b"\\ud83d" in kept  # everything else kept


@pytest.mark.parametrize("arguments", ['{"password": "bCut3", "user": "b', '{"password": "bJunk4"}}'])
def test_tool_arguments_that_are_not_json_are_still_redacted(arguments):
    """A call cut mid-arguments, sent back in the history: the scan finds the secret member."""
    redacted = Redactor().json({"tool_calls": [{"function": {"arguments": arguments}}]})
    kept = redacted["tool_calls"][0]["function"]["arguments"]
    assert "bCut3" not in kept and "bJunk4" not in kept and kept.startswith('{"password": "[redacted]"'), kept


def test_an_object_under_a_secret_name_is_a_schema_only_when_its_keywords_hold_schemas():
    redactor = Redactor()
    for value in ({"items": ["sCred1", "sCred2"]}, {"properties": {"user": "bob", "pw": "sCred3"}},
                  {"anyOf": [{"user": "bob", "pass": "sCred4"}]}, {"not": "sCred5"}):
        assert redactor.json({"credentials": value}) == {"credentials": REDACTED}, value
    schema = {"type": "object", "properties": {"user": {"type": "string"}, "pw": {"type": "string"}, "any": {}},
              "items": [{"type": "string"}], "anyOf": [{"required": ["user"]}], "additionalProperties": False}
    assert redactor.json({"credentials": schema}) == {"credentials": schema}  # a schema describes, it holds none


def test_json_the_parser_refuses_keeps_no_object_or_list_under_a_secret_name():
    raw = (b'\xef\xbb\xbf{"credentials": {"id": "x", "key": "bObj1"}, "password": ["bList2", 5], "refresh_token": 3600,'
           b' "secret": ' + b"[" * 3000 + b'"bDeep3"' + b"]" * 3000 + b', "note": "kept"}')
    kept = Redactor().json_bytes(raw)
    assert not [s for s in (b"bObj1", b"bList2", b"bDeep3") if s in kept], kept[:300]
    assert b'"refresh_token": 3600' in kept and b'"note": "kept"' in kept and kept.startswith(b"\xef\xbb\xbf{")
    assert json.loads(kept.decode("utf-8-sig"))["password"] == [REDACTED, REDACTED]  # item by item, as for parsed JSON


def test_a_schema_under_a_secret_name_keeps_its_shape_but_not_the_values_it_carries():
    schema = {"type": "string", "description": "the key", "default": "sDefault1", "enum": ["sEnum2"], "const": "sConst3",
              "examples": ["sExample4"]}
    redacted = Redactor().json({"tools": {"api_key": schema, "refresh_token": {"type": "integer", "default": 3600}}})
    assert redacted["tools"]["api_key"] == {**schema, "default": REDACTED, "enum": [REDACTED], "const": REDACTED, "examples": [REDACTED]}
    assert redacted["tools"]["refresh_token"]["default"] == 3600  # a count under a ...token name stays


def test_json_in_a_string_nested_past_what_python_reads_is_still_redacted():
    deep = "[" * 5000 + '{"api_key": "sDeep5"}' + "]" * 5000
    assert "sDeep5" not in Redactor().json({"arguments": deep})["arguments"]
    too_deep = json.loads("[" * 1020 + '{"api_key": "sDeep6"}' + "]" * 1020)  # orjson reads it; Redactor.json cannot recurse so far
    part = Redactor().request_part({"body": too_deep})
    assert "sDeep6" not in json.dumps(part["body"])


def test_a_form_field_after_a_semicolon_is_split_as_a_query_parameter_is():
    form = Redactor().form(b"grant_type=pw;password=fSemi25&x=1;a&note=\xff")
    assert form == b"grant_type=pw;password=%5Bredacted%5D&x=1;a&note=\xff"  # every other byte as it was


def test_credentials_under_other_header_names_and_in_the_userinfo():
    redactor = Redactor()
    got = dict(map(tuple, redactor.headers([
        ("Helicone-Auth", "Bearer hHelicone1"), ("x-auth", "hXAuth2"), ("Authentication", "hAuthn3"), ("x-api-key-2", "hKey4"),
        ("Cookies", "hCookies5"), ("X-Forwarded-Auth", "Basic aEJhc2lj"), ("Host", "hUserTok6:@api.openai.com"),
        ("x-note", "Basically fine"), ("x-request-id", "req-7"),
    ])))
    assert got == {
        "Helicone-Auth": "Bearer [redacted]", "x-auth": REDACTED, "Authentication": REDACTED, "x-api-key-2": REDACTED,
        "Cookies": REDACTED, "X-Forwarded-Auth": "Basic [redacted]", "Host": "[redacted]@api.openai.com",
        "x-note": "Basically fine", "x-request-id": "req-7",
    }
    assert Redactor(allow=["helicone-auth"]).headers([("Helicone-Auth", "Bearer kept")]) == [["Helicone-Auth", "Bearer kept"]]
    assert redactor.url("https://uTok7:@h.example/v1?x=1") == "https://[redacted]@h.example/v1?x=1"
    assert redactor.url("https://uTok8:x-oauth-basic@h.example/") == "https://[redacted]@h.example/"
