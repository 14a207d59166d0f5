"""The Spyre machine model: constants, device formats and layouts, the interpreter."""

from fspyre.machine.spyre import Machine, spyre

__all__ = ["Machine", "spyre"]
