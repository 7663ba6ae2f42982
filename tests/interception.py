"""Helpers for the interception tests: certificate authorities, a TLS fake provider,
a mitmdump runner and a stand-alone SDK client.

The fake provider and the client also run as scripts (``python tests/interception.py
serve|openai ...``) so the network-namespace test can start them inside the hosts it
builds. Everything here is test tooling; the product never imports it.
"""

from __future__ import annotations

import argparse
import base64
import datetime
import hashlib
import ipaddress
import json
import re
import shutil
import socket
import ssl
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PYTHON = REPO / ".venv" / "bin" / "python"
MITMDUMP = REPO / ".venv" / "bin" / "mitmdump"
TAP = REPO / "addon" / "tap.py"

needs_curl = pytest.mark.skipif(
    not shutil.which("curl"), reason="curl is not installed (scripts/system-deps.sh installs it as root)"
)


# --- certs_howto.md: the blocks marked `<!-- test: NAME -->` --------------------------------

HOWTO = REPO / "certs_howto.md"


def howto_blocks() -> dict[str, str]:
    return dict(re.findall(r"<!-- test: (\S+) -->\n```sh\n(.*?)```", HOWTO.read_text(), re.S))


def howto_block(name: str) -> str:
    blocks = howto_blocks()
    assert name in blocks, f"certs_howto.md lost its tested block {name!r}"
    return blocks[name]


def howto_commands(name: str) -> list[str]:
    """A block's commands, one per entry, continuation lines joined."""
    return [c.strip() for c in howto_block(name).replace("\\\n", " ").splitlines() if c.strip()]


# --- certificates -----------------------------------------------------------------


def make_ca(directory: Path, name: str) -> tuple[Path, Path]:
    """A self-signed CA for a fake provider: (cert.pem, key.pem)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                key_encipherment=False, data_encipherment=False, key_agreement=False,
                encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / f"{name}-ca.pem", directory / f"{name}-ca-key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return cert_path, key_path


def issue_cert(ca: tuple[Path, Path], names: list[str], directory: Path) -> Path:
    """A server certificate for ``names`` (DNS names or IP addresses); one PEM with key and cert."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    ca_cert = x509.load_pem_x509_certificate(ca[0].read_bytes())
    ca_key = serialization.load_pem_private_key(ca[1].read_bytes(), password=None)
    key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = []
    for name in names:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            sans.append(x509.DNSName(name))
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=30))
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_cert.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    path = directory / f"{names[0]}-server.pem"
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        + cert.public_bytes(serialization.Encoding.PEM)
    )
    return path


# --- a stream body an OpenAI-compatible client accepts ----------------------------------


def openai_chat_stream(words: list[str], model: str = "gpt-test-1") -> bytes:
    """An OpenAI chat-completions SSE body: role, one delta per word, finish_reason stop, [DONE]."""

    def chunk(delta: dict, finish: str | None) -> bytes:
        event = {
            "id": "chatcmpl-interception",
            "object": "chat.completion.chunk",
            "created": 1700000000,
            "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }
        return b"data: " + json.dumps(event, separators=(",", ":")).encode() + b"\n\n"

    parts = [chunk({"role": "assistant", "content": ""}, None)]
    parts += [chunk({"content": word}, None) for word in words]
    parts.append(chunk({}, "stop"))
    parts.append(b"data: [DONE]\n\n")
    return b"".join(parts)


def invoke_body() -> bytes:
    """A real Bedrock InvokeModel capture from ../shared, or one built the same way."""
    from conftest import FIXTURES

    real = FIXTURES / "openllmetry" / "bodies" / "invoke_stream_anthropic_claude3.0.bin"
    if real.exists():
        return real.read_bytes()
    from streamtap.wire import encode_message

    events = [
        {"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant",
                                              "model": "claude-3-haiku", "content": [], "usage": {"input_tokens": 3, "output_tokens": 1}}},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hello"}},
        {"type": "content_block_stop", "index": 0},
        {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 2}},
        {"type": "message_stop"},
    ]
    headers = {":event-type": "chunk", ":content-type": "application/json", ":message-type": "event"}
    return b"".join(
        encode_message(headers, json.dumps({"bytes": base64.b64encode(json.dumps(e).encode()).decode(), "p": "ab"}).encode())
        for e in events
    )


def anthropic_stream(words: list[str], model: str = "claude-test-1") -> bytes:
    """An Anthropic Messages SSE body: one text block, one delta per word, end_turn."""

    def event(name: str, data: dict) -> bytes:
        return f"event: {name}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()

    message = {"id": "msg_interception", "type": "message", "role": "assistant", "model": model, "content": [],
               "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": 3, "output_tokens": 1}}
    parts = [event("message_start", {"type": "message_start", "message": message}),
             event("content_block_start", {"type": "content_block_start", "index": 0,
                                           "content_block": {"type": "text", "text": ""}})]
    parts += [event("content_block_delta", {"type": "content_block_delta", "index": 0,
                                            "delta": {"type": "text_delta", "text": w}}) for w in words]
    parts += [event("content_block_stop", {"type": "content_block_stop", "index": 0}),
              event("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                                      "usage": {"output_tokens": len(words)}}),
              event("message_stop", {"type": "message_stop"})]
    return b"".join(parts)


# --- the fake provider ------------------------------------------------------------------


@dataclass
class Route:
    body: bytes
    content_type: str = "text/event-stream"
    status: int = 200
    chunk_size: int = 97  # odd on purpose: frames arrive cut at arbitrary offsets


@dataclass
class Served:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    sent: bytes


@dataclass
class Provider:
    """A tiny HTTP/1.1 server (TLS when given a certificate) that streams fixed bodies.

    Each response is sent with chunked transfer encoding, a few bytes at a time, and
    what was sent is kept in ``served`` so a test can compare it with what a client got.
    """

    routes: dict[str, Route]
    host: str = "127.0.0.1"
    port: int = 0
    certfile: Path | None = None
    served: list[Served] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._sock = socket.create_server((self.host, self.port))
        self.port = self._sock.getsockname()[1]
        self._tls = None
        if self.certfile:
            self._tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            self._tls.load_cert_chain(self.certfile)
            self._tls.set_alpn_protocols(["http/1.1"])
        self._thread = threading.Thread(target=self._accept, daemon=True)

    def __enter__(self) -> Provider:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()

    def serve_forever(self) -> None:
        self._accept()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        try:
            if self._tls:
                conn = self._tls.wrap_socket(conn, server_side=True)
            with conn:
                self._exchange(conn)
        except (OSError, ssl.SSLError, ValueError):
            pass

    def _exchange(self, conn: socket.socket) -> None:
        reader = conn.makefile("rb")
        request_line = reader.readline().decode("latin-1").strip()
        if not request_line:
            return
        method, target, _ = request_line.split(" ", 2)
        headers: dict[str, str] = {}
        while (line := reader.readline()) not in (b"\r\n", b"\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        body = reader.read(int(headers.get("content-length", "0") or 0))
        path = target.split("?", 1)[0]
        route = self.routes.get(path)
        if route is None:
            conn.sendall(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
            self.served.append(Served(method, target, headers, body, b""))
            return
        head = (
            f"HTTP/1.1 {route.status} X\r\ncontent-type: {route.content_type}\r\n"
            "transfer-encoding: chunked\r\ncache-control: no-cache\r\nconnection: close\r\n\r\n"
        )
        conn.sendall(head.encode())
        sent = bytearray()
        for i in range(0, len(route.body), route.chunk_size):
            piece = route.body[i : i + route.chunk_size]
            conn.sendall(b"%x\r\n%s\r\n" % (len(piece), piece))
            sent += piece
        conn.sendall(b"0\r\n\r\n")
        self.served.append(Served(method, target, headers, body, bytes(sent)))


# --- unmodified apps: they read their settings from the environment only -------------------

# stdout: the raw body bytes as the SDK's transport received them; stderr: the text the
# SDK assembled from a second, parsed request.
APP_PY = """\
import json, sys
import openai

client = openai.OpenAI(max_retries=0, timeout=20)  # OPENAI_BASE_URL, OPENAI_API_KEY, proxy, CA: env
messages = [{"role": "user", "content": "hi"}]
with client.chat.completions.with_streaming_response.create(
    model="gpt-test-1", messages=messages, stream=True
) as response:
    sys.stdout.buffer.write(b"".join(response.iter_bytes()))
stream = client.chat.completions.create(model="gpt-test-1", messages=messages, stream=True)
text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
print(json.dumps({"text": text}), file=sys.stderr)
"""

# boto3 as an app: BEDROCK_ENDPOINT stands in for the real regional endpoint; proxy and CA
# come from the environment (HTTPS_PROXY, AWS_CA_BUNDLE). stdout: the decoded chunks.
BEDROCK_MODEL = "anthropic.claude-v2"
APP_BOTO = """\
import json, os
import boto3

client = boto3.client(
    "bedrock-runtime", region_name="us-east-1", endpoint_url=os.environ["BEDROCK_ENDPOINT"],
    aws_access_key_id="AKIDSTREAMTAPTEST", aws_secret_access_key="streamtap-test-secret",
)
response = client.invoke_model_with_response_stream(
    modelId="anthropic.claude-v2",
    body=json.dumps({"anthropic_version": "bedrock-2023-05-31", "max_tokens": 64, "messages": []}),
)
print(json.dumps([json.loads(event["chunk"]["bytes"]) for event in response["body"]]))
"""

# stdout: the SDK's final message as {"text", "stop_reason"}.
APP_ANTHROPIC = """\
import json
import anthropic

client = anthropic.Anthropic(max_retries=0, timeout=20)  # ANTHROPIC_BASE_URL, ANTHROPIC_API_KEY: env
with client.messages.stream(
    model="claude-test-1", max_tokens=64, messages=[{"role": "user", "content": "hi"}]
) as stream:
    message = stream.get_final_message()
text = "".join(block.text for block in message.content if block.type == "text")
print(json.dumps({"text": text, "stop_reason": message.stop_reason}))
"""

APP_JS = """\
(async () => {
  const response = await fetch(process.env.OPENAI_BASE_URL + "/chat/completions", {
    method: "POST",
    headers: {"content-type": "application/json", authorization: "Bearer " + process.env.OPENAI_API_KEY},
    body: JSON.stringify({model: "gpt-test-1", stream: true, messages: [{role: "user", content: "hi"}]}),
  });
  process.stdout.write(Buffer.from(await response.arrayBuffer()));
})().catch((err) => { console.error(err); process.exit(1); });
"""

APP_JAVA = """\
import java.io.*;
import java.net.*;

public class App {
    public static void main(String[] args) throws Exception {
        URL url = new URL(System.getenv("OPENAI_BASE_URL") + "/chat/completions");
        HttpURLConnection conn = (HttpURLConnection) url.openConnection();
        conn.setRequestMethod("POST");
        conn.setDoOutput(true);
        conn.setRequestProperty("content-type", "application/json");
        conn.setRequestProperty("authorization", "Bearer " + System.getenv("OPENAI_API_KEY"));
        try (OutputStream out = conn.getOutputStream()) {
            out.write("{\\"model\\":\\"gpt-test-1\\",\\"stream\\":true,\\"messages\\":[]}".getBytes("UTF-8"));
        }
        try (InputStream in = conn.getInputStream()) {
            in.transferTo(System.out);
        }
        System.out.flush();
    }
}
"""


# --- mitmdump ---------------------------------------------------------------------------


class Mitmdump:
    """A real ``mitmdump -s addon/tap.py`` process; ``port`` is the one it really bound."""

    def __init__(
        self,
        *args: str,
        confdir: Path,
        prefix: list[str] | None = None,
        tap: bool = True,
        argv: list[str] | None = None,
        env: dict[str, str] | None = None,
    ):
        self.confdir = confdir
        if argv is None:
            argv = [*(prefix or []), str(MITMDUMP), "--set", f"confdir={confdir}"]
            if tap:
                argv += ["-s", str(TAP)]
        cmd = [*argv, *args]
        self.cmd = cmd
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=REPO, text=True, env=env
        )
        self.lines: list[str] = []
        self.port = self._wait_listening()
        self._drainer = threading.Thread(target=self._drain, daemon=True)
        self._drainer.start()
        # mitmproxy writes its CA just after it says it is listening; clients read it at once
        deadline = time.monotonic() + 10
        while not self.ca_cert.exists() and time.monotonic() < deadline:
            time.sleep(0.02)

    def _wait_listening(self, timeout: float = 30) -> int:
        deadline = time.monotonic() + timeout
        assert self.proc.stdout is not None
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            self.lines.append(line)
            if m := re.search(r"listening at .*:(\d+)", line):
                return int(m.group(1))
        self.stop()
        raise RuntimeError(f"mitmdump did not start: {' '.join(self.cmd)}\n{''.join(self.lines)}")

    def _drain(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    @property
    def output(self) -> str:
        return "".join(self.lines)

    @property
    def ca_cert(self) -> Path:
        return self.confdir / "mitmproxy-ca-cert.pem"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        drainer = getattr(self, "_drainer", None)
        if drainer is not None:
            drainer.join(5)  # every line mitmdump wrote is in .output once stop() returns


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# --- command line: run the provider or an SDK client inside a namespace -------------------


def _serve(args: argparse.Namespace) -> None:
    routes = {args.path: Route(Path(args.body).read_bytes(), args.content_type)}
    provider = Provider(routes, host=args.host, port=args.port, certfile=Path(args.cert))
    print(f"serving on {args.host}:{provider.port}", flush=True)
    provider.serve_forever()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    verbs = parser.add_subparsers(dest="verb", required=True)
    serve = verbs.add_parser("serve")
    serve.add_argument("--host", required=True)
    serve.add_argument("--port", type=int, default=443)
    serve.add_argument("--cert", required=True)
    serve.add_argument("--body", required=True)
    serve.add_argument("--path", default="/v1/chat/completions")
    serve.add_argument("--content-type", default="text/event-stream")
    serve.set_defaults(run=_serve)
    ns = parser.parse_args()
    ns.run(ns)
    sys.exit(0)
