"""``python -m fspyre``: the same command as the ``fspyre`` console script."""

from fspyre.cli import main

# guarded: a process pool that spawns (``fspyre zoo --workers N``) imports this module again
if __name__ == "__main__":
    raise SystemExit(main())
