"""The fault catalog: spec strings in, a deterministic action plan out (sans-IO).

A fault is one short spec, ``KIND:key=value,key=value``; several are joined with ``;``::

    cut:event=37,style=abort        the body stops right after the event at position 37
    cut:byte=1200,style=clean       ... after 1200 body bytes
    cut:at=tool-args                ... at a protocol-aware position (providers/positions.py)
    stall:after=10,secs=95          pause 95 s after event 10 (the idle-timeout case)
    fragment:max=3                  re-chunk into writes of 1..3 bytes
    latency:ms=20,jitter=5          each write 20±5 ms late
    bandwidth:bps=80000             at most 80 000 bits per second
    corrupt:frame=12,field=crc,byte=0x22   set (or, without byte=, flip) one byte
    duplicate:event=N  reorder:event=N  drop:event=N
    error:kind=overloaded_error     the provider's own mid-stream error, after=N
    swap-tail:with=OTHER.jsonl      the tail of another recording, from at=N on

Event positions count the events as served (0 is the first one). ``plan()`` turns a
``Source`` plus faults plus a timing mode into a ``Plan``: a list of ``Write(data, at)``
actions (``at`` = seconds after the response started) ending in one ``End(style, at)``,
and a log line per fault naming its exact byte offset and event. Everything is
reproducible: the pseudo-random faults take a ``seed`` (default 0).

End styles: ``clean`` ends the HTTP message properly (the transport says "done": the
chunked terminator, or END_STREAM on HTTP/2); ``abort`` ends it as broken (HTTP/1.1: the
chunked body left unterminated and the connection closed, curl exit 18, httpx
``RemoteProtocolError``; HTTP/2: RST_STREAM on that stream only); ``reset`` closes the
connection with a TCP RST.
"""

from __future__ import annotations

import json
import math
import random
import re
from dataclasses import dataclass, field, replace
from typing import Any

from streamtap.providers import Dialect
from streamtap.providers.request import may_resume
from streamtap.providers.positions import (
    EVENTSTREAM_ONLY, NEEDS_THE_TURN, POSITION_NAMES, PositionFinder, find_positions, scan_positions,
)  # fmt: skip
from streamtap.recording.flows import INJECTED_HEADER
from streamtap.wire.jsonlines import element_framed

from .source import Frame, Source, view_frame

CUT_STYLES = ("clean", "abort", "reset")
CUT_POSITIONS = POSITION_NAMES
CORRUPT_FIELDS = ("payload", "crc", "prelude-crc", "length")

# kind -> {param: type}; a type is int, float, str or a tuple of allowed words
_PARAMS: dict[str, dict[str, Any]] = {
    "cut": {"event": int, "byte": int, "at": CUT_POSITIONS, "style": CUT_STYLES},
    "stall": {"after": int, "byte": int, "secs": float},
    "fragment": {"max": int, "seed": int},
    "latency": {"ms": float, "jitter": float, "seed": int},
    "bandwidth": {"bps": int},
    "corrupt": {"frame": int, "field": CORRUPT_FIELDS, "byte": int, "offset": int},
    "duplicate": {"event": int},
    "reorder": {"event": int},
    "drop": {"event": int},
    "error": {"kind": str, "after": int, "message": str},
    "swap-tail": {"with": str, "at": int},
}
_REQUIRED = {
    "stall": ("secs",),
    "fragment": ("max",),
    "latency": ("ms",),
    "bandwidth": ("bps",),
    "duplicate": ("event",),
    "reorder": ("event",),
    "drop": ("event",),
    "error": ("kind",),
    "swap-tail": ("with",),
}

ANTHROPIC_ERRORS = (
    "overloaded_error", "api_error", "rate_limit_error", "timeout_error", "invalid_request_error",
    "authentication_error", "permission_error", "not_found_error", "billing_error",
)  # fmt: skip
# the exception members of botocore's bedrock-runtime event-stream unions: InvokeModelWithResponseStream's
# ResponseStream, and ConverseStream's ConverseStreamOutput, which has no modelTimeoutException (an
# exception frame the union lacks reaches the app as an EventStreamError with no code nor message)
BEDROCK_INVOKE_EXCEPTIONS = (
    "modelStreamErrorException", "internalServerException", "throttlingException",
    "validationException", "serviceUnavailableException", "modelTimeoutException",
)  # fmt: skip
BEDROCK_CONVERSE_EXCEPTIONS = tuple(kind for kind in BEDROCK_INVOKE_EXCEPTIONS if kind != "modelTimeoutException")
BEDROCK_EXCEPTIONS = BEDROCK_INVOKE_EXCEPTIONS  # every Bedrock kind, of either operation
OPENAI_ERRORS = ("openai",)
KNOWN_ERRORS = ANTHROPIC_ERRORS + BEDROCK_EXCEPTIONS + OPENAI_ERRORS
# the error kinds whose shape each dialect's own stream carries (so its SDK raises them: the
# anthropic SDK skips the unnamed event of an OpenAI-shaped error, and the app sees a clean
# end). The openai kind takes each dialect's own error shape (Responses', Gemini's, Ollama's).
# A dialect not named here (unknown) takes every kind its wire format can carry.
_DIALECT_ERRORS = {
    Dialect.ANTHROPIC: ANTHROPIC_ERRORS,
    Dialect.OPENAI_CHAT: OPENAI_ERRORS, Dialect.OPENAI_RESPONSES: OPENAI_ERRORS,
    Dialect.GEMINI: OPENAI_ERRORS, Dialect.OLLAMA: OPENAI_ERRORS,
    Dialect.BEDROCK_INVOKE: BEDROCK_INVOKE_EXCEPTIONS, Dialect.BEDROCK_CONVERSE: BEDROCK_CONVERSE_EXCEPTIONS,
}  # fmt: skip


def _error_family(kind: str) -> tuple[str, ...]:
    """The kinds whose shape ``kind`` takes (a kind ending in _error or Exception is one
    of Anthropic's or Bedrock's, named or not)."""
    if kind in OPENAI_ERRORS:
        return OPENAI_ERRORS
    return BEDROCK_EXCEPTIONS if kind.endswith("Exception") else ANTHROPIC_ERRORS


def _fits_dialect(kind: str, own: tuple[str, ...]) -> bool:
    """``kind`` is one of ``own``, or a kind no list names in their shape (a newer error of the
    provider's); a named kind of the same shape that ``own`` lacks is one the SDK cannot name."""
    return kind in own or (kind not in KNOWN_ERRORS and _error_family(kind) is _error_family(own[0]))


class FaultSpecError(ValueError):
    """A fault spec that does not parse, or does not fit the recording it is applied to."""


@dataclass(frozen=True, slots=True)
class Fault:
    kind: str
    params: dict[str, Any]
    spec: str

    def __str__(self) -> str:
        return self.spec


def _refuse_control(spec: str) -> None:
    """A spec is written into a response header (and into logs): a line break there would end the
    header. Refused anywhere, its ends included, as the README says (not stripped away)."""
    control = next((c for c in spec if ord(c) < 0x20 or ord(c) == 0x7F), None)
    if control is not None:
        raise FaultSpecError(f"{spec!r}: a fault spec cannot hold a control character ({control!r} at character {spec.index(control)})")


def parse_fault(spec: str) -> Fault:
    _refuse_control(spec)
    spec = spec.strip()
    kind, _, rest = spec.partition(":")
    kind = kind.strip().lower()
    if kind not in _PARAMS:
        raise FaultSpecError(f"unknown fault {kind!r} in {spec!r}; known: {', '.join(_PARAMS)}")
    params: dict[str, Any] = {}
    for item in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not eq or not value:
            raise FaultSpecError(f"{spec!r}: expected key=value, got {item!r}")
        allowed = _PARAMS[kind]
        if key not in allowed:
            raise FaultSpecError(f"{spec!r}: {kind} takes {', '.join(allowed)}, not {key!r}")
        if key in params:  # which one was meant cannot be told
            raise FaultSpecError(f"{spec!r}: {key} is given twice")
        params[key] = _convert(spec, key, value, allowed[key])
    for key in _REQUIRED.get(kind, ()):
        if key not in params:
            raise FaultSpecError(f"{spec!r}: {kind} needs {key}=")
    if kind == "cut" and sum(k in params for k in ("byte", "at")) + ("event" in params and "at" not in params) != 1:
        raise FaultSpecError(f"{spec!r}: cut needs exactly one of event=, byte=, at=")
    if kind == "stall" and "after" in params and "byte" in params:  # plan() would take byte= and drop after= unsaid
        raise FaultSpecError(f"{spec!r}: stall takes after= or byte=, not both")
    if kind == "fragment" and params["max"] < 1:
        raise FaultSpecError(f"{spec!r}: fragment max must be >= 1")
    if kind == "bandwidth" and params["bps"] < 8:
        raise FaultSpecError(f"{spec!r}: bandwidth bps must be >= 8 (bits per second)")
    if kind == "corrupt" and "byte" in params and not 0 <= params["byte"] <= 255:
        raise FaultSpecError(f"{spec!r}: byte must be 0..255")
    if kind == "error":
        if params["kind"] not in KNOWN_ERRORS and not params["kind"].endswith(("_error", "Exception")):
            raise FaultSpecError(f"{spec!r}: error kind is one of {', '.join(KNOWN_ERRORS)}")
    return Fault(kind, params, spec)


def parse_faults(text: str | None) -> list[Fault]:
    """Several specs joined with ';' (empty or None: no fault)."""
    if not text:
        return []
    _refuse_control(text)
    return [parse_fault(part) for part in text.split(";") if part.strip()]


# The range of each number (inclusive). Event positions may be -1 (before the first event);
# times are bounded so that a plan never sleeps past a day or overflows a clock.
MAX_POSITION = 2**53  # events, bytes, frames: more than any recording holds
_RANGES: dict[str, tuple[float, float]] = {
    "event": (-1, MAX_POSITION), "after": (-1, MAX_POSITION), "at": (0, MAX_POSITION),
    "byte": (0, MAX_POSITION), "frame": (0, MAX_POSITION), "offset": (0, MAX_POSITION),
    "max": (1, MAX_POSITION), "seed": (0, 2**64), "bps": (8, 10**12),
    "secs": (0, 86_400), "ms": (0, 3_600_000), "jitter": (0, 3_600_000),
}  # fmt: skip


def _convert(spec: str, key: str, value: str, kind: Any) -> Any:
    if kind in (int, float):
        return _number(spec, key, value, kind)
    if isinstance(kind, tuple) and value not in kind:
        raise FaultSpecError(f"{spec!r}: {key} is one of {', '.join(kind)}, not {value!r}")
    return value


def _number(spec: str, key: str, value: str, kind: Any) -> int | float:
    """A finite number within the key's range, or a FaultSpecError that says which."""
    try:
        if not value.isascii():  # int() and float() take any script's digits; a spec is ASCII
            raise ValueError(value)
        number = _whole(value) if kind is int else _decimal(value)
    except ValueError:
        whole = " (a whole one, in decimal digits or hexadecimal after 0x)" if kind is int else ""
        raise FaultSpecError(f"{spec!r}: {key} must be a number{whole}, got {value!r}") from None
    if not math.isfinite(number):
        raise FaultSpecError(f"{spec!r}: {key} must be a finite number, got {value!r}")
    low, high = _RANGES.get(key, (0, MAX_POSITION))
    if number < low:
        raise FaultSpecError(f"{spec!r}: {key} must be >= {low}, got {value!r}")
    if number > high:
        raise FaultSpecError(f"{spec!r}: {key} must be <= {high}, got {value!r}")
    return number


_WHOLE = re.compile(r"-?(?:0[xX][0-9a-fA-F]+|[0-9]+)")
# (inf and nan read, for the check after to say a number must be finite)
_DECIMAL = re.compile(r"-?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?|[-+]?(?:inf(?:inity)?|nan)", re.IGNORECASE)


def _whole(value: str) -> int:
    """Decimal, leading zeros and all (``event=007``), or hexadecimal after ``0x`` (``byte=0x22``);
    not what int() takes besides (``1_000``, ``+5``, spaces), which the spec's grammar has not."""
    if not _WHOLE.fullmatch(value):
        raise ValueError(value)
    return int(value, 16) if value.lstrip("-")[:2].lower() == "0x" else int(value, 10)


def _decimal(value: str) -> float:
    """A decimal number (``secs=0.5``, ``1e-3``), not what else float() takes (``1_0``, ``+1``, spaces)."""
    if not _DECIMAL.fullmatch(value):
        raise ValueError(value)
    return float(value)


# --- timing -------------------------------------------------------------------------------


MAX_SCALE = 1000  # scale=N: recorded gaps at most a thousand times longer


@dataclass(frozen=True, slots=True)
class Timing:
    """``original`` (recorded gaps), ``scale=N`` (gaps times N) or ``fast``."""

    mode: str = "fast"
    factor: float = 1.0

    @classmethod
    def parse(cls, text: str) -> Timing:
        text = text.strip().lower()
        if text in ("fast", "original"):
            return cls(text)
        if text.startswith("scale="):
            try:
                factor = float(text[6:])
            except ValueError:
                factor = -1.0
            if 0 <= factor <= MAX_SCALE:  # also false for nan
                return cls("scale", factor)
        raise FaultSpecError(f"timing is fast, original or scale=N (0 <= N <= {MAX_SCALE}), not {text!r}")

    def seconds(self, t_ms: float) -> float:
        if self.mode == "fast":
            return 0.0
        return t_ms / 1000.0 * (self.factor if self.mode == "scale" else 1.0)

    def __str__(self) -> str:
        return f"scale={self.factor:g}" if self.mode == "scale" else self.mode


# --- the plan -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Write:
    data: bytes
    at: float  # seconds after the response started, not before


@dataclass(frozen=True, slots=True)
class End:
    style: str  # clean | abort | reset
    at: float


@dataclass(slots=True)
class Plan:
    writes: list[Write]
    end: End
    log: list[str] = field(default_factory=list)
    faults: str = ""  # the specs applied, joined with "; "

    @property
    def headers(self) -> list[tuple[str, str]]:
        """Response headers the plan adds: an answer made by fault injection says so, so that
        a proxy recording it (the Tap) never takes it for the upstream's own."""
        return [(INJECTED_HEADER, self.faults)] if self.faults else []

    @property
    def body(self) -> bytes:
        return b"".join(w.data for w in self.writes)


@dataclass(slots=True)
class _Piece:
    data: bytes
    t_ms: float


def plan(
    source: Source,
    faults: list[Fault] | None = None,
    timing: Timing | None = None,
    *,
    others: dict[str, Source] | None = None,
    start_after: int | None = None,
) -> Plan:
    """Everything the server writes for one response, and when.

    ``start_after``: serve only the events after this position (Last-Event-ID resume), a
    frame index of the stream with its tails swapped (``with_swapped_tails``).
    ``others``: recordings that ``swap-tail:with=`` names, loaded by the caller.
    """
    faults = list(faults or [])
    timing = timing or Timing()
    style = source.end_style
    if not faults and start_after is None and timing.mode == "fast":
        return _fast_plan(source)
    log: list[str] = []
    frames = list(source.frames)
    reshaped = False
    t0 = 0.0
    end_ms = source.duration_ms  # when the served stream's recorded end came (None: not known)
    # a swap-tail's at= names an event of both recordings, by their own numbering: it goes before
    # a resume; every other fault after it, so that it counts the events of the stream as served
    for fault in faults:
        if fault.kind == "swap-tail":
            before = frames
            frames = _EVENT_FAULTS[fault.kind](source, frames, fault, log, others or {})
            reshaped = True
            style = _ending_after(fault, style, others or {})
            end_ms = _swapped_end_ms(before, fault, others or {})
    resumed_after: list[Frame] = []  # the frames a resume skips: protocol positions are read from the stream's start
    if start_after is not None:
        t0 = frames[start_after].t_ms if 0 <= start_after < len(frames) else 0.0
        resumed_after = frames[: max(start_after + 1, 0)]
        frames = frames[start_after + 1 :]
        reshaped = True
    for fault in faults:
        if fault.kind in ("drop", "duplicate", "reorder", "corrupt", "error"):
            frames = _EVENT_FAULTS[fault.kind](source, frames, fault, log, others or {})
            reshaped = True
            style = _ending_after(fault, style, others or {})
    if reshaped and source.wire == "json-array":
        frames = _array_reframed(frames)
    if reshaped or not _reads_tile(source):
        pieces = [_Piece(f.raw, f.t_ms - t0) for f in frames]
    else:
        body = source.body
        pieces = [_Piece(body[o : o + n], t) for o, n, t in source.reads]
    ends = _event_ends(frames)
    stall_at: list[tuple[int, float]] = []
    # the earliest cut ends the stream, in its style; a later one is never reached
    cuts = {id(f): _cut_position(source, frames, ends, f, resumed_after) for f in faults if f.kind == "cut"}
    first_cut = min((f for f in faults if f.kind == "cut"), key=lambda f: cuts[id(f)][0], default=None)
    cut_at = cuts[id(first_cut)][0] if first_cut is not None else None
    for fault in faults:
        if fault.kind == "cut":
            position, what = cuts[id(fault)]
            if fault is first_cut:
                cut_style = fault.params.get("style", "clean")
                if cut_style == style and position == sum(len(piece.data) for piece in pieces):
                    # the client would get the answer as the recording ends it, marked as a fault
                    raise FaultSpecError(f"{fault.spec!r}: {what} is the end of the body ({position} bytes), which "
                                         f"ends {style} already: the cut would change nothing")
                pieces = _truncate(pieces, position)
                style = cut_style
                log.append(f"{fault.spec}: {style} cut at byte {position} ({what})")
            else:
                log.append(f"{fault.spec}: not reached, the stream is cut at byte {cut_at} by {first_cut.spec}")
        elif fault.kind == "stall":
            if "byte" in fault.params:
                position, what = _body_byte(frames, fault), f"byte {fault.params['byte']}"
            else:
                n = fault.params.get("after", len(ends) // 2)
                position, what = _event_end(ends, n, fault), f"after event {n}"
            stall_at.append((position, fault.params["secs"]))
            log.append(f"{fault.spec}: stall {fault.params['secs']:g} s at byte {position} ({what})")
    if cut_at is not None:  # a stall after the cut is never reached: the stream has ended
        for position, secs in stall_at:
            if position > cut_at:
                log.append(f"stall {secs:g} s at byte {position}: not reached, the stream is cut at byte {cut_at}")
        stall_at = [(position, secs) for position, secs in stall_at if position <= cut_at]
    for position, _secs in stall_at:
        pieces = _split_at(pieces, position)
    if first_cut is not None or any(f.kind == "error" for f in faults):
        end_ms = None  # the stream ends at the cut, or with the injected error: never at the recorded end
    writes = _schedule(pieces, timing, stall_at)
    for fault in faults:
        if fault.kind == "latency":
            writes = _latency(writes, fault)
            log.append(f"{fault.spec}: every write delayed {fault.params['ms']:g}±{fault.params.get('jitter', 0):g} ms")
        elif fault.kind == "fragment":
            writes = _fragment(writes, fault)
            log.append(f"{fault.spec}: {len(writes)} writes of 1..{fault.params['max']} bytes")
        elif fault.kind == "bandwidth":
            writes = _bandwidth(writes, fault)
            log.append(f"{fault.spec}: paced to {fault.params['bps']} bit/s")
    if timing.mode == "fast" and not any(f.kind in ("fragment", "bandwidth") for f in faults):
        writes = _coalesce(writes)
    served = sum(len(w.data) for w in writes)
    end_at = (writes[-1].at if writes else 0.0) + sum(secs for at, secs in stall_at if at >= served and served)
    if end_ms is not None and timing.mode != "fast":  # fast never waits, not even for the end
        end_at = max(end_at, _recorded_end_at(end_ms - t0, timing, stall_at, faults))
    if faults:
        _check_duration(end_at, faults, timing)
    return Plan(writes, End(style, end_at), log, "; ".join(f.spec for f in faults))


def _recorded_end_at(end_ms: float, timing: Timing, stalls: list[tuple[int, float]], faults: list[Fault]) -> float:
    """When the body ends as recorded: its terminator, FIN or reset came ``end_ms`` after the
    response started, often well after the last read (an upstream that holds the connection
    before it ends it). It is held back as a write would be: by every stall before it, and by
    the mean delay of each latency fault."""
    delay = sum(secs for _at, secs in stalls)
    delay += sum(f.params["ms"] / 1000.0 for f in faults if f.kind == "latency")
    return timing.seconds(end_ms) + delay


def _swapped_end_ms(frames: list[Frame], fault: Fault, others: dict[str, Source]) -> float | None:
    """When a stream whose tail ``fault`` swapped ends: the other recording's end, moved as its tail is."""
    other = others[fault.params["with"]]
    if other.duration_ms is None:
        return None
    i, _j, shift = _swap_point(frames, other, fault)
    return max(frames[i].t_ms, other.duration_ms + shift)


# --- bounds on a plan ----------------------------------------------------------------------
# A plan is built whole before its first byte goes out, and a server may keep it for the next
# request: a fault header that asks for a write per byte of a large recording (fragment:max=1,
# bandwidth:bps=8) would cost seconds of planning and hundreds of MB for one request. Such a
# plan is refused, before any of it is built wherever its size can be told in advance.

MAX_PLAN_WRITES = 1_000_000
# No test waits a week for an answer; a plan that lasts longer (bandwidth:bps=8 on a large body,
# many day-long stalls) is a mistake, and would hold its connection and its cached plan for it.
MAX_PLAN_DAYS = 7


def _check_write_count(fault: Fault, writes: int, had: int, advice: str) -> None:
    """Refuse ``fault`` when it takes the plan past MAX_PLAN_WRITES writes (``had``: how many there
    were before it; a recording of more reads than that is served as recorded)."""
    if writes > max(MAX_PLAN_WRITES, had):
        raise FaultSpecError(
            f"{fault.spec!r}: the answer would take more than {MAX_PLAN_WRITES:,} writes (at least {writes:,}), "
            f"the most a plan may have; {advice}"
        )


def _check_duration(end_at: float, faults: list[Fault], timing: Timing | None = None) -> None:
    if end_at > MAX_PLAN_DAYS * 86_400:
        specs = "; ".join(f.spec for f in faults)
        timed = f" (timing {timing})" if timing is not None else ""
        raise FaultSpecError(
            f"{specs!r}{timed}: the answer would last {end_at / 86_400:.1f} days, longer than "
            f"the {MAX_PLAN_DAYS} days a plan may last; use shorter or fewer stalls, a higher bps= or a smaller scale="
        )


def _ceil_div(n: int, d: int) -> int:
    return -(-n // d)


def _ending_after(fault: Fault, style: str, others: dict[str, Source]) -> str:
    """How the served stream ends once ``fault`` reshaped it: an injected error ends the answer
    (the rest is dropped), a swapped tail ends as the recording it comes from did."""
    if fault.kind == "error":
        return "clean"
    if fault.kind == "swap-tail":
        return others[fault.params["with"]].end_style
    return style


def _fast_plan(source: Source, size: int = 1024 * 1024) -> Plan:
    """No fault, no timing: the body in large writes (what `_coalesce` would give, without the copies)."""
    body = source.body
    writes = [Write(body[i : i + size], 0.0) for i in range(0, len(body), size)] or [Write(b"", 0.0)]
    return Plan(writes, End(source.end_style, 0.0), [])


def _reads_tile(source: Source) -> bool:
    if not source.reads:
        return False
    expected = 0
    for offset, length, _t in source.reads:
        if offset != expected:
            return False
        expected += length
    return expected == sum(len(f.raw) for f in source.frames)


def _event_ends(frames: list[Frame]) -> list[int]:
    """Byte offset just after each event, by served position (tail bytes excluded)."""
    ends, pos = [], 0
    for f in frames:
        pos += len(f.raw)
        if f.seq is not None:
            ends.append(pos)
    return ends


def _event_end(ends: list[int], n: int, fault: Fault) -> int:
    if n == -1:
        return 0
    if not 0 <= n < len(ends):
        raise FaultSpecError(f"{fault.spec!r}: event {n} does not exist (this stream has {len(ends)} events)")
    return ends[n]


def _truncate(pieces: list[_Piece], position: int) -> list[_Piece]:
    out, pos = [], 0
    for p in pieces:
        if pos >= position:
            break
        keep = p.data[: position - pos]
        out.append(_Piece(keep, p.t_ms))
        pos += len(keep)
    return out


def _split_at(pieces: list[_Piece], position: int) -> list[_Piece]:
    out, pos = [], 0
    for p in pieces:
        if pos < position < pos + len(p.data):
            cut = position - pos
            out += [_Piece(p.data[:cut], p.t_ms), _Piece(p.data[cut:], p.t_ms)]
        else:
            out.append(p)
        pos += len(p.data)
    return out


def _schedule(pieces: list[_Piece], timing: Timing, stalls: list[tuple[int, float]]) -> list[Write]:
    writes, pos, last = [], 0, 0.0
    for p in pieces:
        delay = sum(secs for at, secs in stalls if at <= pos)
        at = max(last, timing.seconds(p.t_ms)) + delay
        if p.data:
            writes.append(Write(p.data, at))
        last = max(last, timing.seconds(p.t_ms))
        pos += len(p.data)
    if not writes:
        delay = sum(secs for _at, secs in stalls)
        writes.append(Write(b"", delay))
    return writes


def _latency(writes: list[Write], fault: Fault) -> list[Write]:
    rng = random.Random(fault.params.get("seed", 0))
    ms, jitter = fault.params["ms"], fault.params.get("jitter", 0.0)
    out, last = [], 0.0
    for w in writes:
        at = max(last, w.at + max(0.0, ms + rng.uniform(-jitter, jitter)) / 1000.0)
        out.append(Write(w.data, at))
        last = at
    return out


def _fragment(writes: list[Write], fault: Fault) -> list[Write]:
    largest = fault.params["max"]
    size = sum(len(w.data) for w in writes)
    # pieces average (max+1)/2 bytes: a max= this large gives about MAX_PLAN_WRITES / 2 writes
    advice = f"use fragment:max={_ceil_div(4 * size, MAX_PLAN_WRITES)} or more for this {size:,}-byte body"
    # the fewest pieces it can give, known before any is made: max=1 on a large body is refused here
    _check_write_count(fault, sum(_ceil_div(len(w.data), largest) for w in writes), len(writes), advice)
    rng = random.Random(fault.params.get("seed", 0))
    out: list[Write] = []
    for w in writes:
        out += [Write(piece, w.at) for piece in _random_pieces(w.data, rng, largest)]
        _check_write_count(fault, len(out), len(writes), advice)  # random sizes may still give too many
    return out or writes


def _random_pieces(data: bytes, rng: random.Random, largest: int) -> list[bytes]:
    """``data`` in pieces of 1..largest bytes (sliced by index: a re-slice of the rest per piece is quadratic)."""
    pieces, i = [], 0
    while i < len(data):
        n = rng.randint(1, largest)
        pieces.append(data[i : i + n])
        i += n
    return pieces


def _bandwidth(writes: list[Write], fault: Fault) -> list[Write]:
    rate = fault.params["bps"] / 8.0  # bytes per second
    quantum = max(1, int(rate / 100))  # about 10 ms of bytes per write
    size = sum(len(w.data) for w in writes)
    # a rate of 800 bit/s per byte of quantum: this one writes the body in about MAX_PLAN_WRITES / 2 writes
    fewest_bps = 800 * _ceil_div(2 * size, MAX_PLAN_WRITES)
    advice = f"use bandwidth:bps={fewest_bps} or more for this {size:,}-byte body"
    _check_write_count(fault, sum(_ceil_div(len(w.data), quantum) for w in writes), len(writes), advice)
    _check_duration(size / rate, [fault])  # the pacing alone, known before a write is made
    out, clock = [], 0.0
    for w in writes:
        for i in range(0, len(w.data), quantum):
            piece = w.data[i : i + quantum]
            clock = max(clock, w.at)
            out.append(Write(piece, clock))
            clock += len(piece) / rate
    return out or writes


def _coalesce(writes: list[Write], limit: int = 256 * 1024) -> list[Write]:
    out: list[Write] = []
    buf: list[bytes] = []
    size, at = 0, None
    for w in writes:
        if buf and (w.at != at or size + len(w.data) > limit):
            out.append(Write(b"".join(buf), at))
            buf, size = [], 0
        buf.append(w.data)
        size += len(w.data)
        at = w.at
    if buf:
        out.append(Write(b"".join(buf), at))
    return out


# --- event-level faults -------------------------------------------------------------------


def _positions(frames: list[Frame]) -> list[int]:
    """Index into frames of each event, by served position."""
    return [i for i, f in enumerate(frames) if f.seq is not None]


def _frame_index(frames: list[Frame], n: int, fault: Fault) -> int:
    idx = _positions(frames)
    if not 0 <= n < len(idx):
        raise FaultSpecError(f"{fault.spec!r}: event {n} does not exist (this stream has {len(idx)} events)")
    return idx[n]


def _offset_of(frames: list[Frame], i: int) -> int:
    return sum(len(f.raw) for f in frames[:i])


def _array_reframed(frames: list[Frame]) -> list[Frame]:
    """A JSON array's elements after faults moved, repeated or left some out: each with the
    opener its new place needs (the fault names an event, not the array's framing), and the
    array still opened when none is left."""
    out: list[Frame] = []
    first = True
    for frame in frames:
        if frame.seq is not None:  # an element (or an injected one); not the closing ] or other bytes
            raw = element_framed(frame.raw, first)
            first = False
            frame = frame if raw is frame.raw else replace(frame, raw=raw)
        out.append(frame)
    if first and out and out[0].raw.lstrip().startswith(b"]"):
        out[0] = replace(out[0], raw=b"[" + out[0].raw)
    return out


def _drop(source, frames, fault, log, others):
    i = _frame_index(frames, fault.params["event"], fault)
    log.append(f"{fault.spec}: dropped event {fault.params['event']} ({len(frames[i].raw)} bytes at byte {_offset_of(frames, i)})")
    return frames[:i] + frames[i + 1 :]


def _duplicate(source, frames, fault, log, others):
    i = _frame_index(frames, fault.params["event"], fault)
    log.append(f"{fault.spec}: event {fault.params['event']} sent twice (again at byte {_offset_of(frames, i + 1)})")
    return frames[: i + 1] + [frames[i]] + frames[i + 1 :]


def _reorder(source, frames, fault, log, others):
    n = fault.params["event"]
    i = _frame_index(frames, n, fault)
    if n + 1 >= len(_positions(frames)):
        raise FaultSpecError(f"{fault.spec!r}: event {n} is the last of this stream's {n + 1} events: no event "
                             "after it to swap it with")
    j = _frame_index(frames, n + 1, fault)
    out = list(frames)
    out[i], out[j] = replace(frames[j], t_ms=frames[i].t_ms), replace(frames[i], t_ms=frames[j].t_ms)
    log.append(f"{fault.spec}: events {n} and {n + 1} swapped (at byte {_offset_of(frames, i)})")
    return out


def _corrupt(source, frames, fault, log, others):
    n = fault.params.get("frame", len(_positions(frames)) // 2)
    i = _frame_index(frames, n, fault)
    raw, at, old = corrupt_raw(frames[i].raw, source.wire, fault)
    log.append(
        f"{fault.spec}: event {n} {fault.params.get('field', 'payload')} (body byte {_offset_of(frames, i) + at}) "
        f"0x{old:02x} -> 0x{raw[at]:02x}"
    )
    out = list(frames)
    out[i] = replace(frames[i], raw=raw)
    return out


def corrupt_raw(raw: bytes, wire: str, fault: Fault) -> tuple[bytes, int, int]:
    """(the corrupted frame, the offset changed inside it, the old byte value)."""
    data = bytearray(raw)
    where = fault.params.get("field", "payload")
    view = view_frame(raw, wire)
    if wire == "eventstream":
        base = {"crc": len(data) - 4, "prelude-crc": 8, "length": 0, "payload": view.payload_start}[where]
        size = {"crc": 4, "prelude-crc": 4, "length": 4, "payload": view.payload_end - view.payload_start}[where]
        default = {"length": 3, "payload": size // 2}.get(where, 0)
    elif where == "payload":
        base, size = view.payload_start, view.payload_end - view.payload_start
        default = size // 2
    else:
        raise FaultSpecError(f"{fault.spec!r}: field={where} needs an event-stream recording; use field=payload")
    offset = fault.params.get("offset", default)
    if not 0 <= offset < max(size, 1) or base + offset >= len(data):
        raise FaultSpecError(f"{fault.spec!r}: offset {offset} is outside the {where} ({size} bytes)")
    at = base + offset
    old = data[at]
    data[at] = fault.params["byte"] if "byte" in fault.params else old ^ 0xFF
    if data[at] == old:
        raise FaultSpecError(f"{fault.spec!r}: byte 0x{old:02x} is already there: the fault would change nothing")
    return bytes(data), at, old


def _error(source, frames, fault, log, others):
    n = fault.params.get("after", len(_positions(frames)) // 2)
    i = _frame_index(frames, n, fault) if n >= 0 else -1
    kind = fault.params["kind"]
    message = fault.params.get("message")
    t = frames[i].t_ms if i >= 0 else 0.0
    before = StreamSoFar(source.dialect, source.wire)
    for frame in frames[: i + 1]:
        before.see(frame.raw)
    if before.sdk_stopped_at is not None:  # the SDK never reads the error: it would return the answer, not raise
        stop = sum(1 for f in frames[: before.sdk_stopped_at] if f.seq is not None)
        raise FaultSpecError(_past_sdk_stop(fault, source.dialect, stop, before.sdk_stop))
    # the array's closing bracket is no event: a later drop, duplicate or reorder moves the error element alone
    injected = [Frame(None if raw is ARRAY_CLOSE else -1, raw, t) for raw in error_frames(source, kind, message, before)]
    log.append(f"{fault.spec}: {kind} injected after event {n} at byte {_offset_of(frames, i + 1)}; the rest is dropped")
    return frames[: i + 1] + injected


OPENAI_MESSAGE = "The server had an error while processing your request."


@dataclass(slots=True)
class StreamSoFar:
    """What an injected error takes from the events served before it, kept as they pass, so that
    replay and live faults write the same bytes: how many there were, the line ending a Gemini
    stream uses, and for Responses the last ``sequence_number``, the response object and the
    items finished (the ``response.failed`` that follows the error carries them, as OpenAI's does)."""

    dialect: str = "unknown"
    wire: str = "sse"
    events: int = 0
    crlf: bool = True  # Gemini frames its SSE with CRLF (provider-streams.md §5.1), unless the stream shows LF
    sequence_number: int | None = None
    response: dict[str, Any] | None = None
    finished: dict[int, Any] = field(default_factory=dict)  # output_index -> the item of output_item.done
    # the event (counting what ``see`` took, from 0) where the dialect's SDK stopped reading the body
    # (Chat Completions' [DONE]): an error injected after it never reaches the app
    sdk_stopped_at: int | None = None
    sdk_stop: bytes = b""  # that event
    _reader: Any = field(default=None, repr=False)  # (decoder, assembler) while the SDK may still stop

    def __post_init__(self) -> None:
        self._reader = _sdk_reader(self.dialect, self.wire)

    def see(self, raw: bytes) -> None:
        self.events += 1
        self.crlf = raw.endswith(b"\r\n") or not raw.endswith(b"\n")
        if self.dialect == Dialect.OPENAI_RESPONSES:
            self._see_responses_event(raw)
        if self._reader is not None:
            self._see_as_the_sdk(raw)

    def _see_as_the_sdk(self, raw: bytes) -> None:
        """The dialect's assembler says where its SDK stops reading (``sdk_stopped_reading``, see
        providers/assembler.py): asked here, not guessed from the bytes."""
        from streamtap.wire import Malformed, Tail

        decoder, assembler = self._reader
        try:
            for event in decoder.feed(raw):
                if not isinstance(event, Malformed | Tail):  # as StreamSession feeds its assembler
                    assembler.feed(event, None)
            stopped = assembler.sdk_stopped_reading
        except Exception:  # fail open, as the session does: where the SDK stops stays unknown, nothing is refused
            self._reader = None
            return
        if stopped:
            self.sdk_stopped_at, self.sdk_stop, self._reader = self.events - 1, raw, None

    def _see_responses_event(self, raw: bytes) -> None:
        from streamtap.wire import SSEDecoder

        decoder = SSEDecoder()
        for event in [*decoder.feed(raw), *decoder.close()]:
            try:
                obj = json.loads(event.data)
            except ValueError:  # a corrupted or cut event: nothing to take from it
                continue
            if not isinstance(obj, dict):
                continue
            if isinstance(obj.get("sequence_number"), int):
                self.sequence_number = obj["sequence_number"]
            if isinstance(obj.get("response"), dict):
                self.response = obj["response"]
            if obj.get("type") == "response.output_item.done" and isinstance(obj.get("output_index"), int):
                self.finished[obj["output_index"]] = obj.get("item")


def _sdk_reader(dialect: str, wire: str) -> tuple[Any, Any] | None:
    """A decoder and the dialect's assembler, for a dialect whose SDK may stop reading before the
    body ends; None for the others (nothing to ask, nothing to pay for)."""
    from streamtap.providers.session import make_assembler

    try:
        assembler = make_assembler(Dialect(dialect), wire)
    except (ValueError, KeyError, ImportError):  # an unknown dialect or wire
        return None
    if not hasattr(type(assembler), "sdk_stopped_reading"):
        return None
    return _decoder(wire), assembler


def _past_sdk_stop(fault: Fault, dialect: str, stop: int, raw: bytes) -> str:
    """Why an error after event ``stop`` (``raw``), where the SDK stopped reading, is no fault to inject."""
    head = raw.strip().decode("utf-8", "replace").splitlines()[-1][:40] if raw.strip() else ""
    earlier = f"after={stop - 1} or earlier" if stop > 0 else "after=-1"
    return (f"{fault.spec!r}: the {dialect} dialect's SDK stops reading at event {stop} ({head}), "
            f"so an error after it never reaches the app; use {earlier}")


def error_frames(source: Source, kind: str, message: str | None, before: StreamSoFar) -> list[bytes]:
    """The provider's own mid-stream error, in the recording's wire format, after the events ``before``."""
    if source.wire == "eventstream" and not kind.endswith("Exception"):
        fitting = _DIALECT_ERRORS.get(source.dialect, BEDROCK_EXCEPTIONS)  # the operation's own kinds
        raise FaultSpecError(f"error kind {kind!r} does not fit an event-stream; use one of {', '.join(fitting)}")
    own = _DIALECT_ERRORS.get(source.dialect)  # the kind must also be one the dialect's own SDK raises
    if own is not None and not _fits_dialect(kind, own):
        raise FaultSpecError(f"error kind {kind!r} does not fit the {source.dialect} dialect; use one of {', '.join(own)}")
    if source.wire == "eventstream":
        from streamtap.wire import encode_message

        payload: dict[str, Any] = {"message": message or "Model Stream Error"}
        if kind == "modelStreamErrorException":
            payload |= {"originalStatusCode": 500, "originalMessage": message or "The model stream failed."}
        headers = {":message-type": "exception", ":exception-type": kind, ":content-type": "application/json"}
        return [encode_message(headers, json.dumps(payload, separators=(",", ":")).encode())]
    if kind.endswith("Exception"):
        raise FaultSpecError(f"error kind {kind!r} needs an event-stream (Bedrock) recording")
    if kind == "openai":
        return _openai_error(source, message or OPENAI_MESSAGE, before)
    if source.wire != "sse":
        raise FaultSpecError(f"error kind {kind!r} needs an SSE recording")
    body = {"type": "error", "error": {"type": kind, "message": message or ("Overloaded" if kind == "overloaded_error" else "Injected by streamtap")}}
    return [b"event: error\ndata: " + _json(body) + b"\n\n"]


ARRAY_CLOSE = b"]"


def _openai_error(source: Source, message: str, before: StreamSoFar) -> list[bytes]:
    """The openai kind, in the shape of the dialect's own in-band error."""
    if source.dialect == Dialect.OPENAI_RESPONSES:
        return _responses_error(message, before)
    if source.wire == "ndjson":
        return [_json({"error": message}) + b"\n"]
    if source.dialect == Dialect.GEMINI or source.wire == "json-array":
        # Gemini's error object (google-genai raises on it); its stream has no [DONE] sentinel
        error = _json({"error": {"code": 500, "message": message, "status": "INTERNAL"}})
        if source.wire == "json-array":  # an element of the array, which the error closes (the rest is dropped)
            return [(b"," if before.events else b"[") + error, ARRAY_CLOSE]
        return [b"data: " + error + (b"\r\n\r\n" if before.crlf else b"\n\n")]
    body = {"error": {"message": message, "type": "server_error", "param": None, "code": None}}
    return [b"data: " + _json(body) + b"\n\n", b"data: [DONE]\n\n"]


def _responses_error(message: str, before: StreamSoFar) -> list[bytes]:
    """OpenAI's own failure of a Responses stream: the ``error`` event nests the error (the openai
    SDK raises APIError on a payload with a top-level ``error``; the flat shape of its type
    reaches the app as a plain event), then ``response.failed`` ends the response."""
    number = before.events if before.sequence_number is None else before.sequence_number + 1
    error = {"type": "server_error", "code": "server_error", "message": message, "param": None}
    response = dict(before.response or {"object": "response"})
    response |= {"status": "failed", "error": {"code": "server_error", "message": message},
                 "output": [before.finished[i] for i in sorted(before.finished)]}
    return [
        b"event: error\ndata: " + _json({"type": "error", "sequence_number": number, "error": error}) + b"\n\n",
        b"event: response.failed\ndata: "
        + _json({"type": "response.failed", "sequence_number": number + 1, "response": response})
        + b"\n\n",
    ]


def _json(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def _swap_tail(source, frames, fault, log, others):
    other = others.get(fault.params["with"])
    if other is None:
        raise FaultSpecError(f"{fault.spec!r}: recording {fault.params['with']!r} was not loaded")
    if other.wire != source.wire:
        raise FaultSpecError(f"{fault.spec!r}: {fault.params['with']} is {other.wire}, this recording is {source.wire}")
    n = fault.params.get("at", len(_positions(frames)) // 2)
    i, j, shift = _swap_point(frames, other, fault)
    tail = [replace(f, t_ms=max(frames[i].t_ms, f.t_ms + shift)) for f in other.frames[j + 1 :]]
    log.append(f"{fault.spec}: after event {n} (byte {_offset_of(frames, i + 1)}) the tail of {fault.params['with']} ({len(tail)} events)")
    return frames[: i + 1] + tail


def with_swapped_tails(source: Source, faults: list[Fault], others: dict[str, Source] | None = None) -> Source:
    """``source`` with the tails that the swap-tail faults among ``faults`` swap in, as ``plan``
    serves it before a resume starts it after an event: the ids a client was served, and may
    resume from, are this stream's, and ``start_after`` is a frame index of it."""
    if not any(fault.kind == "swap-tail" for fault in faults):
        return source
    frames = list(source.frames)
    for fault in faults:
        if fault.kind == "swap-tail":
            frames = _swap_tail(source, frames, fault, [], others or {})
    return replace(source, frames=frames, reads=[])


def _swap_point(frames: list[Frame], other: Source, fault: Fault) -> tuple[int, int, float]:
    """Where a swap-tail joins: the index of its at= event in ``frames`` and in ``other``, and the
    shift that moves ``other``'s times to follow on from ``frames``'."""
    n = fault.params.get("at", len(_positions(frames)) // 2)
    i = _frame_index(frames, n, fault)
    events = len(_positions(other.frames))
    if n + 1 >= events:  # swapping in nothing would be a plain cut, under a fault that names a tail
        fitting = f"; give at= below {events - 1}" if events > 1 else ""
        raise FaultSpecError(f"{fault.spec!r}: {fault.params['with']} has no tail after event {n} "
                             f"(it has {events} event{'s' if events != 1 else ''}){fitting}")
    j = _frame_index(other.frames, n, fault)
    return i, j, frames[i].t_ms - other.frames[j].t_ms


_EVENT_FAULTS = {
    "drop": _drop,
    "duplicate": _duplicate,
    "reorder": _reorder,
    "corrupt": _corrupt,
    "error": _error,
    "swap-tail": _swap_tail,
}


# --- protocol-aware cut positions ----------------------------------------------------------


def _cut_position(
    source: Source, frames: list[Frame], ends: list[int], fault: Fault, resumed_after: list[Frame] | None = None
) -> tuple[int, str]:
    """Where ``fault`` cuts the body ``frames``; ``resumed_after``: the frames a resume skipped. A
    position read off the turn is read off the whole stream (the turn starts in them), then placed in
    the body; one read off a single event (an escaped quote) is the body's own."""
    p = fault.params
    if "byte" in p:
        return _body_byte(frames, fault), f"byte {p['byte']}"
    if "at" not in p:
        return _event_end(ends, p["event"], fault), f"after event {p['event']}"
    _check_picked_message(fault, len(ends))
    skipped = (resumed_after or []) if p["at"] in NEEDS_THE_TURN else []
    shift = sum(len(f.raw) for f in skipped)
    skipped_events = sum(1 for f in skipped if f.seq is not None)
    pick = p.get("event", len(ends) // 2) + skipped_events if skipped else p.get("event")
    pieces = ((f.raw, f.seq is not None) for f in [*skipped, *frames])
    finder = scan_positions(pieces, source.dialect, source.wire, only=p["at"], pick=pick, judging=judging(source))
    position = finder.found.get(p["at"])
    if position is None:
        why = f": {finder.missing[p['at']]}" if p["at"] in finder.missing else ""
        raise FaultSpecError(f"{fault.spec!r}: this {source.wire} recording has no {p['at']} position{why}")
    if not skipped:
        return position.offset, position.what
    if position.offset < shift:
        raise FaultSpecError(f"{fault.spec!r}: the {p['at']} position ({position.what}, counting from the stream's first "
                             f"event) lies before the resume point, after event {skipped_events - 1}: this body does not hold it")
    resumed = f"counting from the stream's first event: this body resumes after event {skipped_events - 1}"
    return position.offset - shift, f"{position.what}, {resumed}"


def _body_byte(frames: list[Frame], fault: Fault) -> int:
    """The fault's ``byte=``, which must fall inside the body served (its end included)."""
    total = sum(len(f.raw) for f in frames)
    if not 0 <= fault.params["byte"] <= total:
        raise FaultSpecError(f"{fault.spec!r}: byte {fault.params['byte']} is past the end ({total} bytes)")
    return fault.params["byte"]


def _check_picked_message(fault: Fault, events: int | None = None) -> None:
    """``cut:at=prelude|crc,event=N`` picks the message whose prelude or CRC is cut; no other
    position takes ``event=``, and no message comes before the first or after the last (of
    ``events``, when the stream is known)."""
    p = fault.params
    if "at" in p and "event" in p:
        if p["at"] not in ("prelude", "crc"):
            raise FaultSpecError(f"{fault.spec!r}: event= picks the message of at=prelude or at=crc, not of at={p['at']}")
        if p["event"] < 0:
            raise FaultSpecError(f"{fault.spec!r}: event {p['event']} is no message (the first is event 0)")
        if events is not None and p["event"] >= events:
            raise FaultSpecError(f"{fault.spec!r}: event {p['event']} does not exist (this stream has {events} events)")


def judging(source: Source) -> dict[str, Any]:
    """The StreamSession options a recording's answer was judged with (its header keeps them):
    its positions, and the sweep's verdicts, read the turn its verdict speaks of."""
    options: dict[str, Any] = {"http_status": source.status, "sentinel": source.sentinel, "streamed": source.streamed,
                               "may_resume": may_resume(source.method, source.url)}
    if source.max_event_size:
        options["max_event_size"] = source.max_event_size
    return options


def protocol_positions(
    source: Source, frames: list[Frame] | None = None, *, only: str | None = None, pick: int | None = None
) -> list[tuple[str, int, str]]:
    """(name, byte offset, description) for each protocol-aware cut position the stream has
    (the providers layer reads them off the dialect's own turn: see providers/positions.py)."""
    frames = source.frames if frames is None else frames
    found = find_positions(((f.raw, f.seq is not None) for f in frames), source.dialect, source.wire, only=only, pick=pick,
                           judging=judging(source))
    return [(p.name, p.offset, p.what) for p in found]


def event_boundaries(source: Source) -> list[int]:
    """Every position N for ``cut:event=N`` (after each event but the last)."""
    n = sum(1 for f in source.frames if f.seq is not None)
    return list(range(-1, n - 1)) if n else []


# --- live traffic --------------------------------------------------------------------------


@dataclass(slots=True)
class _Waiting:
    """A served event held back while a protocol-aware cut may still fall inside it."""

    event: int  # its index among the events served (what the position finders saw)
    raw: bytes
    at: int  # its body offset as served


@dataclass(slots=True, eq=False)
class _Stage:
    """One reshaping fault on a live stream. It numbers the events as the faults before it in
    the spec passed them on, as ``plan()`` applies each to the frames the earlier ones made."""

    fault: Fault
    seen: int = 0  # events that came in
    offset: int = 0  # body bytes that came in, before the event in hand
    held: tuple[bytes, int] | None = None  # reorder: the event waiting for the next one, and its offset
    done: bool = False  # error: injected, every later event is dropped
    spared: bool = False  # error: the SDK stopped reading before its event, the stream passes unchanged
    before: StreamSoFar | None = None  # error: what the events it took tell the injected error


LIVE_KINDS = ("cut", "corrupt", "drop", "duplicate", "reorder", "error", "fragment")
_RESHAPING = ("drop", "duplicate", "reorder", "corrupt", "error")  # in the spec's order, as plan() applies them


def reads_events(faults: list[Fault]) -> bool:
    """Whether live ``faults`` read the events as they pass (all but byte cuts and fragment, which
    work on the bytes as they came, compressed or not)."""
    return any(f.kind != "fragment" and not (f.kind == "cut" and "byte" in f.params) for f in faults)


class LiveFaults:
    """The same faults on a body that is still arriving (the mitmproxy addon's live mode).

    ``feed(chunk)`` returns the pieces to forward now; once a cut or an injected error
    ends the stream, ``end`` holds the style ("clean", "abort", "reset") and every later
    chunk is swallowed. Event-level faults hold bytes back until their event is complete.
    Positions count the events as served, as in replay: drop, duplicate, reorder, corrupt
    and error each number the events the faults before them passed on, and the cuts number
    the events the client gets. A protocol-aware cut holds back the events it may still fall
    in (a tool call's, until its arguments are known), and a cut found waits while another may
    still be found earlier: the earliest ends the stream, at a tie the first in the spec, as in replay.
    Where replay defaults to the middle event (error's after=, corrupt's frame=, the message of
    cut:at=prelude|crc), a live spec must name it: the middle of a stream still arriving is unknown.
    Timing faults (stall, latency, bandwidth) and swap-tail need a recording (use replay).
    """

    def __init__(self, faults: list[Fault], wire: str, dialect: str = "unknown") -> None:
        for fault in faults:
            if fault.kind not in LIVE_KINDS:
                raise FaultSpecError(f"{fault.spec!r}: {fault.kind} works on replays only (streamtap_replay / streamtap serve)")
        self.faults = faults
        self.wire = wire
        self.source = Source.from_frames([], wire=wire, dialect=dialect)
        for fault in faults:  # what does not fit this wire is refused now, not at its event mid-stream
            check_live_fault(fault)
            if fault.kind == "corrupt" and fault.params.get("field", "payload") != "payload" and wire != "eventstream":
                raise FaultSpecError(f"{fault.spec!r}: field={fault.params['field']} needs an event-stream; use field=payload")
            if fault.kind == "error":
                try:
                    error_frames(self.source, fault.params["kind"], None, StreamSoFar(dialect))
                except FaultSpecError as exc:
                    raise FaultSpecError(f"{fault.spec!r}: {exc}") from None
        self.end: str | None = None
        self.log: list[str] = []
        self._framed = reads_events(faults)
        self._decoder = _decoder(wire) if self._framed else None
        self._n = 0  # events that came from the upstream
        self._sent = 0  # body bytes forwarded
        self._stages = [_Stage(f, before=StreamSoFar(dialect, wire) if f.kind == "error" else None) for f in faults if f.kind in _RESHAPING]
        self._closes_array = False  # an injected error's JSON array element: the array's ] follows the stream's end
        self._erred: int | None = None  # the stage whose injected error ends the stream, until it has
        self._order = {id(f): i for i, f in enumerate(faults)}  # ties between cuts go to the first in the spec
        self._ending: tuple[int, Fault, str] | None = None  # the cut that ends the stream: its position, fault, what
        # the earliest cut found so far (an event cut or a protocol-aware one), waiting while a finder may
        # still find an earlier position: its body offset, fault, what (for the log) and event
        self._pending: tuple[int, Fault, str, int] | None = None
        self._event_cuts = [f for f in faults if f.kind == "cut" and "event" in f.params and "at" not in f.params]
        self._served = 0  # events served (after the reshaping faults)
        self._at = 0  # body offset of the next event served (held back or forwarded)
        self._told: set[int] = set()  # the faults (by id) that logged what they did, or why not
        self._pieces = 0  # writes out of fragment
        # a protocol-aware cut: the providers layer finds its position as the events pass
        self._finders = [
            (fault, PositionFinder(dialect, wire, frozenset([fault.params["at"]]), fault.params.get("event", 0)))
            for fault in faults
            if fault.kind == "cut" and "at" in fault.params
        ]
        for fault, finder in self._finders:  # a position this stream can never have is refused now, as replay refuses it
            name = fault.params["at"]
            if name not in finder.wanted:
                why = "it lies inside an event-stream message" if name in EVENTSTREAM_ONLY else f"the stream's dialect ({dialect}) has no turn to read it from"
                raise FaultSpecError(f"{fault.spec!r}: this {wire} stream has no {name} position ({why})")
        self._waiting: list[_Waiting] = []  # events held while a cut may still fall in them
        self._rng = {id(f): random.Random(f.params.get("seed", 0)) for f in faults if f.kind == "fragment"}

    def feed(self, data: bytes) -> list[bytes]:
        if self.end is not None:
            return []
        if self._decoder is None:
            return self._output(data)
        out: list[bytes] = []
        for event in self._decoder.feed(data):
            if self.end is not None:
                break
            self._n += 1
            out.append(self._serve(self._through([event.raw])))
        return self._output(b"".join(out))

    def close(self) -> list[bytes]:
        """At the end of the upstream body: whatever was held back (a cut tail is forwarded as it came)."""
        if self.end is not None or self._decoder is None:
            return []
        tail = b"".join(e.raw for e in self._decoder.close())
        out = self._serve(self._flush(0))
        if self.end is None and self._served == 0:  # cut:event=-1 still ends a stream without events (as in replay)
            self._cut_before_event_0()
        if self.end is None and tail:  # bytes that are no event (a JSON array's closing ]) may end the turn
            for fault, finder in self._finders:
                for position in finder.other(tail):
                    self._propose(position.offset, fault, position.what, position.event)
        if self.end is None:  # every position is known now: the earliest cut found ends the stream
            out += self._settle(final=True)
        if self.end is None:
            if self.wire == "json-array" and self._served == 0 and tail.lstrip().startswith(b"]"):
                tail = b"[" + tail  # every element was left out: the array still opens
            out += self._release() + tail
        return self._output(out)

    def ended(self) -> None:
        """At the flow's end: a log line for each fault that has not said what it did (every fault is logged)."""
        missing = {id(fault): f"no {fault.params['at']} position: {finder.missing[fault.params['at']]}"
                   for fault, finder in self._finders if fault.params["at"] in finder.missing}
        for fault in self.faults:
            if fault.kind == "fragment":
                self._note(fault, f"{fault.spec}: {self._pieces} writes of 1..{fault.params['max']} bytes")
            elif id(fault) in missing and id(fault) not in self._told:
                self._note(fault, f"not applied: {fault.spec}: this stream has {missing[id(fault)]}")
            elif id(fault) not in self._told:
                self._note(fault, f"not applied: {fault.spec}: not reached (the stream ended after {self._n} events, {self._sent} bytes)")

    def _note(self, fault: Fault, line: str) -> None:
        self._told.add(id(fault))
        self.log.append(line)

    def _through(self, events: list[bytes], first: int = 0) -> list[bytes]:
        """``events`` passed through the reshaping faults from stage ``first`` on: the events served."""
        for stage in self._stages[first:]:
            events = [out for raw in events for out in self._take(stage, raw)]
        return events

    def _flush(self, first: int) -> list[bytes]:
        """At the stream's end (the upstream's, or an injected error's): what the stages from
        ``first`` on still hold, each passed through the stages after it."""
        events: list[bytes] = []
        for stage in self._stages[first:]:
            events = [out for raw in events for out in self._take(stage, raw)] + self._give_up(stage)
        return events

    def _take(self, stage: _Stage, raw: bytes) -> list[bytes]:
        """What ``stage`` passes on for its next event."""
        n, at = stage.seen, stage.offset
        stage.seen += 1
        stage.offset += len(raw)
        fault, p = stage.fault, stage.fault.params
        if stage.done:
            return []
        if stage.spared:
            return [raw]
        if fault.kind == "drop" and p["event"] == n:
            self._note(fault, f"{fault.spec}: dropped event {n} at byte {at}")
            return []
        if fault.kind == "duplicate" and p["event"] == n:
            self._note(fault, f"{fault.spec}: event {n} sent twice (again at byte {at + len(raw)})")
            return [raw, raw]
        if fault.kind == "reorder" and p["event"] == n:
            stage.held = (raw, at)  # logged once the next event comes: the last one has nothing to swap with
            return []
        if fault.kind == "reorder" and stage.held is not None:
            held, held_at = stage.held
            stage.held = None
            self._note(fault, f"{fault.spec}: events {n - 1} and {n} swapped (at byte {held_at})")
            return [raw, held]
        if fault.kind == "corrupt" and p["frame"] == n:
            return [self._corrupt(fault, raw, n, at)]
        if fault.kind == "error" and p["after"] == -1 and n == 0:
            return self._inject(stage, at)
        if fault.kind == "error":
            stage.before.see(raw)
            if stage.before.sdk_stopped_at is not None:  # as replay refuses it: the app would never see the error
                stage.spared = True
                self._note(fault, f"not applied: {_past_sdk_stop(fault, self.source.dialect, n, raw)}")
                return [raw]
        if fault.kind == "error" and p["after"] == n:
            return [raw, *self._inject(stage, at + len(raw))]
        return [raw]

    def _give_up(self, stage: _Stage) -> list[bytes]:
        """What ``stage`` still holds at the stream's end."""
        fault = stage.fault
        if stage.held is not None:
            held, stage.held = stage.held[0], None
            self._note(fault, f"not applied: {fault.spec}: event {fault.params['event']} was the last one, nothing to swap it with")
            return [held]
        if fault.kind == "error" and fault.params["after"] == -1 and not stage.done:  # a stream without events
            return self._inject(stage, stage.offset)
        return []

    def _corrupt(self, fault: Fault, raw: bytes, n: int, at: int) -> bytes:
        try:
            changed, inside, old = corrupt_raw(raw, self.wire, fault)
        except FaultSpecError as exc:  # this event has no such byte: it passes unchanged
            self._note(fault, f"not applied: {exc}")
            return raw
        field_name = fault.params.get("field", "payload")
        self._note(fault, f"{fault.spec}: event {n} {field_name} (body byte {at + inside}) 0x{old:02x} -> 0x{changed[inside]:02x}")
        return changed

    def _inject(self, stage: _Stage, at: int) -> list[bytes]:
        """The error frames of ``stage``'s fault, which end the stream once served."""
        p = stage.fault.params
        stage.done = True
        self._erred = next(i for i, s in enumerate(self._stages) if s is stage)
        self._note(stage.fault, f"{stage.fault.spec}: {p['kind']} injected after event {p['after']} at byte {at}")
        frames = error_frames(self.source, p["kind"], p.get("message"), stage.before)
        if frames[-1] is ARRAY_CLOSE:  # no event: it closes the array once the error has ended the stream
            frames = frames[:-1]
            self._closes_array = True
        return frames

    def _serve(self, events: list[bytes]) -> bytes:
        """The events served (after the reshaping faults) through the cuts: what to forward now. An
        injected error ends the stream once the stages after it gave up what they held."""
        erred, self._erred = self._erred, None
        if erred is not None:
            events += self._flush(erred + 1)
        out = b""
        for raw in events:
            if self.end is not None:
                break
            out += self._serve_one(raw)
        if erred is not None and self.end is None:  # the error ends the stream: a cut found before it does
            out += self._settle(final=True)
        ended_by_error = erred is not None and self.end is None
        if ended_by_error:
            self.end = "clean"
        if self.end is not None:  # a cut or an injected error ended the stream: nothing more to wait for
            out += self._release()
        if ended_by_error and self._closes_array:  # (every element left out: the array still opens)
            out += (b"[" if self._served == 0 else b"") + ARRAY_CLOSE
        return out

    def _serve_one(self, raw: bytes) -> bytes:
        """One event served: every finder sees it (one may find a position in an event held back),
        the cuts found are weighed as replay's plan weighs them, and what no cut can fall in goes out."""
        n, at = self._served, self._at
        if self.wire == "json-array":  # an element moved, repeated or left out: the array stays whole
            raw = element_framed(raw, first=n == 0)
        self._served += 1
        self._at += len(raw)
        if n == 0:
            self._cut_before_event_0()
        if self._pending is None or at < self._pending[0]:  # an event past a cut found is never forwarded
            self._waiting.append(_Waiting(n, raw, at))
        for fault, finder in self._finders:
            for position in finder.event(raw):
                self._propose(position.offset, fault, position.what, position.event)
        for fault in self._event_cuts:
            if fault.params["event"] == n:
                self._propose(at + len(raw), fault, f"after event {n}", n)
        return self._settle()

    def _cut_before_event_0(self) -> None:
        """``cut:event=-1`` falls at byte 0; a finder first in the spec may still cut there too."""
        for fault in self._event_cuts:
            if fault.params["event"] == -1:
                self._propose(0, fault, "after event -1", -1)

    def _propose(self, position: int, fault: Fault, what: str, event: int) -> None:
        """A cut found: it replaces the one pending when it comes earlier (at a tie, first in the spec),
        as the earliest cut wins in replay."""
        key = (position, self._order[id(fault)])
        if self._pending is None or key < (self._pending[0], self._order[id(self._pending[1])]):
            self._pending = (position, fault, what, event)

    def _settle(self, final: bool = False) -> bytes:
        """What goes out now. The pending cut ends the stream once no finder may still find an
        earlier position (or, at a tie, one first in the spec), or at the stream's end (``final``);
        until then the events it may cut into stay held."""
        if self._pending is not None and (final or self._settled()):
            position, fault, what, _event = self._pending
            self._pending = None
            self._end_by(fault, position, what)
            return self._release()  # _output keeps what comes before the cut
        return self._release_safe()

    def _settled(self) -> bool:
        """No finder may still find a position before the pending cut (a tool call's arguments are
        known late, in an event held back), nor at it when first in the spec."""
        position, fault, _what, event = self._pending
        for other, finder in self._finders:
            if finder.found or not finder.wanted:  # found (and proposed) already, or never will
                continue
            first_in_spec = self._order[id(other)] < self._order[id(fault)]
            if finder.holding is not None and finder.holding <= event:
                # what it may still find lies in the event it holds, from that event's start on
                start = next((w.at for w in self._waiting if w.event == finder.holding), None)
                if start is None or start < position or (start == position and first_in_spec):
                    return False
            if position == self._at and first_in_spec:
                return False  # it may still cut right where this one does, at the next event's start
        return True

    def _end_by(self, fault: Fault, position: int, what: str) -> None:
        """A cut ends the stream at ``position``; ``_output`` logs it, unless a byte cut comes first."""
        self.end = fault.params.get("style", "clean")
        self._ending = (position, fault, what)

    def _release_safe(self) -> bytes:
        """Forward the events held back that no cut can fall in any more: those before every event
        a finder holds undecided, and wholly before the pending cut."""
        holding = min((f.holding for _fault, f in self._finders if f.holding is not None), default=None)
        limit = self._pending[0] if self._pending is not None else None
        done = 0
        for w in self._waiting:
            if (holding is not None and w.event >= holding) or (limit is not None and w.at + len(w.raw) > limit):
                break
            done += 1
        out = b"".join(w.raw for w in self._waiting[:done])
        self._waiting = self._waiting[done:]
        return out

    def _release(self) -> bytes:
        """Everything held back (the stream has ended: ``_output`` cuts it where the cut falls)."""
        out = b"".join(w.raw for w in self._waiting)
        self._waiting = []
        return out

    def _cut_earliest(self, reach: int) -> None:
        """A byte cut within the ``reach`` bytes in hand ends the stream there, when it comes before
        whatever else ended it (a cut, at a tie one later in the spec, or an injected error)."""
        ending = self._ending
        best = None if ending is None else (ending[0], self._order[id(ending[1])])
        for fault in self.faults:
            if fault.kind != "cut" or "byte" not in fault.params or id(fault) in self._told:
                continue
            key = (fault.params["byte"], self._order[id(fault)])
            if key[0] <= reach and (best is None or key < best):
                best = key
                self.end = fault.params.get("style", "clean")
                self._ending = (key[0], fault, f"byte {key[0]}")

    def _output(self, data: bytes) -> list[bytes]:
        self._cut_earliest(self._sent + len(data))
        if self._ending is not None:
            position, fault, what = self._ending
            self._ending = None
            data = data[: max(position - self._sent, 0)]
            self._note(fault, f"{fault.spec}: {self.end} cut at byte {position} ({what})")
            for other in self.faults:  # as in replay, a later cut is never reached
                if other.kind == "cut" and id(other) not in self._told:
                    self._note(other, f"{other.spec}: not reached, the stream is cut at byte {position} by {fault.spec}")
        self._sent += len(data)
        pieces = [data] if data else []
        for fault in self.faults:
            if fault.kind == "fragment":
                rng = self._rng[id(fault)]
                pieces = [p for piece in pieces for p in _random_pieces(piece, rng, fault.params["max"])]
        self._pieces += len(pieces)
        return pieces


# where replay takes the middle event, which a stream still arriving does not know yet
_MIDDLE_BY_DEFAULT = {"error": "after", "corrupt": "frame"}


def check_live_fault(fault: Fault) -> None:
    """What refuses a live fault whatever the stream (the streamtap_fault option is checked so at
    start, as serve checks its --fault): it names the events replay would take from the middle of
    the stream, and events that can exist."""
    _check_live_position(fault)
    _check_live_event(fault)
    if fault.kind == "cut":
        _check_picked_message(fault)


def _check_live_position(fault: Fault) -> None:
    """A live fault must name the event that replay would take from the middle of the stream."""
    key = _MIDDLE_BY_DEFAULT.get(fault.kind)
    if fault.kind == "cut" and fault.params.get("at") in ("prelude", "crc"):
        key = "event"
    if key is not None and key not in fault.params:
        raise FaultSpecError(
            f"{fault.spec!r}: give {key}=N on live traffic (replay's default, the middle event, is not known while the stream arrives)"
        )


def _check_live_event(fault: Fault) -> None:
    """An event fault before the first event can never apply: refused, as replay refuses it."""
    if fault.kind in ("drop", "duplicate", "reorder") and fault.params["event"] < 0:
        raise FaultSpecError(f"{fault.spec!r}: event {fault.params['event']} does not exist (the first is event 0)")


def _decoder(wire: str):
    from streamtap import wire as w

    return {"eventstream": w.EventStreamDecoder, "ndjson": w.NDJSONDecoder, "json-array": w.JSONArrayDecoder}.get(wire, w.SSEDecoder)()


def unfit_faults(faults: list[Fault], sources: list[Source], others: dict[str, Source] | None = None) -> list[str]:
    """Why each fault that fits none of ``sources`` does not fit (a cut position no recording
    has, an event past every recording's end, an error kind for another wire format), so a
    server can refuse it at start instead of answering every request with an error; then,
    when each fits, why they fit no recording together, as a plan applies them all (an error
    event or a dropped one moves the positions after it). swap-tail is checked only given
    ``others``, the recordings it names (the server loads them)."""
    if not sources:
        return []
    checked = [fault for fault in faults if fault.kind != "swap-tail" or others is not None]
    also = f" (nor any of the other {len(sources) - 1} recordings)" if len(sources) > 1 else ""
    reasons = [f"{reason}{also}" for fault in checked if (reason := _fits_none(sources, [fault], others))]
    if not reasons and len(checked) > 1 and (reason := _fits_none(sources, checked, others)):
        reasons.append(f"together ({'; '.join(f.spec for f in checked)}): {reason}{also}")
    return reasons


def _fits_none(sources: list[Source], faults: list[Fault], others: dict[str, Source] | None) -> str | None:
    """None when ``faults`` plan on one of ``sources``, else the first reason they do not."""
    first_reason = None
    for source in sources:
        try:
            plan(source, faults, others=others or {})
            return None
        except FaultSpecError as exc:
            first_reason = first_reason or str(exc)
    return first_reason
