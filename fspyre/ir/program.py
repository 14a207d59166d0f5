"""The LoopSpec program: what fspyre hands to the Spyre back end.

It mirrors the anchor's codegen records so Spyre engineers recognise it (``LoopSpec``,
``OpSpec``, ``TensorArg``), but immutable, and with each tensor's per-level address advance
written down in bytes (``tile_advance``) instead of being re-derived by each consumer: the
bundle emitter and the interpreter read the same numbers, so a wrong stride is a numeric
mismatch, not a silent disagreement.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

import sympy

from fspyre.errors import LoweringError
from fspyre.ir.frozen import FrozenMap


@dataclass(frozen=True, slots=True, kw_only=True)
class TensorArg:
    """One tensor operand of an OpSpec.

    ``device_coordinates`` map the op's iteration symbols to one coordinate per device dim of
    ``device_size``; ``allocation`` is exactly one of ``{"hbm": addr}`` / ``{"lx": addr}``;
    ``tile_advance[L]`` is the byte step per iteration of enclosing loop L (outermost first),
    0 where the tensor does not advance. ``arg_index`` is the kernel argument, -1 for
    intermediates.
    """

    name: str
    is_input: bool
    arg_index: int
    device_dtype: str
    device_size: tuple[int, ...]
    device_coordinates: tuple[sympy.Expr, ...]
    allocation: FrozenMap[str, int]
    tile_advance: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if len(self.allocation) != 1 or next(iter(self.allocation)) not in ("hbm", "lx"):
            raise LoweringError(f"tensor {self.name}: allocation {dict(self.allocation)} must be one of hbm / lx")
        if len(self.device_coordinates) != len(self.device_size):
            raise LoweringError(
                f"tensor {self.name}: {len(self.device_coordinates)} coordinates "
                f"for device rank {len(self.device_size)}"
            )
        if self.memory == "lx" and any(self.tile_advance):
            raise LoweringError(f"tensor {self.name}: an LX tensor cannot advance across loop iterations")

    @property
    def memory(self) -> str:
        return next(iter(self.allocation))

    @property
    def address(self) -> int:
        return next(iter(self.allocation.values()))


@dataclass(frozen=True, slots=True, kw_only=True)
class OpSpec:
    """One op on the device. ``iteration_space`` maps each symbol to ``(size, split)`` in order
    (output symbols first, then reduction symbols); ``tiled_symbols[L]`` lists the symbols that
    enclosing loop L (outermost first) tiles. The last arg is the output."""

    op: str
    is_reduction: bool
    iteration_space: FrozenMap[sympy.Symbol, tuple[int, int]]
    args: tuple[TensorArg, ...]
    op_info: FrozenMap[str, object]
    tiled_symbols: tuple[tuple[sympy.Symbol, ...], ...] = ()
    name: str = ""

    def __post_init__(self) -> None:
        for s, (size, split) in self.iteration_space.items():
            if size < 1 or split < 1 or size % split:
                raise LoweringError(
                    f"op {self.name or self.op}: symbol {s} size {size} is not divisible by split {split}"
                )

    @property
    def cores(self) -> int:
        n = 1
        for _, split in self.iteration_space.values():
            n *= split
        return n


@dataclass(frozen=True, slots=True, kw_only=True)
class LoopSpec:
    count: int
    body: tuple[Union["LoopSpec", OpSpec], ...]


Spec = Union[LoopSpec, OpSpec]


@dataclass(frozen=True, slots=True, kw_only=True)
class KernelArg:
    """A graph input or output as the runtime hands it to the kernel: host shape and dtype,
    and its device stick layout at ``address`` in HBM."""

    name: str
    arg_index: int
    is_input: bool
    dtype: str
    host_shape: tuple[int, ...]
    device_dtype: str
    device_size: tuple[int, ...]
    stride_map: tuple[int, ...]
    address: int
    buffer: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Program:
    name: str
    body: tuple[Spec, ...]
    kernel_args: tuple[KernelArg, ...]
    hbm_bytes: int
    cores: int
    lx_bytes: int


def walk_specs(body: tuple[Spec, ...], depth: int = 0):
    """Yield ``(spec, depth)`` in program order, loops before their bodies."""
    for spec in body:
        yield spec, depth
        if isinstance(spec, LoopSpec):
            yield from walk_specs(spec.body, depth + 1)


def op_specs(program: Program) -> list[OpSpec]:
    return [s for s, _ in walk_specs(program.body) if isinstance(s, OpSpec)]
