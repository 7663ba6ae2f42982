"""`python -m streamtap VERB ...`: the same as the `streamtap` command."""

import sys

from streamtap.cli import main

sys.exit(main())
