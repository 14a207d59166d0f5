"""The closed sets of names that fspyre's artifacts and options choose from.

Each is a ``Literal`` type rather than an ``Enum``: mypy checks every use, the artifacts keep
printing and serializing the plain names Spyre engineers know (``"hbm"``, ``"lx"``), and the
JSON loader already refuses any other value with the path of the field. The tuple beside
each type is its names, for the run-time checks at construction and for messages.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, get_args

# Where a buffer lives: device memory, or a core's LX scratchpad.
Memory = Literal["hbm", "lx"]
MEMORIES: tuple[Memory, ...] = get_args(Memory)

# A loop-tree buffer: the graph's whole tensor, or one tile of it (allocated per iteration).
Scope = Literal["full", "tile"]
SCOPES: tuple[Scope, ...] = get_args(Scope)

# Which iterations of its innermost enclosing loop an op runs in: all of them, or only the
# first (a copy or fill the loop then reads) or the last (a finish of what the loop built).
Runs = Literal["every", "first", "last"]
RUNS: tuple[Runs, ...] = get_args(Runs)


def misplaced_guard(runs: Sequence[Runs | None]) -> tuple[int, str] | None:
    """A loop body's rule for ops of one iteration (``runs`` per body item, None for a nested
    loop): first-iteration ops at the head, last-iteration ops at the tail. The index of the
    first op out of place and where it belongs ("head" or "tail"), or None."""
    rank = [{"first": 0, "last": 2}.get(r or "every", 1) for r in runs]
    for k in range(1, len(rank)):
        if rank[k] < rank[k - 1]:
            return (k, "head") if runs[k] == "first" else (k - 1, "tail")
    return None

# The dtype an op computes in (``fspyre.machine.numerics.compute_dtype``).
ComputeDtype = Literal["float32", "int32"]
COMPUTE_DTYPES: tuple[ComputeDtype, ...] = get_args(ComputeDtype)

# How ``plan_tiling`` makes loops: none, or from the graph's hint scopes.
TilingMode = Literal["none", "hints"]
TILING_MODES: tuple[TilingMode, ...] = get_args(TilingMode)

# What ``compile`` tiles with: ``plan_tiling``'s modes, or the search (docs/tiling.md).
Tiling = Literal["none", "hints", "auto"]
TILINGS: tuple[Tiling, ...] = get_args(Tiling)

# Which producers the tiling search fuses into a consumer's loop (``SearchOptions``).
FuseMode = Literal["max-producers", "max-size", "only-patterns", "no-fuse"]
FUSE_MODES: tuple[FuseMode, ...] = get_args(FuseMode)

# A tiling candidate the search judged by compiling it (``Candidate``).
Verdict = Literal["fits", "spills", "refused"]
VERDICTS: tuple[Verdict, ...] = get_args(Verdict)

# The LX placement algorithm (``AllocationOptions.lx_solver``).
LxSolver = Literal["greedy", "firstfit", "bestfit"]
LX_SOLVERS: tuple[LxSolver, ...] = get_args(LxSolver)

# The interpreter's checking level: "fast" keeps no written bits (``fspyre.run``).
Checks = Literal["full", "fast"]
CHECKS: tuple[Checks, ...] = get_args(Checks)

# How the device stores float16 (``Machine.fp16_format``).
Fp16Format = Literal["SEN169_FP16", "IEEE_FP16"]
FP16_FORMATS: tuple[Fp16Format, ...] = get_args(Fp16Format)

# A device element format (``fspyre.machine.formats.FORMATS`` describes each): a tensor's
# ``device_dtype``.
DeviceFormat = Literal["SEN169_FP16", "IEEE_FP16", "BF16", "IEEE_FP32", "IEEE_INT32", "SENINT8", "SEN143_FP8"]
DEVICE_FORMATS: tuple[DeviceFormat, ...] = get_args(DeviceFormat)
