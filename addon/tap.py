"""mitmproxy entry point: `mitmdump -s addon/tap.py` (options: `mitmdump --options | grep streamtap_`)."""

import sys
from pathlib import Path

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from streamtap.mitm import contentview, replay  # noqa: E402
from streamtap.mitm.metrics import Metrics  # noqa: E402
from streamtap.mitm.tap import Tap  # noqa: E402

# The Tap comes first: addons after it (live faults) wrap its stream callable, so the
# Tap records exactly the bytes the client gets.
tap = Tap()
addons = [tap, Metrics(tap), *(cls() for cls in contentview.ADDONS), *(cls() for cls in replay.ADDONS)]
