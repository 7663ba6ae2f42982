"""Which recording answers a request: method + path (+ query) + hash of the normalized JSON body.

Normalizing means: parse the JSON, drop the ignored fields (dotted paths such as
``metadata.user_id``), serialize with sorted keys. Headers play no part unless named with
``match_headers`` (their recorded values are redacted where secret: a request matches such a
header where the recorder's rule makes its value the recorded one, ``Bearer [redacted]``).

A value the recording holds redacted (``"[redacted]"`` in the JSON body, a redacted query
parameter or form field) matches any value: the request with the real secret still finds
the recording the secret was taken out of.
"""

from __future__ import annotations

import hashlib
import heapq
import json
import os
import sys
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from itertools import chain
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlencode

from streamtap.recording.catalog import RECORDING_SUFFIXES, files_under, is_partial
from streamtap.recording.redact import FORM_REDACTED, REDACTED, Redactor, dump_embedded, query_pairs

from .source import RecordingError, Source, load_source, split_target


def normalize_body(body: Any, ignore_fields: Iterable[str] = ()) -> Any:
    if isinstance(body, (bytes, bytearray)):
        if not body:
            return None
        try:
            body = json.loads(body)
        except (ValueError, RecursionError):  # (nested past Python's recursion: compared as text)
            return body.decode("utf-8", "replace")
    for dotted in ignore_fields:
        _drop_path(body, dotted.split("."))
    return body


def field_path_problem(path: str) -> str | None:
    """Why ``path`` cannot name a JSON body field to leave out of matching (``metadata.user_id``), or None."""
    if not path or any(not part.strip() for part in path.split(".")):
        return f"{path!r} is not a dotted JSON field path (e.g. metadata.user_id)"
    return None


def _drop_path(obj: Any, parts: list[str]) -> None:
    if not isinstance(obj, dict) or not parts:
        return
    if len(parts) == 1:
        obj.pop(parts[0], None)
    else:
        _drop_path(obj.get(parts[0]), parts[1:])


def holds_redacted(value: Any) -> bool:
    if isinstance(value, dict):
        return any(holds_redacted(v) for v in value.values())
    if isinstance(value, list):
        return any(holds_redacted(v) for v in value)
    return isinstance(value, str) and (REDACTED in value or FORM_REDACTED in value)


def mask_like(live: Any, recorded: Any, redactor: Redactor | None = None) -> Any:
    """``live`` with ``"[redacted]"`` wherever ``recorded`` has it (a copy where it differs).
    ``redactor``: the one the recording was made with, for text it scanned rather than parsed."""
    if isinstance(recorded, str):
        if recorded == REDACTED:
            return REDACTED
        if isinstance(live, str) and live != recorded:
            if FORM_REDACTED in recorded:
                return _mask_form(live, recorded)
            if REDACTED in recorded:
                redactor = redactor or Redactor()
                if redactor.string(live) == recorded:  # the recorder's own rule for a string gives the recording's
                    return recorded
                if recorded.lstrip()[:1] in ("{", "[", '"'):  # JSON it carries, redacted member by member
                    return _mask_embedded(live, recorded, redactor)
        return live
    if isinstance(recorded, dict) and isinstance(live, dict):
        redactor = redactor or Redactor()
        masked = {}
        for name, value in live.items():
            if name not in recorded:
                masked[name] = value
                continue
            kept = recorded[name]
            # the recorder's rule for the member, which its name decides (a header map's values get the
            # header rule: "Bearer [redacted]"), gives what the recording holds: it is that value
            if value != kept and holds_redacted(kept) and redactor.json({name: value}).get(name) == kept:
                masked[name] = kept
            else:
                masked[name] = mask_like(value, kept, redactor)
        return masked
    if isinstance(recorded, list) and isinstance(live, list) and len(live) == len(recorded):
        return [mask_like(a, b, redactor) for a, b in zip(live, recorded)]
    return live


def _mask_embedded(live: str, recorded: str, redactor: Redactor) -> str:
    """JSON carried in a string (a tool call's arguments), masked inside and written as the
    redaction wrote it."""
    try:
        mine, theirs = json.loads(live), json.loads(recorded)
    except (ValueError, RecursionError):
        # arguments that are no JSON (a call cut short, nested too deep) were scanned for secret
        # members when recorded
        scanned = redactor.json_bytes(live.encode("utf-8", "surrogatepass")).decode("utf-8", "surrogatepass")
        return scanned if scanned == recorded else live
    return dump_embedded(mask_like(mine, theirs, redactor))


def _mask_form(live: str, recorded: str) -> str:
    """A form body: each field the recording redacted takes the recorded (redacted) value."""
    mine, theirs = live.split("&"), recorded.split("&")
    if len(mine) != len(theirs):
        return live
    for i, (a, b) in enumerate(zip(mine, theirs)):
        if b.endswith("=" + FORM_REDACTED) and a.partition("=")[0] == b.partition("=")[0]:
            mine[i] = b
    return "&".join(mine)


def body_hash(body: Any) -> str:
    # surrogatepass: Python's JSON parser takes a lone surrogate escape ("\ud83d", a string cut
    # inside an emoji), which then has to hash as it does in the recording of that request
    return hashlib.sha256(_canonical(body).encode("utf-8", "surrogatepass")).hexdigest()[:16]


def _canonical(value: Any) -> str:
    """The JSON text that matching compares: 1, 1.0 and true differ here (Python's == calls them equal)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def shown_text(text: str) -> str:
    """Text a client sent (a decoded path, a JSON field name) as a log line may hold it: what a
    terminal would act on (ESC, BEL, a C1 control, a newline, a lone surrogate) written as its
    escape, by the rule the fault spec and the Last-Event-ID are logged with (``repr``), without
    repr's quotes."""
    if text.isprintable():
        return text
    return "".join(char if char.isprintable() else repr(char)[1:-1] for char in text)


def error_body(kind: str, message: str, **details: Any) -> dict[str, Any]:
    """A JSON error that every SDK shows the message of: the openai and anthropic SDKs read the
    nested ``error`` object, botocore reads only a top-level ``message`` and ``__type`` (without
    them a boto3 user gets an empty message)."""
    return {"error": {"type": kind, "message": message, **details}, "message": message, "__type": kind}


@dataclass(frozen=True, slots=True)
class Key:
    method: str
    path: str
    body: str  # body_hash
    headers: tuple[tuple[str, str], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"method": self.method, "path": self.path, "body_sha256": self.body, "headers": dict(self.headers)}


@dataclass(slots=True)
class MatchOptions:
    ignore_fields: tuple[str, ...] = ()
    ignore_params: tuple[str, ...] = ()
    match_headers: tuple[str, ...] = ()
    once: bool = False  # serve each recording once (several recordings of one request: in order)
    match_any: bool = False  # answer every request with the first recording (the sweep: one recording, any client)
    redact: tuple[str, ...] = ()  # names redacted besides the patterns, and names they leave alone (the
    redact_allow: tuple[str, ...] = ()  # Tap's streamtap_redact options), in the 404 and the log


@dataclass(slots=True)
class _Entry:
    source: Source
    key: Key
    body: Any
    served: int = 0
    served_last: int = 0  # when it was last served (the library's count of answers), for resumes
    redacted_params: frozenset[str] = frozenset()  # query parameters recorded redacted
    redacted_body: bool = False  # the body holds redacted values
    redacted_headers: frozenset[str] = frozenset()  # matched headers recorded redacted


@dataclass(frozen=True, slots=True)
class Match:
    """A recording found for a request, not yet counted as served (``Library.consume`` counts it)."""

    source: Source
    entry: _Entry
    counts: bool  # a new answer; False for a resume that continues one served already (--once)


class Library:
    """The recordings a server answers from, indexed by request key."""

    def __init__(self, sources: Iterable[Source], options: MatchOptions | None = None) -> None:
        self.options = options or MatchOptions()
        self._lock = threading.Lock()
        self.entries: list[_Entry] = []
        self._answered = 0  # answers given (resumes not counted)
        sources = list(sources)
        # the names the recordings were redacted with, besides the ones given: a request that a
        # recording holds redacted is masked, shown in a 404 and logged as the recorder redacted it
        self.redactor = Redactor(
            [*self.options.redact, *(name for source in sources for name in source.redact)],
            [*self.options.redact_allow, *(name for source in sources for name in source.redact_allow)],
        )
        for source in sources:
            body = normalize_body(_copy(source.request_body), self.options.ignore_fields)
            key = self.key(source.method, source.path_and_query, source.request_headers, body)
            params = frozenset(k for k, v in query_pairs(split_target(source.url).query) if v == REDACTED)
            self.entries.append(_Entry(source, key, body, redacted_params=params, redacted_body=holds_redacted(body),
                                       redacted_headers=frozenset(h for h, v in key.headers if holds_redacted(v))))
        # of the recordings that answer one request, a whole one first: a killed proxy's
        # leftover (no end line) answers only when no whole one does (or, --once, is left)
        self.entries.sort(key=lambda entry: not entry.source.whole)

    @classmethod
    def load(cls, paths: Iterable[str | Path], options: MatchOptions | None = None, *,
             warn: Callable[[str], None] | None = None) -> Library:
        """Recordings from files and directories (``*.jsonl`` and ``*.jsonl.zst`` under a directory, recursively).
        ``warn`` hears of each file left out (default: a line on stderr)."""
        files: list[Path] = []
        # ~ as streamtap_dir takes it: a quoted or options-file ~ reaches here unexpanded by any shell
        for path in (Path(os.path.expanduser(p)) for p in paths):
            if path.is_dir():
                found, unreadable = files_under(path, RECORDING_SUFFIXES, real=True)
                if unreadable:  # refused, not skipped: a recording a test or a sweep expects could be there
                    folder, why = unreadable[0]
                    raise RecordingError(f"{folder}: cannot read this folder: {why}")
                files += [p for p in found if p.is_file()]
            elif path.is_file():
                files.append(path.resolve())
            elif path.exists():  # a fifo or a device: no recording, and reading one could wait for ever
                raise RecordingError(f"{path}: not a regular file or a folder")
            else:
                raise RecordingError(f"{path}: no such file or directory")
        # "the first by name answers": by path, across every file and folder given, in whatever
        # order they were given (the whole-before-leftover order is kept over it in __init__)
        files = sorted(set(files), key=Path.absolute)  # one recording given twice (a link, a folder twice) loads once
        return cls(_load_sources(files, warn or _warn_on_stderr), options)

    def key(self, method: str, target: str, headers: dict[str, str], body: Any, redacted_params: frozenset[str] = frozenset()) -> Key:
        parts = split_target(target)
        # a ? or # sent escaped stays so: the key's query is the request's query, never part of its path
        path = unquote(parts.path).replace("?", "%3F").replace("#", "%23") or "/"
        query = [
            (k, REDACTED if k in redacted_params else v)
            for k, v in query_pairs(parts.query)
            if k not in self.options.ignore_params
        ]
        if query:
            path += "?" + urlencode(sorted(query))
        wanted = tuple((h, headers.get(h, "")) for h in self.options.match_headers)
        return Key(method.upper(), path, body_hash(body), wanted)

    def match(self, method: str, target: str, headers: dict[str, str], body: bytes, *, resume: bool = False) -> Source | None:
        """The recording that answers the request. A ``resume`` (a Last-Event-ID request) continues
        an answer already given: under ``once`` it comes from the recording of that request served
        last, and serving it again does not count."""
        found = self.find(method, target, headers, body, resume=resume)
        if found is None:
            return None
        self.consume(found)
        return found.source

    def find(self, method: str, target: str, headers: dict[str, str], body: bytes, *, resume: bool = False) -> Match | None:
        """What ``match`` finds, without using it up: a server that may still refuse the request
        (a bad fault header, an unknown Last-Event-ID) calls ``consume`` only once it answers, so
        under ``once`` a refused request leaves the recording for the next one."""
        request = self._request(method, target, headers, body)
        with self._lock:
            entry = self._resumed(request) if resume else None
            if entry is not None:
                return Match(entry.source, entry, counts=False)
            entry = self._first_answer(request)
            return None if entry is None else Match(entry.source, entry, counts=True)

    def consume(self, found: Match) -> bool:
        """Count ``found`` as served (a resume that continues an answer counts nothing). False when,
        under ``once``, another request used the recording up since it was found (a server that
        awaited in between, planning its faults): that request looks again."""
        if not found.counts:
            return True
        with self._lock:
            if self.options.once and found.entry.served:
                return False
            found.entry.served += 1
            self._answered += 1
            found.entry.served_last = self._answered
        return True

    def has_match(self, method: str, target: str, headers: dict[str, str], body: bytes, *, resume: bool = False) -> bool:
        request = self._request(method, target, headers, body)
        with self._lock:
            return (resume and self._resumed(request) is not None) or self._first_answer(request) is not None

    def _resumed(self, request: tuple) -> _Entry | None:
        if not self.options.once:
            return None  # every recording is still there to answer: the first that answers does
        served = [entry for entry in self.entries if entry.served and self._answers(entry, request)]
        return max(served, key=lambda entry: entry.served_last, default=None)

    def _request(self, method: str, target: str, headers: dict[str, str], body: bytes) -> tuple:
        lowered = {k.lower(): v for k, v in headers.items()}
        normalized = normalize_body(body, self.options.ignore_fields)
        return method, target, lowered, normalized, self.key(method, target, lowered, normalized)

    def _answers(self, entry: _Entry, request: tuple) -> bool:
        method, target, headers, body, key = request
        if self.options.match_any or entry.key == key:
            return True
        if entry.key.method != key.method:
            return False
        masked = self._as_recorded(entry, request)
        return masked is not None and entry.key == masked[0]

    def _as_recorded(self, entry: _Entry, request: tuple) -> tuple[Key, Any] | None:
        """The request's key and body with ``[redacted]`` wherever ``entry``'s recording has it (its
        body, its query, its matched headers, each by the recorder's own rule), or None when the
        recording holds nothing redacted: a redacted value matches any value there."""
        method, target, headers, body, _ = request
        if not (entry.redacted_body or entry.redacted_params or entry.redacted_headers):
            return None
        redactor = self.redactor
        try:
            masked = mask_like(body, entry.body, redactor) if entry.redacted_body else body
            if entry.redacted_headers:
                headers = {**headers, **{h: redactor.headers([(h, headers[h])])[0][1]
                                         for h in entry.redacted_headers if h in headers}}
            return self.key(method, target, headers, masked, entry.redacted_params), masked
        except RecursionError:  # nested deeper than Python recurses (as normalize_body finds too): no answer by masking
            return None

    def _first_answer(self, request: tuple) -> _Entry | None:
        for entry in self.entries:
            if not (self.options.once and entry.served) and self._answers(entry, request):
                return entry
        return None

    def request_key(self, method: str, target: str, headers: dict[str, str], body: bytes) -> Key:
        lowered = {k.lower(): v for k, v in headers.items()}
        return self.key(method, target, lowered, normalize_body(body, self.options.ignore_fields))

    def explain(self, method: str, target: str, headers: dict[str, str], body: bytes, limit: int = 3,
                note: str | None = None) -> dict[str, Any]:
        """The body of the 404: what was looked for and the nearest recordings. ``note``: what the
        message adds about the request (a body that could not be decoded)."""
        request = self._request(method, target, headers, body)
        key, live = request[4], _LiveFields(request[3])

        def as_recorded(entry: _Entry) -> tuple[Key, _LiveFields]:
            # compared as each recording keeps it: a field it holds redacted matches, and is not named
            masked = self._as_recorded(entry, request)
            return (key, live) if masked is None else (masked[0], _LiveFields(masked[1]))

        views = {id(entry): as_recorded(entry) for entry in self.entries}
        # ranked by counts alone, each bounded by the recording's body: a live body of a million
        # fields is walked again only for the few nearest, whose first differences are named
        ranked = sorted(self.entries, key=lambda e: _distance(*views[id(e)], e))
        nearest = []
        for entry in ranked[:limit]:
            nearest.append(
                {
                    "recording": entry.source.path,
                    "method": entry.key.method,
                    "path": entry.key.path,
                    "body_sha256": entry.key.body,
                    "differs_in": _differences(*views[id(entry)], entry),
                    "already_served": bool(self.options.once and entry.served),
                }
            )
        # the live request's credentials stay out of the answer: the Tap records it, and logs it
        redactor = self.redactor
        shown = replace(key, path=redactor.url(key.path), headers=tuple(map(tuple, redactor.headers(key.headers))))
        message = f"no recording answers {shown.method} {shown_text(shown.path)} (body {key.body}); {len(self.entries)} loaded"
        if nearest:  # the whole reason in the message: a boto3 user sees nothing else
            message += f"; nearest {nearest[0]['recording']} ({_how_it_differs(nearest[0]['differs_in'])})"
        if note:
            message += f"; {note}"
        return error_body("streamtap_no_recording", message, looked_for=shown.to_dict(), nearest=nearest)


def _load_sources(files: list[Path], warn: Callable[[str], None]) -> list[Source]:
    """The recordings in ``files``. A killed proxy's leftover (``.partial``) that cannot be loaded,
    empty or cut inside its header, is left out with a warning, so that one unlucky kill does not
    keep the whole recordings beside it from being served. Any other file that cannot be loaded
    is refused, as is a set of leftovers with no recording that loads."""
    sources: list[Source] = []
    leftovers: list[RecordingError] = []
    for path in files:
        try:
            sources.append(load_source(path))
        except RecordingError as exc:
            if not is_partial(path):
                raise
            leftovers.append(exc)
    if leftovers and not sources:
        raise leftovers[0]
    for exc in leftovers:
        warn(f"skipped a killed proxy's leftover that cannot be served ({exc})")
    return sources


def _warn_on_stderr(message: str) -> None:
    print(f"streamtap: warning: {message}", file=sys.stderr, flush=True)


def _copy(body: Any) -> Any:
    return json.loads(json.dumps(body)) if isinstance(body, (dict, list)) else body


ALREADY_SERVED = "already served (--once)"


DIFFERENCES_SHOWN = 10  # of the fields that differ, the 404 names this many and counts the rest


class _LiveFields:
    """The live request's body as the comparison with each recording sees it: the canonical text
    of a top-level field is made once, however many recordings compare it."""

    def __init__(self, body: Any) -> None:
        self.fields: dict[str, Any] | None = body if isinstance(body, dict) else None
        self._canonical: dict[str, str] = {}

    def canonical(self, name: str) -> str:
        text = self._canonical.get(name)
        if text is None:
            text = self._canonical[name] = _canonical(self.fields[name])
        return text


def _differences(key: Key, live: _LiveFields, entry: _Entry) -> list[str]:
    """What the request differs from ``entry`` in (``body.model``), the first DIFFERENCES_SHOWN
    of it, then how many more."""
    count, names = _compared(key, live, entry)
    shown = names(DIFFERENCES_SHOWN)
    return shown + [f"and {count - len(shown)} more"] if count > len(shown) else shown


def _compared(key: Key, live: _LiveFields, entry: _Entry) -> tuple[int, Callable[[int], list[str]]]:
    """How many parts of the request differ from ``entry``'s, and a function giving the names of
    the first n of them, made only when asked for (naming the fields only the live body has walks
    the whole of it; counting them does not)."""
    head = []
    if key.method != entry.key.method:
        head.append("method")
    if key.path != entry.key.path:
        head += _path_names(key.path, entry.key.path)
    if key.headers != entry.key.headers:
        head += [f"header {h}" for (h, v), (_, w) in zip(key.headers, entry.key.headers) if v != w]
    recorded_only: list[str] = []  # the recording's fields that differ (missing from the live body too)
    live_only_count = 0
    body_differs = key.body != entry.key.body
    if body_differs and live.fields is not None and isinstance(entry.body, dict):
        mine, theirs = live.fields, entry.body
        recorded_only = [k for k in theirs if k not in mine or live.canonical(k) != _canonical(theirs[k])]
        live_only_count = len(mine) - sum(1 for k in theirs if k in mine)
        body_parts = len(recorded_only) + live_only_count or 1  # (equal fields, another hash: "body")
    else:
        body_parts = int(body_differs)
    count = len(head) + body_parts
    served = count == 0 and entry.served > 0

    def names(n: int) -> list[str]:
        shown = head[:n]
        room = n - len(shown)
        if body_parts and room > 0:
            if recorded_only or live_only_count:
                fields: Iterable[str] = recorded_only
                if live_only_count:
                    fields = chain(recorded_only, (k for k in live.fields if k not in entry.body))
                shown += [f"body.{shown_text(k)}" for k in heapq.nsmallest(room, fields)]
            else:
                shown.append("body")
        if served and n > 0:
            shown.append(ALREADY_SERVED)
        return shown

    return count + served, names


def _path_names(mine: str, theirs: str) -> list[str]:
    """Two keys' paths that differ, named more closely: the path itself, and each query parameter
    whose values differ (by its name: a value may be a secret)."""
    path, _, query = mine.partition("?")  # (a key's path holds any ? of its own escaped)
    their_path, _, their_query = theirs.partition("?")
    names = ["path"] if path != their_path else []
    if query != their_query:
        ours, others = _by_name(query), _by_name(their_query)
        params = sorted(name for name in ours.keys() | others.keys() if ours.get(name) != others.get(name))
        names += [f"query {shown_text(name)}" for name in params] or ["query"]
    return names


def _by_name(query: str) -> dict[str, list[str]]:
    values: dict[str, list[str]] = {}
    for name, value in query_pairs(query):
        values.setdefault(name, []).append(value)
    return values


def _how_it_differs(differs_in: list[str]) -> str:
    if differs_in == [ALREADY_SERVED]:
        return ALREADY_SERVED
    return "differs in " + (", ".join(differs_in) or "the request")


def _distance(key: Key, live: _LiveFields, entry: _Entry) -> tuple[int, int, int]:
    count, _ = _compared(key, live, entry)
    return (key.path != entry.key.path, key.method != entry.key.method, count)
