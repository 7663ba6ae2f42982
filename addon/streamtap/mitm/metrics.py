"""The Metrics addon: live turn metrics in the Prometheus text format (``streamtap_metrics=HOST:PORT``).

The Tap tells it about each finished turn (``turn_finished``), so everything is counted once
per turn, from the turn's summary: nothing runs per event or per chunk. Scrapes are served by
prometheus-client's WSGI app, on a server thread of this module's (at most ``MAX_SCRAPES`` at
once, each closed after ``SCRAPE_TIMEOUT``), from a registry of this addon's own (not the
process-wide default one).

Label cardinality is bounded: provider, verdict and stream end come from closed sets; model
names are free text from the traffic, so the first ``MAX_MODELS`` distinct plausible names get
their own label value, and any other name (or none) is counted as ``other``.
"""

from __future__ import annotations

import ipaddress
import logging
import re
import socket
import threading
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

import orjson

from mitmproxy import exceptions
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

from streamtap.providers.model import model_of

log = logging.getLogger("streamtap")

MAX_MODELS = 50
OTHER = "other"
_PLAUSIBLE_MODEL = re.compile(r"[A-Za-z0-9._:/@+-]{1,100}\Z")  # as the README says: these characters, 1 to 100 of them
TTFT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 0.75, 1, 1.5, 2, 3, 5, 7.5, 10, 15, 30, 60)
DURATION_BUCKETS = (0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600)
TOKEN_KINDS = ("input", "output", "cache_read", "cache_write", "reasoning")
ERROR_PARTS = ("analysis", "recording", "tap")

# A usage count above this is not counted. The counters are doubles: past 2**53 they no longer hold
# every integer (adding 1 may change nothing), and a count past a double's range (JSON allows any
# integer, which the providers' SDKs read exactly) cannot be added at all. No stream reports that
# many tokens; one that says so (a bug, a forged answer) would swamp every real count for good.
MAX_TOKEN_COUNT = 2**53


def _countable(value: Any) -> bool:
    """A token count the counters take: a positive integer (not a bool), at most MAX_TOKEN_COUNT."""
    return type(value) is int and 0 < value <= MAX_TOKEN_COUNT


class TurnMetrics:
    """The metric families, in their own registry, and how a finished turn updates them."""

    def __init__(self, open_streams=lambda: 0) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.turns = Counter("streamtap_turns", "Finished turns (one per tapped streamed answer).",
                             ["provider", "model", "verdict", "stream_end"], registry=r)
        self.ttft = Histogram("streamtap_ttft_seconds", "Time from the response start to the first content.",
                              ["provider", "model"], buckets=TTFT_BUCKETS, registry=r)
        self.duration = Histogram("streamtap_turn_duration_seconds", "Time from the response start to its end.",
                                  ["provider", "model"], buckets=DURATION_BUCKETS, registry=r)
        self.bytes = Counter("streamtap_stream_bytes", "Body bytes of finished turns (after content decoding).", registry=r)
        self.events = Counter("streamtap_events", "Wire events (frames and cut tails) of finished turns.", registry=r)
        self.tokens = Counter("streamtap_usage_tokens", "Tokens the providers reported in the streams' usage.",
                              ["provider", "model", "kind"], registry=r)
        self.open = Gauge("streamtap_open_streams", "Streams being tapped right now.", registry=r)
        self.open.set_function(open_streams)
        self.errors = Counter("streamtap_tap_errors", "Errors streamtap hit itself (traffic passed on untouched), counted when the flow ends.",
                              ["part"], registry=r)
        for part in ERROR_PARTS:
            self.errors.labels(part)  # present at 0 from the start, so rates work
        self.models: set[str] = set()
        # labelled children per label set: prometheus-client's labels() costs more than the update
        self._children: dict[tuple[str, str, str, str], tuple[Any, Any, Any]] = {}
        self._token_children: dict[tuple[str, str, str], Any] = {}

    def model_label(self, model: Any) -> str:
        if not isinstance(model, str):  # a list would not even hash
            return OTHER
        if model in self.models:
            return model  # type: ignore[return-value]
        if len(self.models) >= MAX_MODELS or not _PLAUSIBLE_MODEL.match(model):
            return OTHER
        self.models.add(model)
        return model

    def count(self, summary: dict[str, Any], model: str | None) -> None:
        provider, label = summary["provider"], self.model_label(model)
        key = (provider, label, summary["verdict"], summary["stream_end"])
        # every value first: a turn is counted whole or not at all (Tap._tell logs what raised)
        ttft_ms = summary.get("ttft_ms")
        ttft = None if ttft_ms is None else ttft_ms / 1000
        duration = summary["duration_ms"] / 1000
        bytes_, events = summary.get("bytes") or 0, summary.get("events") or 0
        usage = summary.get("usage") or {}
        tokens = [(kind, usage.get(kind)) for kind in TOKEN_KINDS if _countable(usage.get(kind))]
        errors = [error.split(":", 1)[0] for error in summary.get("errors") or ()]
        children = self._children.get(key)
        if children is None:
            children = self._children[key] = (
                self.turns.labels(*key), self.ttft.labels(provider, label), self.duration.labels(provider, label)
            )
        turns, ttft_child, duration_child = children
        turns.inc()
        if ttft is not None:
            ttft_child.observe(ttft)
        duration_child.observe(duration)
        self.bytes.inc(bytes_)
        self.events.inc(events)
        for kind, value in tokens:
            token_key = (provider, label, kind)
            child = self._token_children.get(token_key)
            if child is None:
                child = self._token_children[token_key] = self.tokens.labels(*token_key)
            child.inc(value)
        for part in errors:
            self.errors.labels(part if part in ERROR_PARTS else "tap").inc()


MAX_REQUEST_READ = 1 << 20  # a lost flow's request body parsed on the loop for its model: at most this


def _request_json(flow) -> Any:
    content = flow.request.raw_content or b""
    if len(content) > MAX_REQUEST_READ or flow.request.headers.get("content-encoding"):
        return None
    try:
        return orjson.loads(content)
    except orjson.JSONDecodeError:
        return None


# a host name: dot-separated labels of letters, digits, inner hyphens and underscores (which
# resolvers take, and container names hold)
_HOST_NAME = re.compile(r"(?!-)[A-Za-z0-9_-]{1,63}(?<!-)(?:\.(?!-)[A-Za-z0-9_-]{1,63}(?<!-))*\.?")


def parse_address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` too): a host name or an IP address, and a port of ASCII digits."""
    host, sep, port = text.strip().rpartition(":")
    bracketed = host.startswith("[") and host.endswith("]")
    host = host[1:-1] if bracketed else host
    try:
        ipaddress.ip_address(host)
        valid_host = True
    except ValueError:  # a name, but not one of numbers only (300.1.1.1 is no address)
        valid_host = (not bracketed and _HOST_NAME.fullmatch(host) is not None
                      and not all(label.isdigit() for label in host.rstrip(".").split(".")))
    if not (sep and valid_host and port.isascii() and port.isdigit() and int(port) <= 65535):
        raise ValueError(f"streamtap_metrics must be HOST:PORT (e.g. 127.0.0.1:9108), not {text!r}")
    return host, int(port)


# Scrapes served at once, and how long each may take. Each costs the proxy's process a thread
# and a file descriptor until it ends: prometheus-client's own server gave every connection one,
# for as long as it stayed open, so enough idle connections to the metrics port left the proxy
# no file descriptor for its traffic. A connection beyond these is closed at once.
MAX_SCRAPES = 8
SCRAPE_TIMEOUT = 10.0


class _ScrapeHandler(WSGIRequestHandler):
    timeout = SCRAPE_TIMEOUT  # set on the connection: one that sends nothing, or reads nothing, is closed

    def setup(self) -> None:
        super().setup()
        # the socket timeout bounds each read and write; a client that sends a byte now and then
        # would hold its slot for good: the whole scrape ends at SCRAPE_TIMEOUT
        self._deadline = threading.Timer(SCRAPE_TIMEOUT, self._end)
        self._deadline.daemon = True
        self._deadline.start()

    def _end(self) -> None:
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:  # closed already
            pass

    def finish(self) -> None:
        self._deadline.cancel()
        super().finish()

    def log_message(self, format: str, *args: Any) -> None:  # a scrape is no event of the proxy's
        pass


class _ScrapeServer(ThreadingWSGIServer):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.slots = threading.BoundedSemaphore(MAX_SCRAPES)
        super().__init__(*args, **kwargs)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.slots.acquire(blocking=False):
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)  # its thread releases the slot
        except BaseException:
            self.slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that timed out or went away: its connection is closed, nothing to tell


def _scrapes(registry: CollectorRegistry):
    """prometheus-client's app, which raises on an ``Accept`` header whose version is no number
    (0.26 compares the text to numbers): such a scrape gets the plain text format."""
    app = make_wsgi_app(registry)

    def scrape(environ: dict, start_response: Any):
        try:
            return app(environ, start_response)
        except (TypeError, ValueError):
            return app({**environ, "HTTP_ACCEPT": "text/plain"}, start_response)

    return scrape


def _start_server(address: tuple[str, int], registry: CollectorRegistry) -> _ScrapeServer:
    """The metrics served on ``address`` from a thread; OSError when it cannot listen there."""
    host, port = address
    family, *_, where = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    server_class = type("MetricsServer", (_ScrapeServer,), {"address_family": family})
    server = make_server(where[0], port, _scrapes(registry), server_class, handler_class=_ScrapeHandler)
    threading.Thread(target=server.serve_forever, name="streamtap metrics", daemon=True).start()
    return server


class Metrics:
    """mitmproxy addon serving ``TurnMetrics`` on ``streamtap_metrics`` (off when empty)."""

    def __init__(self, tap) -> None:
        self.tap = tap
        self.metrics = TurnMetrics(lambda: len(tap.open))
        self.server = None
        self.address: tuple[str, int] | None = None
        self.started = False  # the proxy runs: an address that cannot be served is refused, not warned of

    def running(self) -> None:
        self.started = True

    def load(self, loader) -> None:
        loader.add_option(
            "streamtap_metrics", str, "",
            "HOST:PORT to serve Prometheus metrics on (/metrics), e.g. 127.0.0.1:9108. Empty: off.",
        )

    def configure(self, updated: set[str]) -> None:
        from mitmproxy import ctx

        if "streamtap_metrics" not in updated:
            return
        text = ctx.options.streamtap_metrics.strip()
        try:
            address = parse_address(text) if text else None
        except ValueError as exc:
            raise exceptions.OptionsError(str(exc)) from None
        if address == self.address:
            return
        if address is None:
            self.stop()
            return
        try:
            server = self._serve_instead(address)
        except OSError as exc:
            if self.server is None and not self.started:  # the proxy starts without metrics: they never block traffic
                # a warning, not an error: mitmdump exits on an error logged while it starts
                log.warning(f"streamtap: cannot serve metrics on {text}: {exc}")
                return
            # set while the proxy runs: refused, and mitmproxy puts the option back (an endpoint that works stays)
            where = "they stay where they were" if self.server is not None else "they stay off"
            raise exceptions.OptionsError(f"streamtap: cannot serve metrics on {text}: {exc}; {where}") from None
        self.server, self.address = server, address
        if self not in self.tap.observers:
            self.tap.observers.append(self)
        host, port = self.server.server_address[:2]
        host = f"[{host}]" if ":" in host else host  # an IPv6 address in a URL
        log.info(f"streamtap: metrics on http://{host}:{port}/metrics")

    def _serve_instead(self, address: tuple[str, int]):
        """A server on ``address``, the old one closed once the new one listens; only a new
        address on the old one's port has to close it first (and gets it back if that fails)."""
        serve = lambda where: _start_server(where, self.metrics.registry)  # noqa: E731
        old, old_address = self.server, self.address
        if old is not None and old_address is not None and old_address[1] == address[1]:
            self._close(old)
            self.server = None
            try:
                return serve(address)
            except OSError:
                try:
                    self.server = serve(old_address)
                except OSError:
                    self.stop()
                raise
        server = serve(address)
        if old is not None:
            self._close(old)
        return server

    @staticmethod
    def _close(server) -> None:
        """Stop ``server`` without holding the proxy's loop: its port is free when this returns.

        ``shutdown()`` waits until ``serve_forever`` polls again (every 0.5 s), which on the loop
        would stall every stream in flight: it finishes on a thread. The listening socket closes
        here, so a new server can bind the same port at once; a plain close would not free it
        while the serving thread's poll still holds the socket, but a shutdown of it stops the
        listening at once."""
        try:
            server.socket.shutdown(socket.SHUT_RDWR)
        except OSError:  # some systems refuse it on a listening socket: the close still stops it, once the poll lets go
            pass
        server.server_close()
        threading.Thread(target=server.shutdown, name="streamtap metrics close", daemon=True).start()

    def turn_finished(self, flow, summary: dict[str, Any]) -> None:
        # the analysis named the model (the answer's, else the request's); only a flow it never
        # judged (its worker died), or whose request names none, has its request read here
        model = summary.get("model") or model_of(None, flow.request.pretty_url, _request_json(flow))
        self.metrics.count(summary, model)

    def tap_failed(self) -> None:
        self.metrics.errors.labels("tap").inc()

    def stop(self) -> None:
        if self.tap is not None and self in self.tap.observers:
            self.tap.observers.remove(self)
        if self.server is not None:
            self._close(self.server)
            self.server = None
            # turns finished while the metrics are off are not counted: served again, the counters
            # start anew (new _created times), which Prometheus reads as a reset, not as a quiet spell
            self.metrics = TurnMetrics(lambda: len(self.tap.open))
        self.address = None

    def done(self) -> None:
        self.stop()
