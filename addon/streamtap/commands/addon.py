"""`streamtap addon`: the path of the mitmproxy script inside the installed package."""

from __future__ import annotations

import argparse
from pathlib import Path


EPILOG = """\
mitmproxy loads addons from a script path. The script ships inside the installed package,
so this works from any folder, in any environment streamtap is installed in:

  mitmdump -s "$(streamtap addon)" --mode reverse:https://api.openai.com --listen-host 127.0.0.1 --listen-port 8080
  mitmweb  -s "$(streamtap addon)" --listen-host 127.0.0.1 --set store_streamed_bodies=true
  mitmdump -s "$(streamtap addon)" --options | grep streamtap_

(Without --listen-host, mitmproxy listens on every interface: anyone who can reach the port can
send requests through it, and have them recorded.)

In a git checkout, addon/tap.py is the same addon.

exit code: 0 the path was printed.
"""


def script_path() -> Path:
    import streamtap

    # a path, not an import: importing the script would load mitmproxy and build the addons
    return Path(streamtap.__file__).resolve().parent / "mitm" / "script" / "streamtap_addon.py"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = EPILOG


def run(args: argparse.Namespace) -> int:
    print(script_path())
    return 0
