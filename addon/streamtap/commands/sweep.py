"""`streamtap sweep RECORDING -- CLIENT_CMD...`: which cuts does a client silently accept?"""

from __future__ import annotations

import argparse
import asyncio
import errno
import json
import math
import os
import re
import shutil
import signal
import sys
from pathlib import Path


EPILOG = """\
For each cut position and style a fresh replay server serves the recording cut there, and
CLIENT_CMD runs with the server's base URL in STREAMTAP_BASE_URL (also OPENAI_BASE_URL=URL/v1,
ANTHROPIC_BASE_URL, AWS_ENDPOINT_URL_BEDROCK_RUNTIME; dummy API keys, and none of your tokens:
ANTHROPIC_AUTH_TOKEN, AWS_SESSION_TOKEN and AWS_BEARER_TOKEN_BEDROCK are left out). Any request
gets the recording. Each run is classified by the client's exit status and by what it printed:
  noticed  exit code != 0; or exit 0 without printing the answer the cut stream delivered,
           and an error word in the output (error, exception, traceback, truncated,
           incomplete, interrupted, failed)
  SILENT   exit 0 with the partial answer printed as its answer (an error word beside it or
           inside it does not count), or exit 0 and nothing said: partial output silently
           accepted (the dangerous case)
  HUNG     still running at --timeout (killed, with whatever it started in its session)
  CRASHED  killed by a signal, or could not start (also exit 126 or 127: what a shell or
           env exits with when it cannot run the command)
  whole    exit 0, but the cut still left a stream judged complete (nothing partial taken)
  inconclusive  what would be noticed, when the client failed even uncut (the first run,
           without any cut: a wrong import, a missing variable): it says nothing of the cut
CLIENT_CMD is run directly, not through a shell: any exit status it chooses (255 from
sys.exit(-1) too) counts as noticed. Wrapped in `sh -c`, a client killed by a signal shows
as the shell's exit 128+N, noticed too: start it with `exec` there to have it counted as
crashed. A run ends when the client exits: what it left running in its session is killed
then, and what still holds its output does not keep the sweep waiting.
streamtap knows the answer each cut delivers (its text, else the tool-call arguments): a
client "prints it" when its output holds the first half of that text (up to 200 characters,
whitespace folded; answers under 12 characters are not looked for). With --error-text REGEX,
an exit-0 run whose output matches REGEX anywhere counts as noticed instead.

positions (--positions, comma list): events (after every event), protocol (tool-args,
escaped-quote, between-blocks, before-terminal, prelude, crc: those the stream has),
bytes=K (K byte offsets inside events), or explicit event=N, byte=N, at=NAME; events and
protocol take no value, bytes= needs its count. Names that cut at the same byte are one
position, run once: cut:at=before-terminal (cut:event=21).
Styles (--styles): clean (the body ends properly), abort (unterminated body, FIN), reset (RST).
An explicit position the recording does not have, or one at its very end (byte=LENGTH, the
last event when no bytes follow it: nothing would be cut), is refused before any run.

A recording that `streamtap verify` finds incomplete or damaged, or whose stream is cut or
corrupt even uncut, is swept all the same (the cuts still show how the client takes what was
recorded), after a one-line warning on stderr: the runs do not start from a whole, sound answer.

exit code: 0 every cut was noticed, 1 some were silent, hung or crashed, or the client failed
without any cut (its runs inconclusive, said in the summary), 2 usage error
(said before any run; also a --json file that could not be written after the runs, which
is left as it was: the error line says what the sweep found and the exit code it would
have had). On Ctrl-C, SIGTERM and SIGHUP the clients' runs are ended first; the runs that had
ended are still shown in the table and in --json (with "stopped_by"), and the exit code is
128 + the signal's number (130, 143, 129).

example (the source tree's examples/ folder holds three such clients):
  streamtap sweep recordings/live/x.jsonl --json report.json -- python my_client.py
"""


def configure(parser: argparse.ArgumentParser) -> None:
    from streamtap.cli import named_path

    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = EPILOG
    _options(parser)
    parser.add_argument("recording", type=named_path, help="the recording to cut (a .jsonl file)")
    # argparse drops a `--` met inside a sub-command, so everything after the recording is
    # taken as is and split at `--` here: options before it, the client command after it
    parser.add_argument("rest", nargs=argparse.REMAINDER, metavar="[OPTIONS] -- CLIENT_CMD ...", help="the client to run, after --")


def _options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    from streamtap.cli import named_path
    from streamtap.replay.sweep import DEFAULT_POSITIONS

    return [
        parser.add_argument("--positions", default=DEFAULT_POSITIONS, help=f"which cuts (default: {DEFAULT_POSITIONS})"),
        parser.add_argument("--styles", default="clean,abort", help="end styles, comma list of clean, abort, reset (default: clean,abort)"),
        parser.add_argument("--timeout", type=float, default=20.0, help="seconds before a client counts as hung (default 20)"),
        parser.add_argument("--jobs", "-j", type=int, default=0, help="clients run at once (default: the number of cores)"),
        parser.add_argument("--timing", default="fast", help="replay timing: fast (default), original or scale=N"),
        parser.add_argument("--json", type=named_path, metavar="FILE", help="also write the full report as JSON ('-' for stdout)"),
        parser.add_argument("--error-text", metavar="REGEX", help="an exit-0 run whose output matches REGEX counts as noticed, answer printed or not (default: exit status and printed answer decide, see below)"),
        parser.add_argument("--no-progress", action="store_true", help="no progress bar on stderr"),
    ]


def run(args: argparse.Namespace) -> int:
    from streamtap.cli import UsageError, write_file
    from streamtap.replay.faults import CUT_STYLES, FaultSpecError, Timing
    from streamtap.replay.source import RecordingError, load_source
    from streamtap.replay.sweep import (
        CRASHED, HUNG, SILENT, ClientNotStarted, SweepStopped, progress_bar, recording_problems, run_sweep,
        sweep_positions,
    )

    rest = list(args.rest)
    options = _OptionsParser(prog="streamtap sweep", add_help=False)
    option_names = {name for action in _options(options) for name in action.option_strings} | HELP
    if "--" in rest:
        before, command = rest[: rest.index("--")], rest[rest.index("--") + 1 :]
    else:
        before, command = [], rest
        if command and _names_an_option(command[0], option_names):  # `sweep REC --no-progress python x.py`
            if any(_names_an_option(word, HELP) for word in command):  # `sweep REC --help`: asked, not mistaken
                return _print_help()
            raise UsageError(
                f"{command[0]} is an option of streamtap sweep, not a client command: put -- before the client "
                "(streamtap sweep REC.jsonl [OPTIONS] -- CLIENT_CMD ...)"
            )
    if any(_names_an_option(word, HELP) for word in before):  # argparse never sees these words: the help is asked here
        return _print_help()
    if before:
        options.parse_args(before, namespace=args)
    try:
        os.stat(args.recording)
    except FileNotFoundError:  # `sweep -- python x.py` takes python for the recording: said of it, not of x.py
        raise UsageError(f"{args.recording}: no such recording file (streamtap sweep REC.jsonl [OPTIONS] -- CLIENT_CMD ...)") from None
    except OSError as exc:  # there, but not to be looked at (a folder on its way that may not be searched)
        raise UsageError(f"{args.recording}: {exc.strerror or exc}") from None
    if not command:
        raise UsageError("no client command: put it after --, e.g. streamtap sweep REC.jsonl -- python client.py")
    if shutil.which(command[0]) is None:  # a typo would make every run "crashed", the cause only in --json
        where = "not an executable file" if os.sep in command[0] and os.path.exists(command[0]) else "no such command"
        raise UsageError(f"cannot start the client {command[0]!r}: {where}")
    # a style named twice is one column of the table: run and counted once, as positions are
    styles = tuple(dict.fromkeys(s.strip() for s in args.styles.split(",") if s.strip()))
    if not styles or any(s not in CUT_STYLES for s in styles):
        raise UsageError(f"--styles takes {', '.join(CUT_STYLES)}, not {args.styles!r}")
    if not (math.isfinite(args.timeout) and args.timeout > 0):
        raise UsageError(f"--timeout must be a number of seconds > 0, not {args.timeout:g}")
    if args.jobs < 0:
        raise UsageError(f"--jobs must be 0 (one per core) or more, not {args.jobs}")
    error_text = args.error_text
    try:
        if error_text is not None:
            re.compile(error_text)
    except re.error as exc:
        raise UsageError(f"--error-text {error_text!r} is not a regular expression: {exc}") from None
    try:
        source = load_source(args.recording, check=True)
    except (RecordingError, OSError) as exc:
        raise UsageError(str(exc)) from None
    try:
        timing = Timing.parse(args.timing)
        positions = sweep_positions(source, args.positions)
    except FaultSpecError as exc:
        raise UsageError(str(exc)) from None
    if not positions:
        raise UsageError(f"{args.recording} has no cut positions for {args.positions!r}")
    if args.json not in (None, "-"):
        _refuse_unwritable(Path(args.json))
    problems = recording_problems(source)
    if problems:
        print(f"streamtap sweep: warning: {args.recording}: {'; '.join(problems)}", file=sys.stderr)
    progress = None if args.no_progress or not sys.stderr.isatty() else progress_bar(sys.stderr)
    sweep = run_sweep(
        source,
        command,
        positions=positions,
        styles=styles,
        timing=timing,
        timeout=args.timeout,
        jobs=args.jobs or None,
        error_text=error_text,
        progress=progress,
    )
    caught: list[int] = []
    # Ctrl-C too, unless it is ignored (a job started in the background): a handler would undo that
    ending = TERMINATING + ((signal.SIGINT,) if signal.getsignal(signal.SIGINT) is signal.default_int_handler else ())
    try:
        report = asyncio.run(_stopped_by(ending, sweep, caught))
    except SweepStopped as stopped:
        if progress:
            print(file=sys.stderr)  # off the progress bar's line
        return _say_what_ran(stopped.report, signal.Signals(caught[0]).name, args.json)
    except ClientNotStarted as exc:  # found, but no run can start it (no #! line, a missing interpreter)
        raise UsageError(f"cannot start the client {command[0]!r}: {_why_not_started(command[0], exc.error)}") from None
    data = report.to_dict()
    counts = report.counts()
    found = 1 if counts[SILENT] or counts[HUNG] or counts[CRASHED] or report.baseline_failed else 0
    if args.json == "-":
        print(json.dumps(data, indent=1))
    else:
        print(report.table())
        if args.json:
            try:
                write_file(args.json, json.dumps(data, indent=1) + "\n")
            except OSError as exc:
                # exit 2, as for any file that cannot be written, but the sweep's own result is said: it is not lost
                what = (f"{counts[SILENT]} silent, {counts[HUNG]} hung, {counts[CRASHED]} crashed"
                        + (", the client failed without any cut" if report.baseline_failed else "")) if found else "every cut noticed"
                raise UsageError(f"--json {args.json}: {exc.strerror or exc}; the JSON report was not written. "
                                 f"The sweep (the table above) found: {what} (exit {found} but for this)") from None
    return found


def _say_what_ran(report, name: str, json_path: str | None) -> int:
    """A stopped sweep's runs that had ended, as the table and the JSON report (``stopped_by``
    naming the signal) it would have given: they took their time, and say something already."""
    from streamtap.cli import write_file

    print(f"streamtap sweep: stopped by {name} after {len(report.runs)} of {report.planned} runs; "
          "the clients' runs were ended", file=sys.stderr)
    data = report.to_dict() | {"stopped_by": name}
    if json_path == "-":
        print(json.dumps(data, indent=1))
    elif report.runs:
        print(report.table())
    if json_path not in (None, "-") and report.runs:  # with nothing to say, a report already there is kept
        try:
            write_file(json_path, json.dumps(data, indent=1) + "\n")
        except OSError as exc:
            print(f"streamtap sweep: --json {json_path}: {exc.strerror or exc}; the JSON report was not written",
                  file=sys.stderr)
    return 128 + signal.Signals[name]  # as a shell reports a process the signal ended


# What `timeout`, a CI runner or `kill` (SIGTERM) and a closed terminal (SIGHUP) send: the
# clients run in sessions of their own, so the sweep ends their runs itself, as on Ctrl-C
TERMINATING = (signal.SIGTERM, signal.SIGHUP)


async def _stopped_by(signals: tuple[int, ...], work, caught: list[int]):
    """``work``, cancelled (its runs' clients killed on the way out) when one of ``signals``
    arrives; ``caught`` learns which."""
    loop, task = asyncio.get_running_loop(), asyncio.current_task()

    def stop(signum: int) -> None:
        caught.append(signum)
        if len(caught) == 1:  # a second one must not cut short the ending of the runs the first began
            task.cancel()

    for signum in signals:
        loop.add_signal_handler(signum, stop, signum)
    return await work


def _why_not_started(program: str, error: OSError) -> str:
    """What stopped ``program``, a file ``which`` found, from starting: exec's ENOENT for a file
    that is there means that what its #! line names is not."""
    why = error.strerror or str(error)
    if error.errno == errno.ENOEXEC:
        return f"{why} (a script needs a #! line naming its interpreter)"
    path = shutil.which(program)
    if error.errno == errno.ENOENT and path:
        interpreter = _interpreter(path)
        if interpreter and not os.path.exists(interpreter):
            return f"its #! interpreter {interpreter!r} does not exist"
    return why


def _interpreter(path: str) -> str | None:
    """The interpreter a script's #! line names (its first word, as the kernel reads it)."""
    try:
        with open(path, "rb") as script:
            line = script.readline(256)
    except OSError:
        return None
    words = line[2:].split() if line.startswith(b"#!") else []
    return os.fsdecode(words[0]) if words else None


HELP = {"-h", "--help"}


class _OptionsParser(argparse.ArgumentParser):
    """Reads the options after the recording: a mistake in them is one line, as any usage error
    (argparse's own error prints the usage first, then exits)."""

    def error(self, message: str):
        from streamtap.cli import UsageError

        raise UsageError(f"{message} (see streamtap sweep --help)")


def _print_help() -> int:
    """The sweep's whole help, as `streamtap sweep --help` prints it."""
    from streamtap.cli import EXIT_OK, build_parser

    build_parser(["sweep"]).verb_parsers["sweep"].print_help()
    return EXIT_OK


def _names_an_option(word: str, option_names: set[str]) -> bool:
    """Whether ``word`` would be read as one of ``option_names`` (``--timeout=5``, ``-j4`` and
    an abbreviation such as ``--no-prog`` too, as argparse reads them)."""
    if word.startswith("--"):
        name = word.split("=")[0]
        return len(name) > 2 and any(option.startswith(name) for option in option_names if option.startswith("--"))
    return word[:2] in option_names


def _refuse_unwritable(path: Path) -> None:
    """Refuse, before any run, a --json path the report cannot be written to (a folder, no
    such folder, no permission): found after the sweep, it would lose the report and hide
    the sweep's exit code."""
    from streamtap.cli import UsageError, refuse_recording_as_output

    refuse_recording_as_output("--json", path)
    existed = os.path.lexists(path)
    try:
        path.open("a").close()  # appending nothing leaves a file that is there as it was
    except OSError as exc:
        raise UsageError(f"--json {path}: {exc.strerror or exc}") from None
    if not existed:
        path.unlink()  # made only to try: the report is written after the sweep
