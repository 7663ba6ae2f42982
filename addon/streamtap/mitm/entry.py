"""The mitmproxy script: `mitmdump -s "$(streamtap addon)"` (the checkout's addon/tap.py imports it).

mitmproxy loads a script by path and registers the objects in its ``addons`` list. This
file is that script inside the installed package, so it loads from any folder.
"""

from streamtap.mitm import contentview, option_checks, replay
from streamtap.mitm.metrics import Metrics
from streamtap.mitm.tap import Tap


def make_addons() -> list:
    """A fresh set of streamtap's addons (a script reload registers new instances)."""
    # The Tap comes first: addons after it (live faults) wrap its stream callable, so the
    # Tap records exactly the bytes the client gets.
    option_checks.plain_option_errors()
    tap = Tap()
    return [tap, Metrics(tap), *(cls() for cls in contentview.ADDONS), *(cls() for cls in replay.ADDONS)]


addons = make_addons()
