"""The `streamtap` command: one verb per module under streamtap.commands.

Exit codes scripts can trust: 0 success (for `verify`: every input complete), 1 a
finding (an incomplete turn, a failed check), 2 a usage error (bad arguments, missing
file; also an output file that could not be written once the work was done, whose error line
then says the finding), 3 an internal error in streamtap itself, 130 interrupted, 141 the output was closed
before everything was written (``| head``), as for a tool that SIGPIPE ended, 143 and 129 ended by
SIGTERM or SIGHUP.
"""

from __future__ import annotations

import argparse
import codecs
import errno
import importlib
import os
import re
import signal
import stat
import sys
import textwrap
import threading
import time
import traceback
from collections.abc import Collection, Iterable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

# verb -> (module, one-line help). The help lives here, not in the module, so that
# `streamtap --help` lists every verb without importing any, and `streamtap VERB` imports
# only VERB's module (all of them cost ~0.2 s of CPU, a report over an index ~0.1 s).
# Each module defines configure(parser) and run(args) -> int.
VERBS: dict[str, tuple[str, str]] = {
    "demo": ("streamtap.commands.demo",
             "Watch streamtap catch a cut answer: bundled recordings, real SDK clients, a real mitmdump (offline)."),
    "show": ("streamtap.commands.show",
             "Render captured streams as turns: thinking and answer apart, tool calls, verdict, timing."),
    "verify": ("streamtap.commands.verify",
             "Judge captured streams: one line per file; exit 0 only if every turn is complete."),
    "import": ("streamtap.commands.import_mitm",
             "Turn a mitmproxy capture (mitmdump -w FILE) into streamtap recordings, one per streamed LLM answer."),
    "serve": ("streamtap.commands.serve",
             "Serve recordings back to real clients (the recorded body byte for byte, original timing, injected cuts and faults)."),
    "sweep": ("streamtap.commands.sweep",
             "Replay a recording cut at every position, run a client against each, and report which cuts it swallows."),
    "report": ("streamtap.commands.report",
             "Report across many recordings: verdict counts and rates by provider, model and day; stream ends; TTFT and duration p50/p95/p99; top reasons; the incomplete ones."),
    "index": ("streamtap.commands.index",
             "Index recordings into Parquet (one row per recording, hive-partitioned by day and provider) for DuckDB, Spark, Trino, Athena."),
    "addon": ("streamtap.commands.addon",
             "Print the absolute path of streamtap's mitmproxy script, for mitmdump/mitmweb/mitmproxy -s."),
}

EXIT_OK, EXIT_FINDING, EXIT_USAGE, EXIT_INTERNAL = 0, 1, 2, 3
EXIT_INTERRUPTED, EXIT_OUTPUT_CLOSED = 130, 141  # the shell's 128 + SIGINT, 128 + SIGPIPE


# What `timeout`, cron, systemd or `kill` (SIGTERM) and a closed terminal (SIGHUP) send. Their default
# ends Python at once, leaving an index's half-made folder and temporary files behind; raised as an
# interrupt, they unwind as Ctrl-C does, and the exit code is the shell's 128 + the signal all the same.
ENDING_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
# ...except in these verbs: sweep and demo stop their own work on them, and serve's default end (its
# streams cut, exit 143) is what its clients should see; an interrupt in its loop would wait for
# the threads making its plans
ENDING_SIGNALS_THEIR_OWN = ("serve", "sweep", "demo")
_ended_by: list[int] = []  # the ending signal that arrived, if one did


class UsageError(Exception):
    """A user mistake: printed as one line, exit 2, never a traceback."""


# What a terminal would act on rather than show: control characters (ESC starts colour, title
# and clipboard sequences; CR overwrites a line), C1 controls, and the marks that reorder text
C1_AND_REORDERING = "\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069"
_NOT_FOR_A_TERMINAL = re.compile(f"[\x00-\x08\x0b-\x1f{C1_AND_REORDERING}]")
_NOT_FOR_ONE_LINE = re.compile(f"[\x00-\x1f{C1_AND_REORDERING}]")  # a log line: newlines and tabs too


def terminal_safe(text: str, one_line: bool = False) -> str:
    """``text`` as a terminal shows it, whoever wrote it (a model's answer, a recorded model
    name): each such character written as its Python escape (``\\x1b``, ``\\u202e``); newlines
    and tabs kept, unless ``text`` goes into ``one_line`` of a log, which a newline would forge."""
    pattern = _NOT_FOR_ONE_LINE if one_line else _NOT_FOR_A_TERMINAL
    return pattern.sub(lambda match: match[0].encode("unicode_escape").decode("ascii"), text)


def failure(exc: BaseException) -> str:
    """An exception for one line of a log: its message may quote the traffic that raised it."""
    return terminal_safe(f"{type(exc).__name__}: {exc}", one_line=True)


def named_path(value: str) -> str:
    """argparse type of a path the user names: an empty one, as an unset shell variable gives,
    would mean the current folder (searched, served or written over) without a word."""
    if not value:
        raise argparse.ArgumentTypeError("an empty name (an unset shell variable?) would mean the current folder; give the path")
    return value


def named_folder(value: str) -> Path:
    """``named_path`` for a folder the verb writes into."""
    return Path(named_path(value))


def write_out(text: str, encoding: str | None = None) -> None:
    """Write ``text`` to stdout whole (in ``encoding``, else stdout's). A buffered write larger than
    a pipe holds can return having written only part, without an error, when the reader goes away
    (``| head``): the rest would be lost silently and the exit code would not say so. Writing on
    until all is taken makes the closed pipe raise, as the verbs' exit code 141 needs."""
    if encoding is None:
        encoding = sys.stdout.encoding or "utf-8"
    _write_whole(sys.stdout, text.encode(encoding, sys.stdout.errors or "strict"))


def _write_whole(stream, data: bytes) -> None:
    """``data`` written whole through ``stream``'s buffer, after what the stream holds."""
    stream.flush()
    view = memoryview(data)
    while view:
        view = view[stream.buffer.write(view):]
    stream.buffer.flush()


def json_for_stdout(text: str) -> str:
    """JSON text as is on a UTF-8 stdout; on any other, every character past ASCII a JSON escape
    (a surrogate pair beyond the BMP): JSON between programs is UTF-8 (RFC 8259), which ASCII is,
    and the Python escapes the output writes otherwise no JSON reader takes."""
    try:
        if codecs.lookup(sys.stdout.encoding or "utf-8").name == "utf-8":
            return text
    except LookupError:
        return text
    return text.encode("ascii", _JSON_ESCAPES).decode("ascii")


def _json_escapes(error: UnicodeError) -> tuple[str, int]:
    escaped = []
    for char in error.object[error.start : error.end]:
        code = ord(char)
        if code > 0xFFFF:
            code -= 0x10000
            escaped.append(f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}")
        else:
            escaped.append(f"\\u{code:04x}")
    return "".join(escaped), error.end


_JSON_ESCAPES = "streamtap-json-escapes"
codecs.register_error(_JSON_ESCAPES, _json_escapes)


def check_names(flag: str, names: Iterable[str]) -> None:
    """Refuse a header, query parameter or field name that cannot be one (a list given as one
    value, an unset shell variable): it would match, redact or allow nothing, silently."""
    from streamtap.recording.redact import name_problem

    for name in names:
        problem = name_problem(name)
        if problem:
            raise UsageError(f"{flag}: {problem}")


def write_file(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` (UTF-8) to the file ``path`` names, whole or not at all: a regular file, or
    a new one, through a temporary file beside it renamed over it once written, so that a full
    disk leaves the file as it was (or none), never cut short; anything else (a fifo, /dev/stdout,
    a device) is written as it is, and so is the file stdout or stderr writes to (`--html
    /dev/stdout > out.txt`: the shell's file is the one written, what follows it on stdout too).
    Raises OSError (PermissionError for a file that may not be written, as open() does)."""
    try:
        found: os.stat_result | None = os.stat(path)  # the object a link leads to: a pipe's /proc/PID/fd/1 too
    except FileNotFoundError:
        found = None
    if found is not None:
        stream = _standard_stream_on(found)
        if stream is not None:
            _write_whole(stream, text.encode("utf-8"))
            return
        if not stat.S_ISREG(found.st_mode):
            Path(path).write_text(text, encoding="utf-8")
            return
        if not os.access(path, os.W_OK):  # a read-only file is refused, not replaced: its folder's permission is not its own
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), os.fspath(path))
    target = os.path.realpath(path)  # a link to the file stays one: the file it leads to is replaced
    folder, name = os.path.split(target)
    temporary = os.path.join(folder, f".{name}.{os.urandom(4).hex()}.tmp")  # hidden: no glob of the folder takes it
    try:  # 0o666 as for a file opened anew: the umask applies
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
    except PermissionError:
        if found is None:
            raise
        Path(target).write_text(text, encoding="utf-8")  # a file that may be written in a folder that may not: in place
        return
    try:
        with open(fd, "w", encoding="utf-8") as out:
            if found is not None:
                os.fchmod(fd, stat.S_IMODE(found.st_mode))  # the file keeps its permissions
            out.write(text)
            out.flush()
            os.fsync(fd)  # a file system that reserves space late says it is full here, not after the rename
    except BaseException:
        with suppress(OSError):
            os.unlink(temporary)
        raise
    try:
        os.replace(temporary, target)
    except BaseException as error:
        with suppress(OSError):
            os.unlink(temporary)
        if found is None or not isinstance(error, PermissionError):
            raise
        # another user's file open to all in a sticky folder (/tmp): it may be written, not replaced
        Path(target).write_text(text, encoding="utf-8")


def _standard_stream_on(found: os.stat_result):
    """stdout or stderr when it writes to the file ``found`` is, else None."""
    for stream in (sys.stdout, sys.stderr):
        with suppress(AttributeError, OSError, ValueError):  # a stream closed, replaced or with no file
            if os.path.samestat(found, os.fstat(stream.fileno())):
                return stream
    return None



def refuse_recording_as_output(option: str, path) -> None:
    """An output file a verb is told to write must not be a recording: it would be lost."""
    from streamtap.recording.catalog import is_recording_file

    if is_recording_file(path):
        raise UsageError(f"{option} {path}: this file is a recording; streamtap never writes over one (name a new file)")


def version_line() -> str:
    """The version, and which loops this install runs in C (the decoders', the recording writer's
    frame lines): pip says nothing of a C build that failed (but with -v), and the Python loops
    are slower."""
    from streamtap import __version__
    from streamtap.recording import writer
    from streamtap.wire import accel

    def which(compiled: bool) -> str:
        if compiled:
            return "compiled C"
        if accel.pure_python_asked:
            return "Python, STREAMTAP_PURE_PYTHON is set"
        return "Python, the C build is missing"

    return f"streamtap {__version__} (decoder loops: {which(accel.compiled)}; frame lines: {which(writer.compiled_lines)})"


class _VersionAction(argparse.Action):
    """``--version``: the line as it is, one line (argparse's own action wraps it to the terminal's
    width), and only made when asked for (it imports the compiled modules to name them)."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS,
                         help="print the version and which loops run compiled, and exit")

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        parser._print_message(version_line() + "\n", sys.stdout)  # stdout, as argparse's own action
        parser.exit()


# what every verb may exit with besides its own codes, said at the end of each one's --help
EVERY_VERB_EXITS = (
    "Like every verb, it also exits 3 on an internal error (a bug: its traceback follows), 130 when "
    "interrupted (Ctrl-C), 141 when its output was closed before it finished (| head), and 143 or 129 "
    "when ended by SIGTERM or SIGHUP."
)


def build_parser(configured: Collection[str] = VERBS) -> argparse.ArgumentParser:
    """The parser. Only the ``configured`` verbs' modules are imported and their arguments
    added; the other verbs are listed with their one-line help and take no arguments."""
    parser = argparse.ArgumentParser(
        prog="streamtap",
        description="Tap, record, judge and replay streamed LLM answers (SSE, AWS event-stream, NDJSON).",
        epilog="Run `streamtap VERB --help` for each verb. Exit codes: 0 ok, 1 finding, 2 usage error, 3 internal error, "
        "130 interrupted (Ctrl-C), 141 the output was closed before the verb finished (| head), "
        "143 and 129 ended by SIGTERM or SIGHUP (what was half made is removed, as on Ctrl-C).",
    )
    parser.add_argument("--version", action=_VersionAction)
    verbs = parser.add_subparsers(dest="verb", metavar="VERB")
    parser.verb_parsers = {}  # type: ignore[attr-defined]  # (a flag a verb does not take is its error, with its usage)
    for verb, (module_name, help_line) in VERBS.items():
        sub = parser.verb_parsers[verb] = verbs.add_parser(verb, help=help_line, description=help_line)  # type: ignore[attr-defined]
        if verb in configured:
            module = importlib.import_module(module_name)
            module.configure(sub)
            sub.set_defaults(run=module.run)
            common = textwrap.fill(EVERY_VERB_EXITS, 90)  # (verbs with a raw help text keep its lines as written)
            sub.epilog = f"{sub.epilog.rstrip()}\n\n{common}" if sub.epilog else common
    return parser


def chosen_verb(argv: list[str]) -> str | None:
    """The verb in ``argv``: the first word that is not an option (the top level takes no
    option with a value)."""
    return next((word for word in argv if not word.startswith("-")), None)


@contextmanager
def _interrupts_held() -> Iterator[None]:
    """Hold Ctrl-C until the block ends, then take it: the verbs load C extensions (orjson,
    DuckDB, zstandard), and an interrupt raised while one sets itself up can crash the
    interpreter instead of stopping it."""
    held = hasattr(signal, "pthread_sigmask") and threading.current_thread() is threading.main_thread()
    before = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, *ENDING_SIGNALS}) if held else None
    try:
        yield
    finally:
        if before is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, before)  # a pending Ctrl-C is raised now


@contextmanager
def queries_stop_on_ctrl_c() -> Iterator[None]:
    """Ctrl-C stops a running DuckDB query at once. Python runs its SIGINT handler only between
    bytecodes, and a long query keeps the main thread in C, where DuckDB notices the signal only
    now and then. The signal's wakeup byte reaches a watcher thread at once, which interrupts
    every open connection; the verb then ends as any Ctrl-C does (exit 130).

    DuckDB is loaded first (through fleet, whose connections the watcher interrupts), with
    Ctrl-C held: interrupted while it sets itself up, a DuckDB import aborts the interpreter,
    and a second one (as the watcher's was) after an interrupted first aborts it too."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    with _interrupts_held():
        from streamtap.recording import fleet
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    previous = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)

    def watch() -> None:
        while signals := os.read(read_end, 64):  # b"" once the block below closed its end
            if signal.SIGINT in signals or any(signum in signals for signum in ENDING_SIGNALS):
                fleet.interrupt_queries()

    watcher = threading.Thread(target=watch, name="streamtap-ctrl-c", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        signal.set_wakeup_fd(previous)
        os.close(write_end)
        watcher.join(timeout=5)
        os.close(read_end)


# The last line of a KeyboardInterrupt's traceback, as DuckDB quotes it in its own error
_QUOTED_INTERRUPT = re.compile(r"^KeyboardInterrupt$", re.MULTILINE)


def _interrupted(exc: Exception) -> bool:
    """DuckDB turns a Ctrl-C during a query into an exception of its own, and one during a module
    it imports by itself (zoneinfo, for its first timestamp) into an error quoting the traceback."""
    if type(exc).__name__ == "InterruptException" or (type(exc) is RuntimeError and str(exc) == "Query interrupted"):
        return True
    duckdb = sys.modules.get("duckdb")  # an error of DuckDB's comes only once it is loaded
    return duckdb is not None and isinstance(exc, duckdb.Error) and _QUOTED_INTERRUPT.search(str(exc)) is not None


def escape_what_the_output_cannot_encode() -> None:
    """On an output that is not UTF-8 (PYTHONIOENCODING=latin-1, a legacy locale), a character it
    cannot encode is written as its Python escape (``\\u2500``), as ``terminal_safe`` writes a
    control character: a model's name, an answer or show's rules would otherwise stop the verb
    with a traceback."""
    for stream in (sys.stdout, sys.stderr):
        encoding, errors = getattr(stream, "encoding", None), getattr(stream, "errors", None)
        if not encoding or not hasattr(stream, "reconfigure") or errors not in ("strict", "surrogateescape"):
            continue  # not a stream that can be told (a test's capture), or one told already (PYTHONIOENCODING=latin-1:replace)
        try:
            if codecs.lookup(encoding).name != "utf-8":
                stream.reconfigure(errors="backslashreplace")
        except (LookupError, ValueError, OSError):  # left as it is: the verb still runs
            pass


def give_closed_outputs_a_sink() -> None:
    """A verb started with its stdout or stderr closed (``>&-``) finds ``sys.stdout`` None: its
    output goes nowhere, as it would to /dev/null, and the exit code still says the verdict."""
    for name in ("stdout", "stderr"):
        if getattr(sys, name) is None:
            setattr(sys, name, open(os.devnull, "w", encoding="utf-8"))


@contextmanager
def _ending_signals_interrupt(verb: str | None) -> Iterator[None]:
    """SIGTERM and SIGHUP raise KeyboardInterrupt, as Ctrl-C does, while the verb runs (see
    ENDING_SIGNALS and ENDING_SIGNALS_THEIR_OWN)."""
    if threading.current_thread() is not threading.main_thread() or verb in ENDING_SIGNALS_THEIR_OWN:
        yield
        return

    def end(signum: int, frame) -> None:
        _ended_by.append(signum)
        raise KeyboardInterrupt

    # only a signal left at its default: `nohup` ignores SIGHUP, and a program calling main() may
    # handle SIGTERM itself
    taken = [signum for signum in ENDING_SIGNALS if signal.getsignal(signum) is signal.SIG_DFL]
    for signum in taken:
        signal.signal(signum, end)
    try:
        yield
    finally:
        for signum in taken:
            signal.signal(signum, signal.SIG_DFL)


def _interrupted_code() -> int:
    return 128 + _ended_by[0] if _ended_by else EXIT_INTERRUPTED


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    _ended_by.clear()
    with _ending_signals_interrupt(chosen_verb(argv)):
        return _main(argv)


def _main(argv: list[str]) -> int:
    give_closed_outputs_a_sink()
    escape_what_the_output_cannot_encode()
    verb = chosen_verb(argv)
    try:
        with _interrupts_held():
            parser = build_parser([verb] if verb in VERBS else [])
        args, unknown = parser.parse_known_args(argv)
        if unknown:  # argparse would say it with the top level's usage, which names no option of the verb's
            parser.verb_parsers.get(args.verb, parser).error(f"unrecognized arguments: {' '.join(unknown)}")
    except KeyboardInterrupt:
        return _interrupted_code()
    except Exception as exc:  # a verb's module that fails to import (a broken install): a bug, not a finding
        if _interrupted(exc):
            return _interrupted_code()
        traceback.print_exc()
        return EXIT_INTERNAL
    if not getattr(args, "run", None):
        parser.print_help()
        return EXIT_USAGE
    try:
        return _run(args)
    except KeyboardInterrupt:  # also one that arrives while _run handles another exception
        return _interrupted_code()


def say(verb: str, message: str) -> None:
    """One line on stderr, ``streamtap VERB: message``. The message may hold a file name from a
    shared folder or a recording's own text (its header's format), someone else's text: what a
    terminal would act on (ESC, BEL, a newline forging a line) is written as its escape, and the
    bytes of a name that are not UTF-8 as ``\\xff``, as verify writes them."""
    from streamtap.recording.reader import shown_path

    try:
        message = shown_path(message)
    except UnicodeEncodeError:  # a lone surrogate no file name holds: stderr's backslashreplace writes it
        pass
    print(f"streamtap {verb}: {terminal_safe(message, one_line=True)}", file=sys.stderr, flush=True)


class Progress:
    """A line on stderr every second or so while a verb reads many inputs, as `import` says the
    flows it has read: ``streamtap VERB: N WHAT (S s)``. A run shorter than a second says nothing."""

    def __init__(self, verb: str, what: str) -> None:
        self.verb, self.what = verb, what
        self.start = self.last = time.monotonic()

    def __call__(self, done: int) -> None:
        now = time.monotonic()
        if now - self.last >= 1.0:
            self.last = now
            say(self.verb, f"{done} {self.what} ({now - self.start:.0f} s)")


def _run(args: argparse.Namespace) -> int:
    """The verb, and what each way of failing means for the exit code."""
    try:
        return int(args.run(args) or 0)
    except UsageError as exc:
        say(args.verb, str(exc))
        return EXIT_USAGE
    except BrokenPipeError:
        # not a success: what was left to say (and the verdict it sums up) never reached the
        # reader. Later writes (the interpreter's flush at exit) go nowhere instead of failing.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OUTPUT_CLOSED
    except OSError as exc:  # the file system refused a path the user gave (too long, not a folder, ...)
        from streamtap.recording.reader import shown_path

        where = f"{shown_path(exc.filename)}: " if isinstance(exc.filename, str | bytes) else ""
        say(args.verb, f"{where}{exc.strerror or exc}")
        return EXIT_USAGE
    except Exception as exc:  # a bug in streamtap: its traceback helps, and exit 3 keeps it apart from a finding
        if _interrupted(exc):
            return _interrupted_code()
        traceback.print_exc()
        return EXIT_INTERNAL


if __name__ == "__main__":
    # Run as `python -m streamtap.cli`, this file is __main__; the verbs raise
    # streamtap.cli.UsageError, so dispatch through that module's main.
    from streamtap.cli import main as package_main

    sys.exit(package_main())
