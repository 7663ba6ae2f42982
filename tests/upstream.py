"""A fake LLM provider on loopback that sends exactly the bytes a test scripts.

Tests (and the bench) register a ``Script`` under a name; a request whose path starts
with ``/s/<name>/`` is answered with it. So a real SDK pointed at
``http://proxy/s/<name>`` (OpenAI adds ``/chat/completions``, Anthropic ``/v1/messages``,
boto3 ``/model/.../converse-stream``) gets the scripted stream through the proxy, and the
test can compare what the upstream sent with what the client got.

A script controls the status, headers, chunk sizes and gaps, the body framing
(chunked, content-length, close-delimited), gzip, and how the stream ends: properly,
cut with a FIN (an unterminated body), or cut with a TCP reset. ``pause_after`` holds the
stream open mid-body until ``release()`` (for kill and abort tests).

Run alone for manual checks: ``python tests/upstream.py`` serves ``/s/demo/`` until ^C.
"""

from __future__ import annotations

import asyncio
import gzip as gzip_module
import socket
import struct
import threading
import zlib
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx


@dataclass
class Script:
    body: bytes
    status: int = 200
    content_type: str = "text/event-stream"
    headers: list[tuple[str, str]] = field(default_factory=list)
    chunk_size: int | None = None  # None: one write per event-ish piece (split at blank lines), else fixed size
    chunks: list[bytes] | None = None  # exact writes (overrides chunk_size)
    gap: float = 0.0  # seconds between writes
    framing: str = "chunked"  # "chunked" | "length" | "close"
    encoding: str | None = None  # "gzip" | "deflate" | "br" | "zstd", or several ("gzip, br"): compressed before framing
    cut_at: int | None = None  # stop after this many (wire) body bytes
    cut_style: str = "fin"  # "fin": close the connection (body unterminated); "reset": TCP RST
    pause_after: int | None = None  # wire bytes after which to wait for release()


@dataclass
class Served:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    wire: bytes = b""  # body bytes as sent (after compression, before chunked framing)
    done: bool = False


class Upstream:
    """Start with ``with Upstream() as up:``; ``up.url`` is ``http://127.0.0.1:PORT``."""

    def __init__(self) -> None:
        self.scripts: dict[str, Script] = {}
        self.router = None  # (path, body) -> script name, for requests without a /s/<name>/ prefix
        self.served: dict[str, list[Served]] = defaultdict(list)
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._release = threading.Event()
        self._paused = threading.Event()
        self._server: asyncio.base_events.Server | None = None
        self._tasks: set[asyncio.Task] = set()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def add(self, name: str, script: Script) -> str:
        self.scripts[name] = script
        return name

    def last(self, name: str) -> Served:
        return self.served[name][-1]

    def last_done(self, name: str, timeout: float = 10) -> Served:
        """The last request for ``name`` once its script has sent everything. The client can
        hold the whole body before this thread marks it done, so a test waits for the mark."""
        deadline = _time.monotonic() + timeout
        while not self.last(name).done and _time.monotonic() < deadline:
            _time.sleep(0.01)
        return self.last(name)

    def release(self) -> None:
        self._release.set()

    def arm_pause(self) -> None:
        """Make the next script with ``pause_after`` wait again for ``release()``."""
        self._release.clear()
        self._paused.clear()

    def wait_paused(self, timeout: float = 10) -> bool:
        return self._paused.wait(timeout)

    # lifecycle ---------------------------------------------------------------------
    def __enter__(self) -> Upstream:
        self._thread = threading.Thread(target=self._run, name="upstream", daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("upstream did not start")
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        self._release.set()
        if self._loop and self._loop.is_running():
            self._loop.call_soon_threadsafe(self._shutdown)
        if self._thread:
            self._thread.join(10)

    def _shutdown(self) -> None:
        if self._server:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        self._loop.call_later(0.05, self._loop.stop)

    def _run(self) -> None:
        self._loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._handle, "127.0.0.1", 0, reuse_address=True, backlog=256)
        )
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()
        self._loop.close()

    # HTTP -------------------------------------------------------------------------
    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self._tasks.add(task)
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {}
                for line in lines[1:]:
                    if ":" in line:
                        name, value = line.split(":", 1)
                        headers[name.strip().lower()] = value.strip()
                body = b""
                if headers.get("transfer-encoding", "").lower() == "chunked":
                    while True:
                        size = int((await reader.readline()).split(b";")[0], 16)
                        chunk = await reader.readexactly(size + 2)
                        body += chunk[:-2]
                        if size == 0:
                            break
                elif "content-length" in headers:
                    body = await reader.readexactly(int(headers["content-length"]))
                keep_open = await self._respond(method, path, headers, body, writer)
                if not keep_open:
                    return
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self._tasks.discard(task)
            if not writer.is_closing():
                writer.close()

    async def _respond(self, method, path, headers, body, writer) -> bool:
        parts = path.split("/")
        name = parts[2] if len(parts) > 2 and parts[1] == "s" else ""
        if not name and self.router is not None:
            name = self.router(path, body)
        script = self.scripts.get(name)
        served = Served(method, path, headers, body)
        self.served[name].append(served)
        if script is None:
            payload = b'{"error":{"type":"not_found","message":"no script for this path"}}'
            writer.write(
                b"HTTP/1.1 404 Not Found\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                % (len(payload), payload)
            )
            await writer.drain()
            return True
        wire = script.body
        for coding in (script.encoding or "").split(","):  # "gzip, br": gzip first, then br, as the header says
            coding = coding.strip()
            if coding == "gzip":
                wire = gzip_module.compress(wire, mtime=0)
            elif coding == "deflate":
                wire = zlib.compress(wire)
            elif coding == "br":
                import brotli

                wire = brotli.compress(wire)
            elif coding == "zstd":
                from backports import zstd

                wire = zstd.compress(wire)
        pieces = _pieces(wire, script)
        head = [f"HTTP/1.1 {script.status} {_REASONS.get(script.status, 'Status')}", f"content-type: {script.content_type}"]
        if script.encoding:
            head.append(f"content-encoding: {script.encoding}")
        if script.framing == "chunked":
            head.append("transfer-encoding: chunked")
        elif script.framing == "length":
            head.append(f"content-length: {len(wire)}")
        else:
            head.append("connection: close")
        head += [f"{k}: {v}" for k, v in script.headers]
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1"))
        await writer.drain()
        sent = 0
        for number, piece in enumerate(pieces, 1):
            if script.cut_at is not None and sent + len(piece) > script.cut_at:
                piece = piece[: script.cut_at - sent]
                if piece:
                    served.wire += piece  # before the write: a client may read it before this thread runs again
                    self._write(writer, piece, script)
                    sent += len(piece)
                    await writer.drain()
                await asyncio.sleep(0.05)  # let the bytes leave before the cut
                self._cut(writer, script)
                return False
            if script.pause_after is not None and sent >= script.pause_after and not self._paused.is_set():
                self._paused.set()
                await asyncio.get_running_loop().run_in_executor(None, self._release.wait, 60)
            last = number == len(pieces)  # not "is pieces[-1]": equal one-byte pieces are one object
            served.wire += piece
            self._write(writer, piece, script)
            if last and script.framing == "chunked" and script.cut_at is None:
                writer.write(b"0\r\n\r\n")  # in the same segment as the last event, as servers do
            sent += len(piece)
            await writer.drain()
            if script.gap and not last:
                await asyncio.sleep(script.gap)
        if script.cut_at is not None and sent >= script.cut_at:
            await asyncio.sleep(0.05)
            self._cut(writer, script)
            return False
        if script.framing == "chunked" and not pieces:
            writer.write(b"0\r\n\r\n")
        await writer.drain()
        served.done = True
        if script.framing == "close":
            writer.close()
            return False
        return True

    @staticmethod
    def _write(writer, piece: bytes, script: Script) -> None:
        if not piece:
            return  # an empty chunk would end a chunked body
        if script.framing == "chunked":
            writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
        else:
            writer.write(piece)

    @staticmethod
    def _cut(writer, script: Script) -> None:
        if script.cut_style == "reset":
            sock = writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()
        else:
            writer.close()


def _pieces(wire: bytes, script: Script) -> list[bytes]:
    if script.chunks is not None:
        assert b"".join(script.chunks) == wire or script.encoding, "chunks must add up to the body"
        if not script.encoding:
            return list(script.chunks)
    if script.chunk_size:
        return [wire[i : i + script.chunk_size] for i in range(0, len(wire), script.chunk_size)] or [b""]
    if script.encoding or script.content_type != "text/event-stream":
        return [wire[i : i + 512] for i in range(0, len(wire), 512)]
    pieces, start = [], 0
    while (end := wire.find(b"\n\n", start)) >= 0:
        pieces.append(wire[start : end + 2])
        start = end + 2
    if start < len(wire):
        pieces.append(wire[start:])
    return pieces


class H2Upstream(Upstream):
    """The same scripts over HTTP/2 with TLS (ALPN h2, a throwaway self-signed certificate).

    Cuts: ``fin`` closes the connection, ``reset`` sends RST_STREAM (the HTTP/2 abort).
    Bodies must fit in the default flow-control window (64 KiB).
    """

    def _run(self) -> None:
        import ssl
        import tempfile

        self._tmp = tempfile.TemporaryDirectory()
        cert, key = _self_signed(Path(self._tmp.name))
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        context.set_alpn_protocols(["h2"])
        self._loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", 0, ssl=context))
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()
        self._loop.close()

    @property
    def url(self) -> str:
        return f"https://localhost:{self.port}"

    async def _handle(self, reader, writer) -> None:
        import h2.config
        import h2.connection
        import h2.events

        task = asyncio.current_task()
        self._tasks.add(task)
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False, header_encoding="utf-8"))
        conn.initiate_connection()
        writer.write(conn.data_to_send())
        requests: dict[int, list] = {}
        try:
            while data := await reader.read(65536):
                for event in conn.receive_data(data):
                    if isinstance(event, h2.events.RequestReceived):
                        requests[event.stream_id] = [dict(event.headers), b""]
                    elif isinstance(event, h2.events.DataReceived):
                        requests[event.stream_id][1] += event.data
                        conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                    elif isinstance(event, h2.events.StreamEnded):
                        headers, body = requests.pop(event.stream_id)
                        asyncio.ensure_future(self._respond_h2(conn, writer, event.stream_id, headers, body))
                writer.write(conn.data_to_send())
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self._tasks.discard(task)
            writer.close()

    async def _respond_h2(self, conn, writer, stream_id, headers, body) -> None:
        path = headers.get(":path", "/")
        parts = path.split("/")
        name = parts[2] if len(parts) > 2 and parts[1] == "s" else ""
        served = Served(headers.get(":method", ""), path, {k: v for k, v in headers.items() if not k.startswith(":")}, body)
        self.served[name].append(served)
        script = self.scripts.get(name) or Script(b'{"error":"no script"}', status=404, content_type="application/json")
        wire = gzip_module.compress(script.body, mtime=0) if script.encoding == "gzip" else script.body
        response_headers = [(":status", str(script.status)), ("content-type", script.content_type)]
        if script.encoding:
            response_headers.append(("content-encoding", script.encoding))
        conn.send_headers(stream_id, response_headers + list(script.headers))
        writer.write(conn.data_to_send())
        sent = 0
        for piece in _pieces(wire, script):
            if script.cut_at is not None and sent + len(piece) > script.cut_at:
                piece = piece[: script.cut_at - sent]
                if piece:
                    conn.send_data(stream_id, piece)
                    served.wire += piece
                writer.write(conn.data_to_send())
                await writer.drain()
                await asyncio.sleep(0.05)
                if script.cut_style == "reset":
                    import h2.errors

                    conn.reset_stream(stream_id, h2.errors.ErrorCodes.INTERNAL_ERROR)
                    writer.write(conn.data_to_send())
                else:
                    writer.close()
                return
            conn.send_data(stream_id, piece)
            served.wire += piece
            sent += len(piece)
            writer.write(conn.data_to_send())
            await writer.drain()
            if script.gap:
                await asyncio.sleep(script.gap)
        conn.end_stream(stream_id)
        writer.write(conn.data_to_send())
        await writer.drain()
        served.done = True


def _self_signed(directory: Path) -> tuple[str, str]:
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return str(cert_path), str(key_path)


_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 429: "Too Many Requests", 500: "Internal Server Error", 529: "Overloaded"}


if __name__ == "__main__":
    import time

    with Upstream() as up:
        up.add("demo", Script(b'data: {"hello":"world"}\n\ndata: [DONE]\n\n', gap=0.2))
        print(f"serving {up.url}/s/demo/ ; ^C to stop", flush=True)
        try:
            while True:
                time.sleep(1)
        except KeyboardInterrupt:
            pass


# --- a real mitmdump with the streamtap addon ------------------------------------------

import os  # noqa: E402
import subprocess  # noqa: E402
import time as _time  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
MITMDUMP = REPO / ".venv" / "bin" / "mitmdump"
CHAT = "/v1/chat/completions"
STREAM_REQUEST = '{"model":"m","stream":true,"messages":[]}'  # a streaming chat call, as curl sends it


def curl(url: str, *extra: str, max_time: float = 10) -> subprocess.CompletedProcess:
    """``curl -N`` posting STREAM_REQUEST: stdout holds the bytes the client received."""
    return subprocess.run(
        ["curl", "-sS", "-N", "--max-time", str(max_time), "-H", "content-type: application/json",
         "--data", STREAM_REQUEST, *extra, url],
        capture_output=True,
    )


def curl_started(url: str) -> subprocess.Popen:
    """``curl -N`` posting STREAM_REQUEST, left running: for a test that acts while the stream flows."""
    return subprocess.Popen(
        ["curl", "-sS", "-N", "-H", "content-type: application/json", "--data", STREAM_REQUEST, url],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_ports(count: int) -> list[int]:
    """Several free loopback ports, held together while they are picked so they differ."""
    sockets = [socket.create_server(("127.0.0.1", 0)) for _ in range(count)]
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


class Mitmdump:
    """``mitmdump -s addon/tap.py`` in reverse mode in front of ``upstream_url``, on a free loopback port."""

    def __init__(self, upstream_url: str, workdir: Path, *, script: Path | None = REPO / "addon" / "tap.py", options: dict[str, str] | None = None, mode: str | None = None) -> None:
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.record_dir = self.workdir / "recordings"
        self.confdir = self.workdir / "mitmconf"
        self.log_path = self.workdir / "mitmdump.log"
        self.port = free_port()
        self.args = [str(MITMDUMP), "--mode", mode or f"reverse:{upstream_url}", "--listen-host", "127.0.0.1", "--listen-port", str(self.port)]
        if script is not None:
            self.args += ["-s", str(script)]
        opts = {"confdir": str(self.confdir), "flow_detail": "0", "termlog_verbosity": "info"}
        if script is not None:
            opts["streamtap_dir"] = str(self.record_dir)
        opts.update(options or {})
        for name, value in opts.items():
            self.args += ["--set", f"{name}={value}"]
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    START_ATTEMPTS = 3  # a port free_port() picked can be taken by another process before mitmproxy binds it

    def start(self, timeout: float = 20) -> Mitmdump:
        """Start and wait until mitmproxy itself says it listens on our port(s).

        A TCP connect is no proof: it also succeeds against another process that took the
        port first (our mitmdump then exits), and mitmweb binds its web port only after the
        proxy port. A start that lost its port to another process retries with fresh ports."""
        for attempt in range(1, self.START_ATTEMPTS + 1):
            if attempt > 1:
                self.pick_ports()
            if self._start_once(timeout, retry_if_port_taken=attempt < self.START_ATTEMPTS):
                return self
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _start_once(self, timeout: float, retry_if_port_taken: bool) -> bool:
        log_start = self.log_path.stat().st_size if self.log_path.exists() else 0  # the log is appended to across starts
        self._log = open(self.log_path, "ab")
        self.process = subprocess.Popen(self.args, stdout=self._log, stderr=subprocess.STDOUT, cwd=self.workdir, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        deadline = _time.monotonic() + timeout
        while _time.monotonic() < deadline:
            exited = self.process.poll() is not None
            this_start = self._log_since(log_start)
            if not exited and all(line in this_start for line in self.ready_lines()):
                return True
            if exited:
                self.stop()
                if retry_if_port_taken and "address already in use" in this_start.lower():
                    return False
                raise RuntimeError(f"mitmdump exited with {self.process.returncode}:\n{self.log()}")
            _time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"mitmdump did not listen within {timeout} s:\n{self.log()}")

    def ready_lines(self) -> list[str]:
        """What mitmproxy logs (at termlog_verbosity info) once it listens where we want it."""
        return [f" listening at 127.0.0.1:{self.port}."]

    def pick_ports(self) -> None:
        self.port = free_port()
        self.set_arg("--listen-port", self.port)

    def set_arg(self, flag: str, value: object) -> None:
        self.args[self.args.index(flag) + 1] = str(value)

    def _log_since(self, offset: int) -> str:
        try:
            with open(self.log_path, "rb") as handle:
                handle.seek(offset)
                return handle.read().decode(errors="replace")
        except OSError:
            return ""

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def wait_log(self, text: str, count: int = 1, timeout: float = 10) -> str:
        deadline = _time.monotonic() + timeout
        while _time.monotonic() < deadline:
            log = self.log()
            if log.count(text) >= count:
                return log
            _time.sleep(0.02)
        raise AssertionError(f"{text!r} did not appear {count} time(s) in the mitmdump log:\n{self.log()[-4000:]}")

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        if getattr(self, "_log", None):
            self._log.close()

    def kill9(self) -> None:
        assert self.process
        self.process.kill()
        self.process.wait(5)
        self._log.close()

    def __enter__(self) -> Mitmdump:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


@contextmanager
def proxy_to(upstream: Upstream, workdir: Path, options: dict[str, str] | None = None, scripts: tuple = ()) -> Iterator[Mitmdump]:
    """mitmdump in front of ``upstream`` (its self-signed certificate taken), ``scripts`` loaded
    after streamtap's, with ``upstream`` and mitmproxy's CA file (``ca``, for the clients) on it;
    mitmproxy must not have crashed by the end."""
    mitm = Mitmdump(upstream.url, workdir, options={"ssl_insecure": "true", **(options or {})})
    for script in scripts:
        mitm.args += ["-s", str(script)]
    with mitm:
        mitm.upstream = upstream
        mitm.ca = str(mitm.confdir / "mitmproxy-ca-cert.pem")
        yield mitm
        assert "mitmproxy has crashed" not in mitm.log()


def find_recording(record_dir: Path, name: str, timeout: float = 30, partial: bool = False):
    """The recording of the (last) request for script ``name``, waiting until its writer finished.
    A worker runs at nice 10: on a machine busy with other work its first Python start alone can
    take more than 10 s."""
    from streamtap.recording import read_recording

    deadline = _time.monotonic() + timeout
    while True:
        found = []
        pattern = "*.partial.jsonl" if partial else "*.jsonl"
        for path in sorted(Path(record_dir).glob(pattern)) if Path(record_dir).is_dir() else []:
            if not partial and path.name.endswith(".partial.jsonl"):
                continue
            try:
                with path.open("rb") as handle:
                    first = handle.readline()
            except OSError:
                continue
            if f"/s/{name}/".encode() in first:
                found.append(path)
        if found:
            return read_recording(found[-1])
        if _time.monotonic() > deadline:
            raise AssertionError(f"no {'partial ' if partial else ''}recording for /s/{name}/ in {record_dir}: {sorted(p.name for p in Path(record_dir).glob('*'))}")
        _time.sleep(0.02)


def TeeTransport(http=httpx):
    """An httpx (or httpx2, which the anthropic SDK uses) transport that keeps a copy of every
    response body's bytes as received, before any content decoding: ``.bodies``."""

    class Tee(http.BaseTransport):
        def __init__(self) -> None:
            self._inner = http.HTTPTransport()
            self.bodies: list[bytearray] = []

        def handle_request(self, request):
            response = self._inner.handle_request(request)
            captured = bytearray()
            self.bodies.append(captured)
            inner_stream = response.stream

            class Copying(http.SyncByteStream):
                def __iter__(self):
                    for chunk in inner_stream:
                        captured.extend(chunk)
                        yield chunk

                def close(self):
                    inner_stream.close()

            response.stream = Copying()
            return response

        def close(self) -> None:
            self._inner.close()

    return Tee()
