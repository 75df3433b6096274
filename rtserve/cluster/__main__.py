"""``python -m rtserve.cluster modules|start|stop|status``: see rtserve/cluster/cli.py."""

from rtserve.cluster.cli import main

raise SystemExit(main())
