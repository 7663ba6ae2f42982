"""The mitmproxy script inside the installed package: `mitmdump -s "$(streamtap addon)"`.

mitmproxy loads a script by path, registers the objects in its ``addons`` list, and puts the
script's folder first on ``sys.path`` for good. So this file is alone in its folder: a module
beside it would be imported in place of a user's module of the same name (another addon's
``metrics`` or ``replay`` helper). The checkout's addon/tap.py builds the same addons.
"""

from streamtap.mitm.entry import make_addons

addons = make_addons()
