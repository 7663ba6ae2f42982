"""`streamtap import FILE.mitm`: mitmproxy captures become streamtap recordings."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from streamtap.cli import (
    EXIT_FINDING, EXIT_OK, Progress, UsageError, check_names, named_folder, named_path, say, terminal_safe,
)


DESCRIPTION = """\
Reads every flow of a mitmproxy capture and writes one streamtap recording per streamed
LLM answer (an SSE, AWS event-stream or NDJSON response, or a streaming call to a known
provider API that was answered with an error; not a redirect or an answer with no body), then
prints each file with its verdict.
The recordings are what the live addon writes, minus arrival times, which captures do
not keep; `streamtap show`, `verify` and `serve` take them as they are.

Capture with the bodies kept. Plain `mitmdump -w capture.mitm` keeps them, but holds
each response back until it is complete. With streaming on (`--set stream_large_bodies=1`,
or the streamtap addon loaded) mitmproxy forwards at once and keeps NO body unless you
also pass `--set store_streamed_bodies=true`:

  mitmdump -w capture.mitm -s "$(streamtap addon)" --set store_streamed_bodies=true

Flows whose body is missing are listed as skipped. Importing the same capture again
skips the flows already recorded in the output directory, and imports again a flow
whose recording an import stopped midway (Ctrl-C, a kill) left unfinished. A flow is
the same when its id, request time and response bytes are: a different flow with an
id already recorded (a capture appended to, a flow replayed and saved again) is
recorded beside it, its name ending in the id and "-2", "-3"..., and stderr says so.
"""

EPILOG = """\
Exit codes: 0 every streamed answer imported; 1 none found, some skipped (each line
says why: no body kept, another import into the same folder writing it...), or the
capture is cut short or damaged (mitmdump stopped while writing it, a partial
copy), or a recording could not be written (a full disk): the flows before that
point are imported, and stderr says how many were read; 2 a usage error, or a file that is not a mitmproxy capture, a HAR file
or a streamtap recording too (nothing is written, not even the --out folder).
"""


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = DESCRIPTION
    parser.epilog = EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("capture", type=named_path, metavar="FILE.mitm", help="a capture written by mitmdump -w or mitmweb/mitmproxy (save)")
    parser.add_argument(
        "--out", metavar="DIR", type=named_folder, default=Path("recordings/imported"),
        help="directory for the recordings (default: recordings/imported)",
    )
    parser.add_argument(
        "--filter", metavar="EXPR",
        help="mitmproxy filter expression choosing the flows instead (e.g. '~d openai.com & ~s')",
    )
    parser.add_argument(
        "--sentinel", metavar="LINE", help="exact last line every answer must end with (one line, not blank); missing => truncated (an answer, or with n > 1 a choice, that stops to call a tool is not checked)"
    )
    parser.add_argument(
        "--redact", metavar="NAME", action="append", default=[],
        help="another header, query parameter or body field whose value is redacted (repeatable; names that "
        "look like secrets always are: see the README's Security section)",
    )
    parser.add_argument(
        "--redact-allow", metavar="NAME", action="append", default=[],
        help="a name the secret patterns catch wrongly: its value is kept (repeatable)",
    )
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress messages, only the result lines")


def run(args: argparse.Namespace) -> int:
    from streamtap.recording.catalog import is_recording_file
    from streamtap.recording.importer import CaptureError, CaptureIncomplete, import_capture, is_llm_stream
    from streamtap.recording.writer import RecordingError

    from .verify import check_sentinel, shown_path

    source = Path(args.capture)
    if not source.exists():
        raise UsageError(f"{shown_path(source)}: no such file")
    if not source.is_file():
        raise UsageError(f"{shown_path(source)}: not a file")
    if is_recording_file(source):
        raise UsageError(f"{shown_path(source)} is a streamtap recording, not a mitmproxy capture: streamtap show, "
                         "verify, serve and report read recordings; import reads the captures mitmdump -w writes")
    if _looks_like_har(source):
        raise UsageError(f"{shown_path(source)} is JSON (a HAR file?), not a mitmproxy capture: import reads the captures "
                         "mitmdump -w writes; it takes no HAR file, whose flows get new ids each time one is read, so "
                         "importing it again would record every answer again")
    matches = is_llm_stream
    if args.filter:
        from mitmproxy import flowfilter

        try:
            expression = flowfilter.parse(args.filter)
        except ValueError as exc:
            raise UsageError(f"--filter: {exc}") from None
        matches = expression
    if args.out.exists() and not args.out.is_dir():
        raise UsageError(f"--out {shown_path(args.out)}: exists and is not a directory")
    check_sentinel(args.sentinel)
    check_names("--redact", args.redact)
    check_names("--redact-allow", args.redact_allow)

    written = skipped = already = 0
    incomplete = failed = None
    try:
        for item in import_capture(
            source, args.out, matches=matches, sentinel=args.sentinel, redact=args.redact,
            redact_allow=args.redact_allow, progress=(lambda flows: None) if args.quiet else Progress("import", "flows read"),
        ):
            for removed in item.removed:
                print(f"streamtap import: removed {shown_path(removed)}, left unfinished by an import that was stopped; "
                      "importing the flow again", file=sys.stderr)
            if item.already:
                already += 1
                _out(f"{shown_path(item.path)}  already imported ({_safe(item.url)})")
            elif item.skipped:
                skipped += 1
                _out(f"skipped {_safe(item.flow_id[:12])} {_safe(item.url)}: {_safe(item.skipped)}")
            else:
                written += 1
                reason = "" if item.verdict == "complete" else f" ({_safe(item.reason)})"
                _out(
                    f"{shown_path(item.path)}  {item.verdict}{reason}  "
                    f"{item.provider} {_safe(item.model or '-')}, {item.events} events, {item.bytes} bytes"
                )
                if item.same_id is not None:  # both are answers the capture holds: neither is dropped
                    print(f"streamtap import: flow {_safe(item.flow_id)} is a different flow than {shown_path(item.same_id)}, "
                          f"which has the same id (a capture appended to, or a flow replayed and saved again): "
                          f"recorded beside it as {shown_path(item.path)}", file=sys.stderr)
    except _OutputFailed as exc:  # stdout, not --out: 141 for a closed pipe, as every verb, or its own error
        raise exc.error from None
    except CaptureIncomplete as exc:  # what was read is written, and the rest is said lost
        incomplete = exc
    except CaptureError as exc:
        raise UsageError(str(exc)) from None
    except PermissionError as exc:
        raise UsageError(f"--out {shown_path(args.out)}: {exc.strerror}") from None
    except RecordingError as exc:  # a recording could not be written: what was written stays, and is said
        failed = exc
    except OSError as exc:  # the folder or the disk (full, gone): the recordings before stay, and are counted
        if not written + skipped + already:  # nothing written: the --out folder itself was refused
            raise UsageError(f"--out {shown_path(args.out)}: {exc.strerror or exc}") from None
        failed = f"{shown_path(args.out)}: {exc.strerror or exc}"

    total = written + skipped + already
    if failed is not None:
        say("import", f"stopped after {total} flows: {failed}")  # the message may quote the capture's text
        return EXIT_FINDING
    if incomplete is not None:
        say("import", str(incomplete))  # it quotes the damaged flow's own text
        if not incomplete.flows:
            return EXIT_FINDING
    if total == 0:
        print(f"streamtap import: no streamed LLM answers in {shown_path(source)}", file=sys.stderr)
        return EXIT_FINDING
    if not args.quiet:
        print(
            f"streamtap import: {written} recorded, {already} already there, {skipped} skipped -> {shown_path(args.out)}",
            file=sys.stderr,
        )
    return EXIT_FINDING if skipped or incomplete else EXIT_OK


class _OutputFailed(Exception):
    """Writing a flow's line to stdout failed (a closed pipe, a full disk): kept apart from the
    OSErrors of the --out folder, which stop an import with the count of what it wrote."""

    def __init__(self, error: OSError) -> None:
        super().__init__(str(error))
        self.error = error


def _out(line: str) -> None:
    try:
        print(line)
    except OSError as exc:
        raise _OutputFailed(exc) from exc


def _safe(text: str) -> str:
    """A capture's text (a URL, a model name, a reason naming its events) on one line of the
    terminal, as show and report print it: it is someone else's text."""
    return terminal_safe(str(text), one_line=True)


def _looks_like_har(source: Path) -> bool:
    """A HAR file is JSON (mitmproxy reads it when it begins with ``{``, after a byte order mark);
    a capture begins with the length of its first flow."""
    try:
        with source.open("rb") as handle:
            head = handle.read(4096)
    except OSError:  # said by the import, as for any capture it cannot read
        return False
    return head.removeprefix(b"\xef\xbb\xbf").lstrip().startswith(b"{")
