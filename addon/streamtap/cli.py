"""The `streamtap` command: one verb per module under streamtap.commands.

Exit codes scripts can trust: 0 success (for `verify`: every input complete), 1 a
finding (an incomplete turn, a failed check), 2 a usage error (bad arguments, missing
file), 3 an internal error in streamtap itself.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import traceback

# verb -> module; each module defines HELP (one line), configure(parser) and run(args) -> int
VERBS = {
    "demo": "streamtap.commands.demo",
    "show": "streamtap.commands.show",
    "verify": "streamtap.commands.verify",
    "import": "streamtap.commands.import_mitm",
    "serve": "streamtap.commands.serve",
    "sweep": "streamtap.commands.sweep",
    "report": "streamtap.commands.report",
    "index": "streamtap.commands.index",
    "addon": "streamtap.commands.addon",
}

EXIT_OK, EXIT_FINDING, EXIT_USAGE, EXIT_INTERNAL = 0, 1, 2, 3


class UsageError(Exception):
    """A user mistake: printed as one line, exit 2, never a traceback."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="streamtap",
        description="Tap, record, judge and replay streamed LLM answers (SSE, AWS event-stream, NDJSON).",
        epilog="Run `streamtap VERB --help` for each verb. Exit codes: 0 ok, 1 finding, 2 usage error, 3 internal error.",
    )
    from streamtap import __version__

    parser.add_argument("--version", action="version", version=f"streamtap {__version__}")
    verbs = parser.add_subparsers(dest="verb", metavar="VERB")
    for verb, module_name in VERBS.items():
        module = importlib.import_module(module_name)
        sub = verbs.add_parser(verb, help=module.HELP, description=module.HELP)
        module.configure(sub)
        sub.set_defaults(run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "run", None):
        parser.print_help()
        return EXIT_USAGE
    try:
        return int(args.run(args) or 0)
    except UsageError as exc:
        print(f"streamtap {args.verb}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return EXIT_OK
    except Exception:  # a bug in streamtap: its traceback helps, and exit 3 keeps it apart from a finding
        traceback.print_exc()
        return EXIT_INTERNAL


if __name__ == "__main__":
    # Run as `python -m streamtap.cli`, this file is __main__; the verbs raise
    # streamtap.cli.UsageError, so dispatch through that module's main.
    from streamtap.cli import main as package_main

    sys.exit(package_main())
