"""The LoopSpec program: what fspyre hands to the Spyre back end.

It mirrors the anchor's codegen records so Spyre engineers recognise it (``LoopSpec``,
``OpSpec``, ``TensorArg``), but immutable, and with each tensor's per-level address advance
written down in bytes (``tile_advance``) instead of being re-derived by each consumer: the
bundle emitter and the interpreter read the same numbers, so a wrong stride is a numeric
mismatch, not a silent disagreement.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Union

import sympy

from fspyre.errors import LoweringError
from fspyre.ir.frozen import FrozenMap, require_int, require_map, require_tuple
from fspyre.ir.kinds import (
    COMPUTE_DTYPES,
    DEVICE_FORMATS,
    MEMORIES,
    RUNS,
    ComputeDtype,
    DeviceFormat,
    Memory,
    Runs,
    misplaced_guard,
)
from fspyre.ir.symbolic import SymbolicSizes, is_symbolic, require_size, require_sizes

# The anchor's program op for a graph fn it names differently; every other op is named by its fn.
PROGRAM_OP_NAMES = FrozenMap({"matmul": "batchmatmul"})
_FN_OF_OP = FrozenMap({op: fn for fn, op in PROGRAM_OP_NAMES.items()})


def program_op(fn: str) -> str:
    """The ``OpSpec.op`` the device runs for graph fn ``fn``."""
    return PROGRAM_OP_NAMES.get(fn, fn)


def op_fn(op: str) -> str:
    """The graph fn an ``OpSpec.op`` computes (the inverse of ``program_op``)."""
    return _FN_OF_OP.get(op, op)


@dataclass(frozen=True, slots=True, kw_only=True)
class TensorArg:
    """One tensor operand of an OpSpec.

    ``device_coordinates`` map the op's iteration symbols to one coordinate per device dim of
    ``device_size``; the tensor lives at byte ``address`` of ``memory`` (the anchor writes the
    pair as its ``allocation`` map, ``{"hbm": addr}``); ``tile_advance[L]`` is the byte step
    per iteration of enclosing loop L (outermost first), 0 where the tensor does not advance;
    in LX (where each core lays out its own box) it steps from one slot of the allocation to
    the next (a region kept across sibling loops).
    ``arg_index`` is the kernel argument, -1 for intermediates. In a symbolic program
    (``Program.symbolic``) sizes, addresses and advances may be expressions in the symbolic
    sizes.
    """

    name: str
    is_input: bool
    arg_index: int
    device_dtype: DeviceFormat
    device_size: tuple[int | sympy.Expr, ...]
    device_coordinates: tuple[sympy.Expr, ...]
    memory: Memory
    address: int | sympy.Expr
    tile_advance: tuple[int | sympy.Expr, ...] = ()

    def __post_init__(self) -> None:
        what = f"tensor {self.name}"
        require_sizes(self.device_size, f"{what}: device_size", LoweringError, -(1 << 62), non_empty=True)
        if any(isinstance(n, bool) or isinstance(n, int) and n < 1 for n in self.device_size):
            raise LoweringError(f"{what}: device_size {list(self.device_size)} must be positive")
        require_tuple(self.device_coordinates, f"{what}: device_coordinates", LoweringError, (sympy.Basic, int))
        require_sizes(self.tile_advance, f"{what}: tile_advance", LoweringError, -(1 << 62))
        require_int(self.arg_index, f"{what}: arg_index", LoweringError, -1)
        if self.memory not in MEMORIES:
            raise LoweringError(f"{what}: memory {self.memory!r} must be one of {list(MEMORIES)}")
        if self.device_dtype not in DEVICE_FORMATS:
            raise LoweringError(f"{what}: device_dtype {self.device_dtype!r:.40} must be one of {list(DEVICE_FORMATS)}")
        require_size(self.address, f"{what}: address", LoweringError, 0)
        if len(self.device_coordinates) != len(self.device_size):
            raise LoweringError(
                f"tensor {self.name}: {len(self.device_coordinates)} coordinates "
                f"for device rank {len(self.device_size)}"
            )
        if self.memory == "lx" and any(a < 0 for a in self.tile_advance):
            # an LX tensor advances only through the slots its allocation laid out, upwards
            raise LoweringError(f"tensor {self.name}: LX tile_advance {list(self.tile_advance)} must not be negative")


@dataclass(frozen=True, slots=True, kw_only=True)
class ArgOperand:
    """An operand the op reads from its input tensor ``args[index]``."""

    index: int

    def __post_init__(self) -> None:
        require_int(self.index, "arg operand: index", LoweringError, 0)


@dataclass(frozen=True, slots=True, kw_only=True)
class ScalarOperand:
    """A constant operand, in the Python type the graph gave it (a float promotes the compute)."""

    value: bool | int | float

    def __post_init__(self) -> None:
        if not isinstance(self.value, (bool, int, float)):
            raise LoweringError(f"scalar operand {self.value!r:.60} must be a bool, int or float")


Operand = Union[ArgOperand, ScalarOperand]


@dataclass(frozen=True, slots=True, kw_only=True)
class OpInfo:
    """What the device computes for an op beyond its name (``OpSpec.op``, which says the fn).

    ``operands`` in the fn's order, each an input arg or a scalar; ``compute`` the dtype the
    fn computes in; ``bool_store``: the output is bool, stored as ``value != 0``
    (docs/semantics.md; its bytes alone cannot say so). A reduction's ``reduced`` symbols
    (its reduction ranges of size > 1), ``count`` of elements each output reduces (``mean``
    and ``var`` divide by it) and ``var``'s ``correction``; a pointwise op keeps the
    defaults. A batchmatmul's operand roles: ``rows``, the output symbols only its first
    operand carries (the [.., M, K] one), and ``cols``, those only its second carries (the
    [.., K, N] one), each in iteration-space order; the emitter writes its operands in that
    order, and the other output symbols are batch dims (carried by both, or broadcast).
    The anchor's dict form of all this is written by the SDSC lowering
    (``fspyre.lower.sdsc.anchor_op_info``)."""

    operands: tuple[Operand, ...]
    compute: ComputeDtype
    bool_store: bool = False
    reduced: tuple[sympy.Symbol, ...] = ()
    count: int | sympy.Expr = 1
    correction: int = 0
    rows: tuple[sympy.Symbol, ...] = ()
    cols: tuple[sympy.Symbol, ...] = ()

    def __post_init__(self) -> None:
        require_tuple(self.operands, "op info: operands", LoweringError, (ArgOperand, ScalarOperand))
        if self.compute not in COMPUTE_DTYPES:
            raise LoweringError(f"op info: compute {self.compute!r} must be one of {list(COMPUTE_DTYPES)}")
        if not isinstance(self.bool_store, bool):
            raise LoweringError(f"op info: bool_store {self.bool_store!r:.60} must be True or False")
        require_tuple(self.reduced, "op info: reduced", LoweringError, sympy.Symbol)
        require_size(self.count, "op info: count", LoweringError, 1)  # |S| when it reduces a symbolic dim
        if type(self.correction) is not int:
            raise LoweringError(f"op info: correction {self.correction!r:.60} must be an integer")
        require_tuple(self.rows, "op info: rows", LoweringError, sympy.Symbol)
        require_tuple(self.cols, "op info: cols", LoweringError, sympy.Symbol)
        if set(self.rows) & set(self.cols) or len(set(self.rows)) != len(self.rows) or len(set(self.cols)) != len(
                self.cols):
            raise LoweringError(f"op info: rows {[str(s) for s in self.rows]} and cols {[str(s) for s in self.cols]} "
                                f"must be distinct symbols, none in both")

    @property
    def args(self) -> tuple[int, ...]:
        """The input args the operands read, in operand order."""
        return tuple(o.index for o in self.operands if isinstance(o, ArgOperand))


@dataclass(frozen=True, slots=True, kw_only=True)
class OpSpec:
    """One op on the device. ``iteration_space`` maps each symbol to ``(size, split)`` in order
    (output symbols first, then reduction symbols), ``split`` being the number of slices of
    the symbol's range; ``core_spaces[c]`` is core ``c``'s own iteration space, one
    ``(start, extent)`` per symbol: the slices of each symbol partition its range in order
    (ceil and floor shares when the split does not divide it), and the cores enumerate the
    slices first symbol fastest (``fspyre.machine.rules.core_spaces``, which ``emit_program``
    writes them with; ``even_core_spaces`` gives the even division of an iteration space).
    ``tiled_symbols[L]`` lists the symbols that enclosing loop L (outermost first) tiles.
    The last arg is the output. ``runs`` is ``"first"`` or ``"last"`` for an op that runs only
    in that iteration of its innermost loop (the loop tree's ``OpNode.runs``): the bundle
    guards it with an ``scf.if`` on the induction variable; no tensor of it advances there."""

    op: str
    is_reduction: bool
    iteration_space: FrozenMap[sympy.Symbol, tuple[int | sympy.Expr, int]]
    args: tuple[TensorArg, ...]
    op_info: OpInfo
    core_spaces: tuple[tuple[tuple[int | sympy.Expr, int | sympy.Expr], ...], ...]
    tiled_symbols: tuple[tuple[sympy.Symbol, ...], ...] = ()
    name: str = ""
    runs: Runs = "every"

    def __post_init__(self) -> None:
        what = f"op {self.name or self.op}"
        if self.runs not in RUNS:
            raise LoweringError(f"{what}: runs {self.runs!r:.40} must be one of {list(RUNS)}")
        require_map(self.iteration_space, f"{what}: iteration_space", LoweringError)
        if not isinstance(self.op_info, OpInfo):
            raise LoweringError(f"{what}: op_info must be an OpInfo, got a {type(self.op_info).__name__} "
                                f"{self.op_info!r:.60}")
        require_tuple(self.args, f"{what}: args", LoweringError, TensorArg, non_empty=True)
        require_tuple(self.tiled_symbols, f"{what}: tiled_symbols", LoweringError, tuple)
        require_tuple(self.core_spaces, f"{what}: core_spaces", LoweringError, tuple)
        if self.symbolic:  # a symbolic program's op: its division is checked on the op ``instantiate`` builds
            return
        for s, (size, split) in self.iteration_space.items():
            if size < 1 or split < 1 or split > size:
                raise LoweringError(f"{what}: symbol {s} of size {size} cannot be split into {split} slices")
        try:
            extents = _division_extents(self._space, self.core_spaces)
        except TypeError:  # an unhashable item: not a tuple of (start, extent) pairs
            extents = None
        if extents is None:
            raise LoweringError(
                f"{what}: core_spaces {self.core_spaces!r:.80} do not divide the iteration space "
                f"{ {str(s): v for s, v in self.iteration_space.items()} }: each symbol's slices must partition "
                f"its range in order, the cores taking them first symbol fastest "
                f"(fspyre.machine.rules.core_spaces; even_core_spaces for the even division)"
            )

    @property
    def _space(self) -> tuple[tuple[int, int], ...]:
        return tuple((n, k) for n, k in self.iteration_space.values())

    @property
    def symbolic(self) -> bool:
        """Some size is an expression in a symbolic size (a fixed size has fixed slices)."""
        return not all(type(n) is int for n, _ in self.iteration_space.values()) and any(
            is_symbolic(n) for n, _ in self.iteration_space.values())

    @property
    def slice_extents(self) -> tuple[tuple[int, ...], ...]:
        """Per symbol, the extents of its slices in order: read off ``core_spaces`` (cached,
        outside the record; the constructor checked they divide the iteration space)."""
        if self.symbolic:
            return _symbolic_extents(self._space, self.core_spaces)
        extents = _division_extents(self._space, self.core_spaces)
        assert extents is not None
        return extents

    @property
    def cores(self) -> int:
        n = 1
        for _, split in self.iteration_space.values():
            n *= split
        return n

    @property
    def even(self) -> bool:
        """Every symbol's slices are of one size."""
        return all(len(set(e)) == 1 for e in self.slice_extents)


@dataclass(frozen=True, slots=True, kw_only=True)
class LoopSpec:
    """``count`` iterations of ``body``. ``tiled_symbols``: the symbols of the dims the loop
    tiles (the loop tree's ``Loop.dims``), recorded by the emitter whether or not an op
    iterates them: a dim tiled to one element per tile leaves its ops' iteration spaces but
    still moves their tensors. Each op lists at this level the ones it iterates
    (``OpSpec.tiled_symbols``); ``verify_program`` holds the ops to this record."""

    count: int | sympy.Expr  # an expression in the symbolic sizes in a symbolic program
    body: tuple[Union["LoopSpec", OpSpec], ...]
    tiled_symbols: tuple[sympy.Symbol, ...] = ()

    def __post_init__(self) -> None:
        require_size(self.count, "loop count", LoweringError, 1)
        require_tuple(self.tiled_symbols, f"loop of count {self.count}: tiled_symbols", LoweringError, sympy.Symbol)
        if len(set(self.tiled_symbols)) != len(self.tiled_symbols):
            raise LoweringError(f"loop of count {self.count}: tiled_symbols "
                                f"{[str(s) for s in self.tiled_symbols]} repeat a symbol")
        require_tuple(self.body, f"loop of count {self.count}: body", LoweringError, (LoopSpec, OpSpec), non_empty=True)
        misplaced = misplaced_guard([s.runs if isinstance(s, OpSpec) else None for s in self.body])
        if misplaced is not None:
            k, where = misplaced
            odd = self.body[k]
            assert isinstance(odd, OpSpec)
            raise LoweringError(
                f"loop of count {self.count}: op {odd.name or odd.op} runs in the {odd.runs} iteration only but "
                f"is not at the {where} of the body; first-iteration ops come before every other spec, "
                f"last-iteration ops after")


Spec = Union[LoopSpec, OpSpec]


def even_core_spaces(iteration_space: FrozenMap[sympy.Symbol, tuple[int, int]]) -> tuple:
    """The ``core_spaces`` that divide ``iteration_space`` evenly (every split divides its size)."""
    from fspyre.machine.rules import core_spaces, even_extents  # the machine model imports this module

    uneven = [(str(s), n, k) for s, (n, k) in iteration_space.items() if n % k]
    if uneven:
        s, n, k = uneven[0]
        raise LoweringError(f"symbol {s} size {n} is not divisible by split {k}; an uneven division needs "
                            f"core_spaces from fspyre.machine.rules.core_spaces")
    return core_spaces([even_extents(n, k) for n, k in iteration_space.values()])


def _symbolic_extents(space: tuple, spaces: tuple) -> tuple[tuple, ...]:
    """Each symbol's slice extents read off ``spaces`` (first symbol fastest), unchecked: the
    division of a symbolic op is checked on the concrete op ``instantiate`` builds."""
    out, stride = [], 1
    for i, (_, split) in enumerate(space):
        out.append(tuple(spaces[k * stride][i][1] for k in range(split) if k * stride < len(spaces)))
        stride *= split
    return tuple(out)


# Cached: the ops of a chain, and every candidate of a tiling search, repeat their divisions.
@lru_cache(maxsize=4096)
def _division_extents(space: tuple[tuple[int, int], ...], spaces: tuple) -> tuple[tuple[int, ...], ...] | None:
    """Each symbol's slice extents, read off the cores holding slice ``k`` of it and slice 0 of
    every other; None unless ``spaces`` is exactly the division of ``space`` they give."""
    from fspyre.machine.rules import core_spaces

    out, stride = [], 1
    for i, (size, split) in enumerate(space):
        row = []
        for k in range(split):
            c = k * stride
            if c >= len(spaces) or not isinstance(spaces[c], tuple) or len(spaces[c]) != len(space):
                return None
            pair = spaces[c][i]
            if not isinstance(pair, tuple) or len(pair) != 2 or type(pair[1]) is not int or pair[1] < 1:
                return None
            row.append(pair[1])
        if sum(row) != size:
            return None
        out.append(tuple(row))
        stride *= split
    extents = tuple(out)
    return extents if len(spaces) == stride and core_spaces(extents) == spaces else None


@dataclass(frozen=True, slots=True, kw_only=True)
class KernelArg:
    """A graph input or output as the runtime hands it to the kernel: host shape and dtype,
    and its device stick layout at ``address`` in HBM."""

    name: str
    arg_index: int
    is_input: bool
    dtype: str
    host_shape: tuple[int | sympy.Expr, ...]
    device_dtype: DeviceFormat
    device_size: tuple[int | sympy.Expr, ...]
    stride_map: tuple[int | sympy.Expr, ...]
    address: int | sympy.Expr
    buffer: str

    def __post_init__(self) -> None:
        what = f"kernel argument {self.name}"
        if self.device_dtype not in DEVICE_FORMATS:
            raise LoweringError(f"{what}: device_dtype {self.device_dtype!r:.40} must be one of {list(DEVICE_FORMATS)}")
        require_int(self.arg_index, f"{what}: arg_index", LoweringError, 0)
        require_size(self.address, f"{what}: address", LoweringError, 0)
        require_sizes(self.host_shape, f"{what}: host_shape", LoweringError, 0)
        require_sizes(self.device_size, f"{what}: device_size", LoweringError, -(1 << 62), non_empty=True)
        require_sizes(self.stride_map, f"{what}: stride_map", LoweringError, -(1 << 62))
        if any(isinstance(n, bool) or isinstance(n, int) and n < 1 for n in self.device_size):
            raise LoweringError(f"{what}: device_size {list(self.device_size)} must be positive")


@dataclass(frozen=True, slots=True, kw_only=True)
class Program:
    """``symbolic`` is set on a program compiled for symbolic dims: its counts, sizes,
    addresses and advances are expressions in the dims' sizes, and it records every
    assumption those expressions rely on (``fspyre.stages.symbolic.instantiate`` binds it)."""

    name: str
    body: tuple[Spec, ...]
    kernel_args: tuple[KernelArg, ...]
    hbm_bytes: int | sympy.Expr
    cores: int
    lx_bytes: int | sympy.Expr
    symbolic: SymbolicSizes | None = None

    def _repr_html_(self) -> str:
        """A notebook shows the compact program text."""
        from fspyre.pretty import html_text, pretty

        return html_text(pretty(self))

    def __repr__(self) -> str:  # short: the whole program prints with fspyre.pretty
        specs = [s for s, _ in walk_specs(self.body)]
        loops = sum(isinstance(s, LoopSpec) for s in specs)
        return (f"Program({self.name!r}: {len(specs) - loops} ops, {loops} loops, {self.cores} cores, "
                f"HBM {self.hbm_bytes} B, LX {self.lx_bytes} B per core)")

    def __post_init__(self) -> None:
        what = f"program {self.name}"
        require_tuple(self.body, f"{what}: body", LoweringError, (LoopSpec, OpSpec))
        require_tuple(self.kernel_args, f"{what}: kernel_args", LoweringError, KernelArg)
        require_int(self.cores, f"{what}: cores", LoweringError, 1)
        require_size(self.hbm_bytes, f"{what}: hbm_bytes", LoweringError, 0)
        require_size(self.lx_bytes, f"{what}: lx_bytes", LoweringError, 0)
        if self.symbolic is not None and not isinstance(self.symbolic, SymbolicSizes):
            raise LoweringError(
                f"{what}: symbolic must be a SymbolicSizes record, got a {type(self.symbolic).__name__}")


def walk_specs(body: tuple[Spec, ...], depth: int = 0):
    """Yield ``(spec, depth)`` in program order, loops before their bodies."""
    for spec in body:
        yield spec, depth
        if isinstance(spec, LoopSpec):
            yield from walk_specs(spec.body, depth + 1)


def op_specs(program: Program) -> list[OpSpec]:
    return [s for s, _ in walk_specs(program.body) if isinstance(s, OpSpec)]
