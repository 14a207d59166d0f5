"""One exception hierarchy for every report fspyre gives.

Each message names the culprit (op, dim, tensor, numbers) and what the user can change.
The CLI prints ``str(err)`` without a traceback and exits 2.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:  # errors is imported by everything: no import of the IR at run time
    from fspyre.ir.kinds import Memory


class FspyreError(Exception):
    """Root of every error fspyre raises on purpose."""


class GraphError(FspyreError):
    """A graph is malformed: unknown dtype, bad dim, shape or dim-name mismatch."""


class HintError(FspyreError):
    """A tiling or work-division hint cannot be honoured as written."""


class TilingError(FspyreError):
    """A tiling plan cannot be applied: counts not dividing ranges, non-contiguous groups."""


class WorkDivisionError(FspyreError):
    """No legal division of an op's work across cores exists under the given constraints."""


class AllocationError(FspyreError):
    """Memory planning failed: capacity, alignment or overlapping live buffers."""


class MachineError(FspyreError):
    """A machine configuration is invalid (cores outside 1..32, bad LX capacity)."""


class ExecutionError(FspyreError):
    """The machine-model interpreter met an illegal access: out of bounds, unallocated, unwritten.

    Besides the message, an error about one access carries where it happened, for reports
    that sort or count findings (``memcheck.execution_issue``): the op, the tensor, the core,
    the memory (``"hbm"`` / ``"lx"``) and the byte address; unknown fields stay empty / -1."""

    def __init__(self, message: str, *, op: str = "", tensor: str = "", core: int = -1,
                 memory: Memory | Literal[""] = "", address: int = -1) -> None:
        super().__init__(message)
        self.op, self.tensor, self.core, self.memory, self.address = op, tensor, core, memory, address

    def __reduce__(self):
        fields = dict(op=self.op, tensor=self.tensor, core=self.core, memory=self.memory, address=self.address)
        return (_execution_error, (str(self), fields))


def _execution_error(message: str, fields: dict) -> ExecutionError:
    return ExecutionError(message, **fields)


class LoweringError(FspyreError):
    """A program cannot be emitted as bundle.mlir / SDSC JSON."""


class FrontendError(FspyreError):
    """PyTorch code could not be captured: unsupported op, dtype or shape."""


class SerializationError(FspyreError):
    """A JSON document does not describe a valid fspyre artifact."""


class BatchError(FspyreError):
    """A batch of checks (the campaign, the model zoo) cannot run as asked: a bad ``--shard``, Ray
    not installed, a cluster that cannot be reached, shard outputs that do not cover their range."""


class FspyreWarning(UserWarning):
    """A hint that has no effect as written: redundant (a count of 1), or naming a dim no op in
    its scope iterates, or a work division that does not fit the core budget. Compilation goes
    on without it; the message says what to change (docs/tiling.md, "Hint warnings")."""
