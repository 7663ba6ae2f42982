"""mitmproxy entry point in a checkout: `mitmdump -s addon/tap.py` (options: `mitmdump --options | grep streamtap_`).

Installed from a wheel, the same addon is `mitmdump -s "$(streamtap addon)"`.
"""

import sys
from pathlib import Path

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from streamtap.mitm.entry import make_addons  # noqa: E402

addons = make_addons()
