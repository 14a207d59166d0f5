"""``python -m fspyre.testing.campaign ARGS`` is ``fspyre campaign ARGS``."""

import sys

from fspyre.cli import main

if __name__ == "__main__":
    sys.exit(main(["campaign", *sys.argv[1:]]))
