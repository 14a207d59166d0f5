"""``python -m fspyre``: the same command as the ``fspyre`` console script."""

from fspyre.cli import main

raise SystemExit(main())
