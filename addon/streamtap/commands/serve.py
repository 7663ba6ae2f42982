"""`streamtap serve DIR`: answer HTTP requests from recordings, with timing and faults."""

from __future__ import annotations

import argparse
import asyncio
import sys


EPILOG = """\
Requests match a recording by method, path (and query) and a hash of the JSON body;
unmatched requests get a JSON 404 naming the nearest recordings. Point a client at the
printed base URL, e.g. OPENAI_BASE_URL=http://127.0.0.1:8080/v1.

timing:  original (recorded gaps) | scale=N (gaps times N) | fast (default)
faults:  cut:event=N|byte=N|at=tool-args|escaped-quote|between-blocks|before-terminal|prelude|crc[,style=clean|abort|reset]
         stall:after=N|byte=N,secs=S  fragment:max=K[,seed=N]  latency:ms=M[,jitter=J][,seed=N]  bandwidth:bps=BITS
         corrupt:frame=N[,field=payload|crc|prelude-crc|length][,byte=0x22][,offset=N]  duplicate|reorder|drop:event=N
         error:kind=overloaded_error|modelStreamErrorException|openai[,after=N][,message=TEXT]
         swap-tail:with=OTHER.jsonl[,at=N]
         (several: repeat --fault or join with ';'; the README's Faults section says what each does)

Of several recordings of one request, the first by name answers (--once: each in turn), a
whole one before a killed proxy's leftover (no end line), which is named in a warning at start
and ends its answer with an abort (no clean end), as the killed proxy's client got it.

Byte-exact is the decoded body: a content-encoded recording (gzip, br, zstd, deflate) is served
decoded, without Content-Encoding (one HTTP chunk per event unless --timing fast), faults applied
to the decoded body.
One whose content-encoding could not be undone (a lying header, damaged bytes, an unknown coding)
is refused at start (exit 2).

exit code: 2 usage error (a path, port, timing, fault or name that cannot be used, said before
it listens); it serves until it is stopped.

examples:
  streamtap serve recordings/live/
  streamtap serve --timing original --fault 'cut:at=tool-args,style=abort' recordings/live/x.jsonl
"""


def configure(parser: argparse.ArgumentParser) -> None:
    from streamtap.cli import named_path

    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = EPILOG
    parser.add_argument("paths", nargs="+", type=named_path, metavar="DIR|FILE", help="recordings (*.jsonl, *.jsonl.zst) or directories of them")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: loopback only)")
    parser.add_argument("--port", type=int, default=0, help="port (default: a free one, printed)")
    parser.add_argument("--timing", default="fast", help="original, scale=N or fast (default)")
    parser.add_argument("--fault", action="append", default=[], metavar="SPEC", help="inject a fault (repeatable)")
    parser.add_argument("--once", action="store_true", help="serve each recording once (repeat requests walk through recordings of the same request)")
    parser.add_argument("--ignore-field", action="append", default=[], metavar="PATH", help="JSON body field left out of matching, dotted (repeatable)")
    parser.add_argument("--ignore-param", action="append", default=[], metavar="NAME", help="query parameter left out of matching (repeatable)")
    parser.add_argument("--match-header", action="append", default=[], metavar="NAME", help="request header that must match too (repeatable)")
    parser.add_argument("--assign-ids", action="store_true", help="add `id: <seq>` lines to SSE streams so any client can resume with Last-Event-ID")
    parser.add_argument("--fault-header", action="store_true", help="honour a per-request fault in the x-streamtap-fault header")
    parser.add_argument("--max-connections", type=int, default=None, metavar="N",
                        help="connections served at once (default: what `ulimit -n` leaves room for, less 128); at the cap "
                             "the connection idle longest between requests is closed, or, with none idle, the new one "
                             "gets a 503 with Retry-After, which the SDKs retry")


def build(args: argparse.Namespace):
    """(library, options) from the arguments, or UsageError."""
    from streamtap.cli import UsageError, check_names
    from streamtap.replay.faults import FaultSpecError, Timing, parse_faults
    from streamtap.replay.match import Library, MatchOptions, field_path_problem
    from streamtap.replay.server import ServeOptions
    from streamtap.replay.source import RecordingError

    if not args.host.strip():  # --host "$HOST" with HOST unset: asyncio would listen on every interface
        raise UsageError(f"--host {args.host!r}: no address (an unset shell variable?), which would listen on every "
                         "interface; give one (0.0.0.0 for every interface), or leave --host out for loopback only")
    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port {args.port}: a port is 0..65535 (0: a free one)")
    if args.max_connections is not None and args.max_connections < 1:
        raise UsageError(f"--max-connections {args.max_connections}: at least 1")
    for spec in args.fault:
        if not spec.replace(";", "").strip():  # --fault "$SPEC" with SPEC unset: no fault, silently
            raise UsageError(f"--fault {spec!r}: no fault in it; give a spec such as cut:event=3, or leave --fault out")
    check_names("--match-header", args.match_header)
    check_names("--ignore-param", args.ignore_param)
    for path in args.ignore_field:
        problem = field_path_problem(path)
        if problem:
            raise UsageError(f"--ignore-field: {problem}")
    try:
        timing = Timing.parse(args.timing)
        faults = [f for spec in args.fault for f in parse_faults(spec)]
    except FaultSpecError as exc:
        raise UsageError(str(exc)) from None
    options = MatchOptions(tuple(args.ignore_field), tuple(args.ignore_param), tuple(h.lower() for h in args.match_header), args.once)
    try:
        library = Library.load(args.paths, options, warn=_warn)
    except RecordingError as exc:
        raise UsageError(str(exc)) from None
    if not library.entries:
        raise UsageError(f"no recordings (*.jsonl, *.jsonl.zst) under {' '.join(args.paths)}")
    # (faults that do not fit the recordings as served are refused by ReplayServer.start)
    return library, ServeOptions(timing, faults, args.assign_ids, args.fault_header)


def run(args: argparse.Namespace) -> int:
    from streamtap.cli import UsageError
    from streamtap.replay.faults import FaultSpecError
    from streamtap.replay.server import Limits, ReplayServer
    from streamtap.replay.source import RecordingError

    library, options = build(args)

    async def main() -> None:
        server = ReplayServer(library, options, limits=Limits(connections=args.max_connections))
        try:
            await server.start(args.host, args.port)
        except OSError as exc:
            raise UsageError(f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}") from None
        except (RecordingError, FaultSpecError) as exc:
            raise UsageError(str(exc)) from None
        print(server.base_url, flush=True)
        unfinished = [entry.source.path for entry in library.entries if not entry.source.whole]
        if unfinished:
            print(f"streamtap serve: warning: {len(unfinished)} recording(s) without their end line or cut after it (a killed proxy's, "
                  f"e.g. {unfinished[0]}): each answers only a request no whole recording answers, and its answer "
                  "ends with an abort (no clean end), as the killed proxy's client got it", file=sys.stderr)
        print(
            f"streamtap serve: {len(library.entries)} recording(s), timing {options.timing}, "
            f"faults: {'; '.join(map(str, options.faults)) or 'none'}; Ctrl-C stops",
            file=sys.stderr,
            flush=True,
        )
        try:
            await asyncio.Event().wait()
        finally:
            await server.close()

    asyncio.run(main())
    return 0


def _warn(message: str) -> None:
    print(f"streamtap serve: warning: {message}", file=sys.stderr, flush=True)
