"""streamtap's mitmproxy addons, as the scripts build them: the installed package's
``script/streamtap_addon.py`` (`mitmdump -s "$(streamtap addon)"`) and the checkout's addon/tap.py.
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

