"""Two ways a secret once reached a recording: a tool call's arguments cut inside a secret
member's value (what was sent of a secret is one), and an object under a secret name whose keys
are JSON Schema keywords but whose values are no schema's (``{"type": "sk-live-…"}``). Real
schemas under secret property names stay as they were."""

from __future__ import annotations

import base64
import json

import httpx
import pytest
from test_redaction import everything_written
from upstream import CHAT, Mitmdump, Script, Upstream, find_recording

import provider_streams as streams
from streamtap.recording import REDACTED
from streamtap.recording.redact import Redactor

# a tool's parameters as pydantic writes them: secret-named properties, a $ref, a count, a null default
LOGIN_SCHEMA = {
    "$defs": {"Credentials": {"properties": {
        "user": {"title": "User", "type": "string"},
        "password": {"description": "the password", "format": "password", "minLength": 8, "title": "Password",
                     "type": "string", "writeOnly": True}},
        "required": ["user", "password"], "title": "Credentials", "type": "object"}},
    "properties": {
        "credentials": {"$ref": "#/$defs/Credentials"},
        "api_key": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None, "title": "Api Key"},
        "session_token": {"default": [], "items": {"type": "string"}, "title": "Session Token", "type": "array"}},
    "required": ["credentials"], "title": "Login", "type": "object",
}
# the same as Gemini's clients may write it: upper-case types, an int64 as a string
GEMINI_SCHEMA = {"type": "OBJECT", "properties": {"password": {"type": "STRING", "minLength": "8", "nullable": False}},
                 "required": ["password"]}
# older drafts: a property required with true, exclusiveMinimum true
DRAFT_3_4_SCHEMA = {"type": "object", "properties": {
    "pin_password": {"type": ["integer", "null"], "required": True, "minimum": 0, "exclusiveMinimum": True}}}


# --- arguments cut inside a secret's value -----------------------------------------------------


@pytest.mark.parametrize("arguments, secret, name_end", [
    ('{"user":"bob","password":"cCutValue1', "cCutValue1", '"password":'),
    ('{"api_key": "cCutValue2', "cCutValue2", '"api_key": '),
    ('{"password": "cCut\\"Value3', "Value3", '"password": '),  # cut after an escaped quote
    ('{"password": "cCutValue4\\', "cCutValue4", '"password": '),  # cut inside an escape
    ('{"credentials": {"user": "bob", "pw": "cCutValue5', "cCutValue5", '"credentials": '),  # in an object under the name
    ('{"secrets": ["cCutValue6", "cCutVal', "cCutValue6", '"secrets": '),  # inside a list under the name
    ('{"password": {"type": "string", "default": "cCutValue7', "cCutValue7", '"password": '),  # inside a schema
], ids=["after-a-member", "after-the-name", "escaped-quote", "in-an-escape", "object", "list", "schema"])
def test_arguments_cut_inside_a_secrets_value_are_redacted_to_their_end(arguments, secret, name_end):
    """What was sent of a secret is one: from the value's start to the end of the text, written
    as a member the scan redacts always is (the name, then ``"[redacted]"``)."""
    body = {"tool_calls": [{"function": {"name": "login", "arguments": arguments}}]}
    kept = Redactor().json(body)["tool_calls"][0]["function"]["arguments"]
    assert secret not in kept, kept
    assert kept == arguments[: arguments.index(name_end) + len(name_end)] + '"[redacted]"'


@pytest.mark.parametrize("arguments", ['{"user":"bob","city":"Par', '{"api_key": ', '{"user": "bob", "api_key":'])
def test_arguments_cut_anywhere_else_are_kept_as_they_were(arguments):
    assert Redactor().json({"arguments": arguments}) == {"arguments": arguments}


def test_a_body_the_parser_refuses_cut_inside_a_secrets_value_is_redacted_to_its_end():
    raw = b'\xef\xbb\xbf{"x": 1, "password": "cCutBody8'
    part = Redactor().request_part({"headers": [["content-type", "application/json"]],
                                    "body_b64": base64.b64encode(raw).decode()})
    assert base64.b64decode(part["body_b64"]) == b'\xef\xbb\xbf{"x": 1, "password": "[redacted]"'


# --- schema keywords holding what no such keyword holds --------------------------------------


@pytest.mark.parametrize("name, value", [
    ("credentials", {"type": "sKeyword1"}),
    ("credentials", {"type": ["string", "sKeyword2"]}),
    ("password", {"minLength": "sKeyword3"}),
    ("password", {"type": "string", "maxLength": "sKeyword4"}),  # beside a real type
    ("api_key", {"required": "sKeyword5"}),
    ("api_key", {"required": ["user", 5], "type": "object", "default": "sKeyword6"}),
    ("client_secret", {"nullable": "sKeyword7"}),
    ("client_secret", {"type": "string", "uniqueItems": "sKeyword8"}),
    ("password", {"minimum": "sKeyword9"}),
    ("password", {"enum": "sKeyword10"}),
    ("access_token", {"$ref": "sKeyword11"}),
    ("access_token", {"title": "sKeyword12"}),  # text alone describes no kind of value
    ("access_token", {"description": "sKeyword13", "format": "password"}),
    ("credentials", {"type": "object", "properties": {"user": {"type": "sKeyword14"}}}),  # in a subschema
], ids=["type", "type-list", "minLength", "maxLength", "required", "required-list", "nullable", "uniqueItems", "minimum",
        "enum", "$ref", "title-alone", "text-alone", "subschema-type"])
def test_schema_keywords_holding_no_schema_values_are_redacted_whole(name, value):
    secret = next(word for word in json.dumps(value).replace('"', " ").split() if word.startswith("sKeyword"))
    redacted = Redactor().json({"tools": {name: value}})
    assert redacted == {"tools": {name: REDACTED}}
    raw = b"\xef\xbb\xbf" + json.dumps({"tools": {name: value}, "note": "kept"}).encode()  # the byte scan alike
    kept = Redactor().json_bytes(raw)
    assert secret.encode() not in kept and b'"note": "kept"' in kept, kept


@pytest.mark.parametrize("schema", [LOGIN_SCHEMA, GEMINI_SCHEMA, DRAFT_3_4_SCHEMA], ids=["pydantic", "gemini", "drafts-3-4"])
def test_real_schemas_with_secret_property_names_are_kept_as_they_are(schema):
    body = {"tools": [{"type": "function", "function": {"name": "login", "parameters": schema}}]}
    assert Redactor().json(body) == body
    assert Redactor().json({"credentials": schema}) == {"credentials": schema}  # under a secret name itself too
    raw = b"\xef\xbb\xbf" + json.dumps(body).encode()
    assert Redactor().json_bytes(raw) == raw


# --- through a real mitmdump -------------------------------------------------------------------


def test_a_live_recording_keeps_neither_a_cut_secret_nor_one_in_schema_keywords(tmp_path):
    cut = '{"user":"bob","password":"lCutLive1'
    body = {
        "model": "gpt-test", "stream": True,
        "messages": [{"role": "user", "content": "log me in"}, {"role": "assistant", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "login", "arguments": cut}}]}],
        "tools": [{"type": "function", "function": {"name": "login", "parameters": LOGIN_SCHEMA}}],
        "credentials": {"type": "lTypeLive2"}, "password": {"minLength": "lMinLive3"},
        "api_key": {"required": "lRequiredLive4"}, "client_secret": {"nullable": "lNullableLive5"},
    }
    answer = streams.openai_chat(["done"])
    with Upstream() as upstream:
        upstream.add("cut", Script(answer))
        with Mitmdump(upstream.url, tmp_path) as proxy:
            response = httpx.post(f"{proxy.url}/s/cut{CHAT}", json=body, timeout=20)
            assert response.status_code == 200 and response.content == answer
            recording = find_recording(proxy.record_dir, "cut")
        assert json.loads(upstream.last("cut").body) == body  # the traffic itself untouched
    written = everything_written(proxy.record_dir)
    leaked = [s for s in ("lCutLive1", "lTypeLive2", "lMinLive3", "lRequiredLive4", "lNullableLive5") if s.encode() in written]
    assert not leaked, f"secrets on disk: {leaked}"
    recorded = recording.header["request"]["body"]
    assert recorded["messages"][1]["tool_calls"][0]["function"]["arguments"] == '{"user":"bob","password":"[redacted]"'
    assert recorded["tools"] == body["tools"]  # the schema describes a password, it holds none
    assert [recorded[name] for name in ("credentials", "password", "api_key", "client_secret")] == [REDACTED] * 4
    assert recording.end["verdict"]["kind"] == "complete"
    # replay still answers the request the recording was made of: its cut secret is masked alike
    from streamtap.replay.match import Library

    library = Library.load([recording.path])
    assert library.has_match("POST", f"/s/cut{CHAT}", {}, json.dumps(body).encode())


TWICE = json.dumps(json.dumps({"api_key": "sk-live-TWICE", "path": "a.txt"}))


@pytest.mark.parametrize("arguments", [TWICE, TWICE[: TWICE.index("TWICE") + 2], TWICE[: TWICE.index("TWICE")] + "\\\\"],
                         ids=["whole", "cut in the value", "cut in an escape"])
def test_arguments_encoded_twice_are_redacted_inside(arguments):
    """Some models and compatible servers send arguments back as a JSON string holding the JSON."""
    out = Redactor().json({"arguments": arguments})["arguments"]
    assert "sk-live" not in out and REDACTED in out, out
    assert "a.txt" in out or "path" not in arguments
    for quoted in ('"Hello" she said', '"hi"', json.dumps(json.dumps({"path": "a.txt"}))):  # nothing to redact: as it was
        assert Redactor().json({"arguments": quoted})["arguments"] == quoted


@pytest.mark.parametrize("value", [
    {"anyOf": [{"const": "sk-live-1"}, {"type": "null"}]}, {"oneOf": [{"enum": ["sk-live-2"]}]},
    {"type": "string", "not": {"const": "sk-live-3"}}, {"type": "array", "items": {"type": "string", "default": "sk-live-4"}},
])
def test_values_in_the_subschemas_of_a_schema_under_a_secret_name_are_the_secrets(value):
    assert "sk-live" not in json.dumps(Redactor().json({"api_key": value}))


@pytest.mark.parametrize("schema", [
    {"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}]},
    {"type": "object", "minProperties": 1, "patternProperties": {"^k": {"type": "string"}}},
    {"oneOf": [{"$ref": "#/$defs/A"}], "discriminator": {"propertyName": "kind", "mapping": {"a": "#/$defs/A"}}},
    {"type": "OBJECT", "properties": {"user": {"type": "STRING", "example": "bob"}}, "propertyOrdering": ["user"]},
    {"type": "string", "contentMediaType": "application/json", "contentSchema": {"type": "object"}},
])
def test_schemas_with_the_standard_keywords_pydantic_and_gemini_write_are_kept(schema):
    """A property schema with a keyword the list lacked was replaced whole under a secret name."""
    assert Redactor().json({"properties": {"credentials": schema}})["properties"]["credentials"] == schema


def test_replay_masks_cut_arguments_with_the_recordings_own_names_and_deep_bodies_answer():
    from streamtap.replay.match import mask_like, normalize_body

    recorded = Redactor(["card_number"]).json({"arguments": ' {"card_number":"4111-CUT'})["arguments"]
    assert recorded == ' {"card_number":"[redacted]"'
    live = {"arguments": ' {"card_number":"4111-CUT'}
    assert mask_like(live, {"arguments": recorded}, Redactor(["card_number"])) == {"arguments": recorded}
    deep = b'{"x":' + b"[" * 5000 + b"]" * 5000 + b"}"
    assert isinstance(normalize_body(deep), str)  # compared as text, not a RecursionError
