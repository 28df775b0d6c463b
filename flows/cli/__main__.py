"""`python -m flows.cli`: the eps-screen command."""

import sys

from flows.cli import main

sys.exit(main())
