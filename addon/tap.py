"""mitmproxy entry point: `mitmdump -s addon/tap.py` (options: `mitmdump --options | grep streamtap_`)."""

import importlib
import sys
from pathlib import Path

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from streamtap.mitm.tap import Tap  # noqa: E402


def _optional(module_name: str) -> list:
    """Addons from modules that may not exist yet in this checkout."""
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name != module_name:
            raise
        return []
    return [cls() for cls in getattr(module, "ADDONS", [])]


# The Tap comes first: addons after it (live faults) wrap its stream callable, so the
# Tap records exactly the bytes the client gets.
addons = [Tap(), *_optional("streamtap.mitm.contentview"), *_optional("streamtap.mitm.replay")]
