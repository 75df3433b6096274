"""``python -m rtserve``: the command line the Makefile targets call; usable on its own."""

import sys

from rtserve.cli import main

sys.exit(main())
