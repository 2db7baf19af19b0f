"""`python -m rlvr.cli ...` is the `rlvr` command."""

import sys

from rlvr.cli.dispatch import main

sys.exit(main())
