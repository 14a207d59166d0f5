"""Stage ``emit_program``: LoopTree + SplitPlan + Allocation -> Program (LoopSpec/OpSpec).

Device coordinates come from each buffer's stick layout, as recorded by ``divide_work`` in
the split plan's access record (``fspyre.stages.access``); a full-size buffer read or written
inside loops gets, per enclosing loop, the byte step its address takes per iteration. The
step is derived from the layout (not from host row-major strides) and checked to be the
same for every iteration: a tile that does not start on a stick boundary is refused here."""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import sympy

from fspyre.errors import AllocationError, LoweringError, TilingError
from fspyre.ir.frozen import FrozenMap
from fspyre.ir.graph import FLOAT_RESULT_FNS, POINTWISE_FNS, REDUCTION_FNS, Load, Reduction, Scalar, iteration_dims, sym
from fspyre.ir.kinds import ComputeDtype
from fspyre.ir.looptree import Loop, LoopTree, Node, OpNode, TileStep
from fspyre.ir.plans import Allocation, SplitPlan
from fspyre.ir.program import (
    ArgOperand,
    KernelArg,
    LoopSpec,
    Operand,
    OpInfo,
    OpSpec,
    Program,
    ScalarOperand,
    Spec,
    TensorArg,
    op_fn,
    op_specs,
    program_op,
    walk_specs,
)
from fspyre.ir.symbolic import size_symbol
from fspyre.machine import formats, numerics
from fspyre.machine.indexing import compile_index, free_names
from fspyre.machine.layout import StickLayout, device_coordinates
from fspyre.machine.rules import (
    box_bytes,
    coord_bounds,
    core_spaces,
    device_bytes,
    lx_box,
    moved_within,
    row_major_strides,
)
from fspyre.machine.spyre import Machine
from fspyre.stages.access import Access, AccessPlan, access_plan
from fspyre.stages.allocation import verify_allocation
from fspyre.stages.arguments import require, require_tree, verified
from fspyre.stages.split_plan import verify_split_plan


def tile_advance(
    name: str, op: str, layout: StickLayout, coords: Sequence[sympy.Expr], syms: Sequence[sympy.Symbol],
    tiling: Sequence[Sequence[TileStep]], counts: Sequence[int], full: Mapping[str, int],
) -> tuple[int, ...]:
    """Byte step per iteration of each enclosing loop (outermost first), or a TilingError when
    the address does not advance by one fixed step (the tile is not stick aligned).

    ``coords`` are the tensor's device coordinates over the op's full ranges, in ``syms``, which
    include a tiled dim whose per-tile size is 1 (it is absent from the op's iteration space but
    still moves the address)."""
    names = [s.name for s in syms]
    spans = tuple((s.dim, full[s.dim]) for level in tiling for s in level if s.dim in names)
    levels = tuple(tuple(level) for level, _ in zip(tiling, counts))
    steps = _advances(layout, tuple(coords), tuple(syms), levels, spans)
    if isinstance(steps, _Unaligned):
        level, s, dim_range = steps
        eps = layout.elems_per_stick
        works = [c for c in range(2, dim_range + 1) if dim_range % c == 0 and (dim_range // c) % eps == 0]
        raise TilingError(
            f"op {op}: tensor {name} cannot advance by one fixed address step per iteration of loop level "
            f"{level} (count {counts[level]}): dim {s.dim} (range {dim_range}) moves {s.extent} elements per "
            f"iteration, which is not a whole number of {eps}-element sticks of {name} (device layout "
            f"{list(layout.device_size)}, {layout.elem_bytes}-byte elements). Make the tile of {s.dim} a "
            f"multiple of {eps} elements (counts that do for one level: {works[:8] or 'none'}), or tile "
            f"another dim."
        )
    return steps


class _Unaligned(NamedTuple):
    """Where a tensor's address does not advance by one fixed step: the loop level, its step
    and the dim's full range."""

    level: int
    step: TileStep
    dim_range: int


# Cached: a tiling search's candidates and keep_resident's trials emit the same tensors under
# the same loops over and over (476 advances, 121 distinct, on the S=2048 transformer block:
# 10 % of its auto compile), and each evaluates the coordinates over a dim's whole range. A
# pure function of immutable arguments; bounded.
@functools.lru_cache(maxsize=4096)
def _advances(layout: StickLayout, coords: tuple[sympy.Expr, ...], syms: tuple[sympy.Symbol, ...],
              tiling: tuple[tuple[TileStep, ...], ...],
              spans: tuple[tuple[str, int], ...]) -> tuple[int, ...] | _Unaligned:
    full = dict(spans)
    strides = np.array(row_major_strides(layout.device_size), dtype=np.int64)
    fns = [compile_index(c, syms) for c in coords]
    names = [s.name for s in syms]
    out = []
    for level, steps in enumerate(tiling):
        moved = [s for s in steps if s.dim in names]
        if not moved:
            out.append(0)
            continue
        # Every point of the dim's full range, shifted by one tile: the offset difference must
        # be the same constant everywhere, and equal to the first tile's step.
        deltas = []
        for s in moved:
            pos = names.index(s.dim)
            span = full[s.dim] - s.extent
            v = np.arange(max(span, 0), dtype=np.int64)
            args0 = [v if i == pos else 0 for i in range(len(syms))]
            args1 = [v + s.extent if i == pos else 0 for i in range(len(syms))]
            off0 = sum(np.asarray(f(*args0)) * st for f, st in zip(fns, strides))
            off1 = sum(np.asarray(f(*args1)) * st for f, st in zip(fns, strides))
            d = np.unique(np.asarray(off1 - off0).ravel())
            if len(d) > 1:
                return _Unaligned(level, s, full[s.dim])
            deltas.append(int(d[0]) if len(d) else 0)
        out.append(sum(deltas) * layout.elem_bytes)
    return tuple(out)


def emit_program(tree: LoopTree, splits: SplitPlan, allocation: Allocation, machine: Machine) -> Program:
    require(tree, LoopTree, "emit_program", "tree")
    require(splits, SplitPlan, "emit_program", "splits")
    require(allocation, Allocation, "emit_program", "allocation")
    require(machine, Machine, "emit_program", "machine")
    require_tree(tree, "emit_program", machine)
    # the split plan and allocation are side tables keyed by name: refuse ones made for another tree
    verified(verify_split_plan, tree, splits, machine)
    verified(verify_allocation, tree, splits, allocation, machine)
    program = emit_made_for(tree, splits, allocation, machine)
    # verify_allocation does not compare lifetimes: an allocation handed in alone (loaded,
    # edited) could place two live buffers on the same bytes, which only the memory check sees
    from fspyre.machine.memcheck import check_memory

    issues = check_memory(program).issues
    if issues:
        raise AllocationError(f"emit_program: the allocation fails the memory check: {_one_line(issues[0].message)}"
                              f"{f' (and {len(issues) - 1} more issues)' if len(issues) > 1 else ''}; "
                              f"allocate(tree, splits, machine) makes one that passes")
    return program


def _one_line(text: str) -> str:
    return " ".join(text.split())


def emit_made_for(tree: LoopTree, splits: SplitPlan, allocation: Allocation, machine: Machine) -> Program:
    """``emit_program`` for a split plan and allocation that ``divide_work`` and ``allocate``
    have just made from this very tree and machine (keep_resident's candidates), which the
    verifiers would only confirm; the stage verifies the candidate it hands on."""
    table = tree.buffer_table()
    analysis = access_plan(tree, splits, machine)
    layouts = analysis.layouts

    def emit(body: tuple[Node, ...], counts: tuple[int, ...]) -> tuple[Spec, ...]:
        out: list[Spec] = []
        for node in body:
            if isinstance(node, Loop):
                out.append(LoopSpec(count=node.count, body=emit(node.body, counts + (node.count,)),
                                    tiled_symbols=tuple(sym(d) for d in node.dims)))
            else:
                out.append(_op_spec(node, counts, table, analysis, splits, allocation, machine))
        return tuple(out)

    kernel_args = []
    for name in tree.inputs:
        kernel_args.append(_kernel_arg(name, name, True, table, layouts, allocation, machine))
    for o in tree.outputs:
        kernel_args.append(_kernel_arg(o.name, o.buffer, False, table, layouts, allocation, machine))
    return Program(
        name=tree.name,
        body=emit(tree.body, ()),
        kernel_args=tuple(kernel_args),
        hbm_bytes=allocation.hbm_bytes,
        cores=machine.cores,
        lx_bytes=machine.lx_bytes,
    )


def _kernel_arg(name, buffer, is_input, table, layouts, allocation, machine) -> KernelArg:
    b, lay, place = table[buffer], layouts[buffer], allocation.buffers[buffer]
    return KernelArg(
        name=name, arg_index=place.arg_index, is_input=is_input, dtype=b.type.dtype, host_shape=b.type.shape,
        device_dtype=machine.device_format(b.type.dtype), device_size=lay.device_size,
        stride_map=lay.stride_map, address=place.address, buffer=buffer,
    )


def _op_spec(node: OpNode, counts, table, analysis: AccessPlan, splits: SplitPlan, allocation: Allocation,
             machine) -> OpSpec:
    op = node.op
    record = analysis.ops[op.name]
    layouts = analysis.layouts
    dims = record.dims
    syms = [d.symbol for d in dims]
    full = record.full
    op_split = splits.ops[op.name]
    split = op_split.splits

    # A dim tiled down to one element per tile leaves the iteration space but still moves the
    # address: the advance is computed with its symbol kept (the anchor's squeezed advance).
    moving = {s.dim for level in node.tiling for s in level}
    squeezed = [d for d in iteration_dims(op) if d.size == 1 and d.name in moving]
    fixed = {d.symbol: 0 for d in iteration_dims(op) if d.size == 1 and d.name not in moving}

    def arg(acc: Access, index: sympy.Expr, is_input: bool) -> TensorArg:
        buffer, coords = acc.buffer, acc.coords
        b, lay, place = table[buffer], layouts[buffer], allocation.buffers[buffer]
        advance = (0,) * len(counts)
        if place.memory == "lx":
            # an LX buffer advances only through its slots, as the allocator laid them out
            advance = place.advances.get(op.name, advance)
        elif b.scope == "full" and any(node.tiling):
            adv_syms = syms + [d.symbol for d in squeezed]
            adv_coords = coords
            if squeezed:
                ranges = {d.symbol: full[d.name] for d in dims} | {d.symbol: full[d.name] for d in squeezed}
                adv_coords = device_coordinates(lay, index.subs(fixed), ranges)
            advance = tile_advance(buffer, op.name, lay, adv_coords, adv_syms, node.tiling, counts, full)
        return TensorArg(
            name=buffer, is_input=is_input, arg_index=place.arg_index, device_dtype=machine.device_format(b.type.dtype),
            device_size=lay.device_size, device_coordinates=coords,
            memory=place.memory, address=place.address, tile_advance=advance,
        )

    args: list[TensorArg] = []
    operands: list[Operand] = []
    dtypes: list[str] = []
    for o in op.operands:
        if isinstance(o, Load):
            operands.append(ArgOperand(index=len(args)))
            args.append(arg(record.tensors[len(args)], o.index, True))
            dtypes.append(table[o.buffer].type.dtype)
        else:
            assert isinstance(o, Scalar)
            operands.append(ScalarOperand(value=o.value))
    out_dtype = table[op.store.buffer].type.dtype
    args.append(arg(record.tensors[len(args)], op.store.index, False))
    scalars = [o.value for o in op.operands if isinstance(o, Scalar)]
    compute: ComputeDtype = "float32" if numerics.compute_dtype(out_dtype, dtypes, scalars) == np.float32 else "int32"
    reduced: tuple[sympy.Symbol, ...] = ()
    count, correction = 1, 0  # a pointwise op: one element per output, no correction
    if isinstance(op, Reduction):
        reduced = tuple(d.symbol for d in op.reduction_ranges if d.size > 1)
        count = math.prod(d.size for d in op.reduction_ranges)
        correction = op.correction if op.fn == "var" else 0
    rows: tuple[sympy.Symbol, ...] = ()
    cols: tuple[sympy.Symbol, ...] = ()
    if op.fn == "matmul":  # the roles its operands take, in the graph's order: [.., M, K] then [.., K, N]
        a, b, c = ({n for x in t.device_coordinates for n in free_names(x)} for t in args)
        rows = tuple(s for s in syms if s.name in (a - b) & c)
        cols = tuple(s for s in syms if s.name in (b - a) & c)
    info = OpInfo(operands=tuple(operands), compute=compute, bool_store=out_dtype == "bool", reduced=reduced,
                  count=count, correction=correction, rows=rows, cols=cols)
    names = [s.name for s in syms]
    tiled = tuple(tuple(sym(s.dim) for s in level if s.dim in names) for level in node.tiling)
    return OpSpec(
        op=program_op(op.fn),
        is_reduction=isinstance(op, Reduction),
        iteration_space=FrozenMap((d.symbol, (d.size, split.get(d.name, 1))) for d in dims),
        args=tuple(args),
        op_info=info,
        tiled_symbols=tiled,
        name=op.name,
        core_spaces=core_spaces([op_split.extents(d.name, d.size) for d in dims]),
        runs=node.runs,
    )



# -- verification ----------------------------------------------------------------------------
def verify_program(program: Program) -> Program:
    """The program agrees with itself: kernel arguments numbered 0..n-1 and inside HBM; each op
    on at most the program's cores (its ``core_spaces`` partitioning its iteration space, which
    ``OpSpec`` checks when built, so a loaded or edited program cannot skip it), with one
    advance per enclosing loop and ``tiled_symbols`` for each loop (or none), its inputs before
    its one output, operands naming its inputs, coordinates over its iteration symbols; each
    tensor placed the same way by every op that uses it (memory, address, size, dtype,
    argument), a kernel argument exactly as the argument list places it (and in HBM); the
    fields the device reads that the program alone can prove: each op's ``tiled_symbols``
    those its loops record tiling (``LoopSpec.tiled_symbols``), a loop of one iteration
    tiling none, a batchmatmul's operands in the roles its op info records ([.., M, K], then
    [.., K, N]), ``compute`` against the formats, ``bool_store`` against the formats, a
    kernel output's dtype and the fn (``_bool_store_refusal``), each ``tile_advance`` the step
    the coordinates and the loop's tile give it (``_verify_advances``), and each guard
    (``runs``) such that no iteration's work is lost (``_verify_iterations``) (the
    interpreter reads ``reduced`` and ``count`` against the output's coordinates, and an
    int32 op's operands as integers). Which of an op's input args is which operand, like its
    fn, is what the program computes: nothing else records it but a batchmatmul's roles.
    Linear in the program; the meaning (bounds per core, overlaps, values) is the
    interpreter's and ``check_memory``'s."""
    require(program, Program, "verify_program", "program")
    where = f"program {program.name}"
    kernel: dict[int, KernelArg] = {}
    n = len({k.buffer for k in program.kernel_args})  # an output may be an input's, or another output's, buffer
    for k in program.kernel_args:
        same = kernel.setdefault(k.arg_index, k)
        if not 0 <= k.arg_index < n or same.buffer != k.buffer:
            raise LoweringError(
                f"{where}: kernel argument {k.name} (buffer {k.buffer}) has arg_index {k.arg_index}; the {n} "
                f"argument buffers must be numbered 0..{n - 1}, one number per buffer"
            )
        end = k.address + device_bytes(k.device_size, formats.FORMATS[k.device_dtype].nbytes)
        if not _fits(end, program.hbm_bytes):
            raise LoweringError(f"{where}: kernel argument {k.name} at {k.address} ends at byte {end}, past the "
                                f"program's {program.hbm_bytes} bytes of HBM")
    placed: dict[str, TensorArg] = {}  # tensor -> its first use
    coord_names: dict[tuple, frozenset[str]] = {}  # coordinates -> the symbols they use
    for spec, depth in walk_specs(program.body):
        if isinstance(spec, OpSpec):
            _verify_op_spec(spec, depth, program, kernel, placed, coord_names)
    _verify_tiled_symbols(program)
    _verify_advances(program)
    _verify_iterations(program)
    return program


def _fits(end: int | sympy.Expr, limit: int | sympy.Expr) -> bool:
    """``end <= limit``, at every size when either is an expression in the symbolic sizes:
    what sympy cannot prove (a corrupted size or address) does not fit."""
    try:
        return not bool(end > limit)
    except TypeError:  # an undecidable relation between expressions
        return False


def _loop_ops(body: tuple, chain: tuple[LoopSpec, ...] = ()):
    """``(op, its enclosing loops outermost first)`` in program order."""
    for spec in body:
        if isinstance(spec, LoopSpec):
            yield from _loop_ops(spec.body, chain + (spec,))
        else:
            yield spec, chain


def _verify_tiled_symbols(program: Program) -> None:
    """``tiled_symbols`` (which the SDSC writes per loop) agree with the loops' records
    (``LoopSpec.tiled_symbols``, the dims each loop tiles): a loop tiles its dims for every op
    inside it, so each op lists exactly the recorded symbols it iterates (an op of the loop's
    first or last iteration only lists none at that loop); a loop of count > 1 tiles some dim,
    or it would repeat the same work; and a loop whose dims no op iterates (dims tiled to one
    element per tile, which leave the iteration spaces) moves some tensor or folds an accumulator."""
    ops = list(_loop_ops(program.body))
    loops = [s for s, _ in walk_specs(program.body) if isinstance(s, LoopSpec)]
    if not any(loop.tiled_symbols for loop in loops) and not any(spec.tiled_symbols for spec, _ in ops):
        return  # a program written without them (tests, the anchor's examples): nothing to agree
    for level_loop in loops:
        if not level_loop.tiled_symbols and level_loop.count != 1:
            raise LoweringError(f"program {program.name}: a loop of count {level_loop.count} tiles no dim "
                                f"(tiled_symbols is empty): it would run the same work {level_loop.count} times")
        if level_loop.tiled_symbols and level_loop.count == 1:
            # a level of one tile runs in place (docs/tiling.md, "Tails"): its tile is the dim's
            # whole range, so a loop of one iteration that tiles a dim covers one tile of a longer range
            raise LoweringError(f"program {program.name}: a loop of count 1 tiles "
                                f"{[str(s) for s in level_loop.tiled_symbols]}: one tile of a dim is its whole "
                                f"range, which runs in place; a loop over a dim's tiles runs at least two")
    listed: dict[int, bool] = {}
    moves: dict[int, bool] = {}
    for spec, chain in ops:
        if chain and not spec.tiled_symbols:
            raise LoweringError(f"program {program.name}: op {spec.name or spec.op} sits in {len(chain)} loops but "
                                f"lists no tiled_symbols; where ops list them every op lists one tuple per loop")
        space = {s.name for s in spec.iteration_space}
        for level, loop in enumerate(chain):
            tiles = [s.name for s in loop.tiled_symbols]
            guarded = spec.runs != "every" and level == len(chain) - 1
            want = set() if guarded else set(tiles) & space
            got = {s.name for s in spec.tiled_symbols[level]}
            if got != want:
                raise LoweringError(
                    f"program {program.name}: op {spec.name or spec.op} lists tiled_symbols {sorted(got)} at loop "
                    f"level {level} (count {loop.count}), but that loop tiles {tiles} and the op iterates "
                    f"{sorted(space)}{' in one iteration only' if guarded else ''}: it must list {sorted(want)}")
            listed[id(loop)] = listed.get(id(loop), False) or bool(got)
            # an op that reads the tensor it writes (an accumulator's fold) does new work each
            # iteration even when nothing moves: a tiled reduction of a constant folds it count times
            carries = spec.args[-1].name in {a.name for a in spec.args[:-1]}
            moves[id(loop)] = moves.get(id(loop), False) or carries or any(a.tile_advance[level] != 0
                                                                           for a in spec.args)
    for spec, chain in ops:
        for level, loop in enumerate(chain):
            if loop.count != 1 and not listed[id(loop)] and not moves[id(loop)]:
                raise LoweringError(
                    f"program {program.name}: loop at level {level} (count {loop.count}) around op "
                    f"{spec.name or spec.op} tiles {[str(s) for s in loop.tiled_symbols]}, which none of its ops "
                    f"iterates, and moves no tensor: it would run the same work {loop.count} times")


def _verify_advances(program: Program) -> None:
    """Each ``tile_advance`` is the byte step the rest of the program gives the tensor (the
    device adds it per iteration; the interpreter reads nothing else to move a tile).

    In HBM, where a tensor is laid out row-major over its device size, moving the symbols an
    op lists at a loop (``OpSpec.tiled_symbols``) by one tile -- their extent in the op's
    iteration space -- moves the address by the difference of the device coordinates'
    offsets (``tile_advance`` in ``emit_program``), for a tensor over the loop's whole range;
    a per-tile tensor (its device size ends within the loop's range, or it is no kernel
    argument, lives within the loop and no use moves it there) stays (0). Inside a loop
    tiling a dim, every op iterating it there runs on one whole tile of it (the loop's own
    tail runs after it, or in its last iteration listing nothing there), unless a level
    inside tiles the dim again. So two steps the program does not record are not checked: a
    loop's over a dim a level inside tiles again (its tile is the inner tiles' span, tail
    included: an inner loop tiles the dim, or the loop's ops take several extents of it, an
    inner level of one tile and a tail run in place), and a loop's over a dim its ops iterate
    with one element per tile (the symbol leaves their iteration spaces).

    In LX, where each core lays out its own box, a loop around every use reuses one region
    (no advance); the loops that walk the tensor (sibling loops leaving tiles for each other)
    step one slot per iteration, the innermost by a slot that holds the core's box and each
    outer one by a row of the inner slots, and every use walks alike (``fspyre.stages.
    allocation``, ``_lx_slots``)."""
    ops = list(_loop_ops(program.body))
    if not any(spec.tiled_symbols for spec, _ in ops):
        return  # a program written without them: the levels' symbols are not recorded
    retiled: dict[int, frozenset[sympy.Symbol]] = {}  # loop -> the symbols loops inside it tile again

    def tiled_within(body: tuple[Spec, ...]) -> frozenset[sympy.Symbol]:
        out: frozenset[sympy.Symbol] = frozenset()
        for spec in body:
            if isinstance(spec, LoopSpec):
                inner = tiled_within(spec.body)
                retiled[id(spec)] = inner
                out |= inner | frozenset(spec.tiled_symbols)
        return out

    tiled_within(program.body)
    # an inner level run in place (one tile and a tail) leaves ops of two extents at the loop
    # outside it, whose tile is their sum: only a loop whose ops all take one extent says its step
    extents: dict[tuple[int, sympy.Symbol], set] = {}
    for spec, chain in ops:
        for level, loop in enumerate(chain):
            for s in spec.tiled_symbols[level]:
                extents.setdefault((id(loop), s), set()).add(spec.iteration_space[s][0])
    for (lid, s), seen in extents.items():
        if len(seen) > 1:
            retiled[lid] = retiled[lid] | {s}
    uses: dict[tuple[str, str], list[tuple[OpSpec, TensorArg, tuple[LoopSpec, ...]]]] = {}
    for spec, chain in ops:
        for a in spec.args:
            uses.setdefault((a.memory, a.name), []).append((spec, a, chain))
    for (memory, name), its in uses.items():
        if memory == "lx":
            _verify_lx_walk(program, name, its)
            continue
        for spec, a, chain in its:
            if chain:
                _verify_hbm_advance(program, spec, a, chain, retiled, its)


def _same_size(a: int | sympy.Expr, b: int | sympy.Expr) -> bool:
    if type(a) is int and type(b) is int:
        return a == b
    return sympy.expand(sympy.sympify(a) - b) == 0


def _shift_bytes(program: Program, a: TensorArg, syms: tuple[sympy.Symbol, ...],
                 moved: Mapping[sympy.Symbol, int | sympy.Expr]) -> int | sympy.Expr:
    """How far ``a``'s address moves when the symbols ``moved`` go from 0 to their step (the
    other symbols at 0): its coordinates' row-major offset difference, in bytes."""
    strides = row_major_strides(a.device_size)
    if program.symbolic is None and all(type(v) is int for v in moved.values()):
        base = [0] * len(syms)
        at = [moved.get(s, 0) for s in syms]
        off = sum(int(compile_index(c, syms)(*at)) * st - int(compile_index(c, syms)(*base)) * st
                  for c, st in zip(a.device_coordinates, strides))
    else:
        zero = {s: 0 for s in syms}
        off = sum((sympy.sympify(c).xreplace({**zero, **moved}) - sympy.sympify(c).xreplace(zero)) * st
                  for c, st in zip(a.device_coordinates, strides))
    return off * formats.FORMATS[a.device_dtype].nbytes


def _verify_hbm_advance(program: Program, spec: OpSpec, a: TensorArg, chain: tuple[LoopSpec, ...],
                        retiled: Mapping[int, frozenset[sympy.Symbol]],
                        uses: list[tuple[OpSpec, TensorArg, tuple[LoopSpec, ...]]]) -> None:
    space = spec.iteration_space
    syms = tuple(space)
    for level, loop in enumerate(chain):
        listed = spec.tiled_symbols[level]
        squeezed = [s for s in loop.tiled_symbols if s not in space]
        # a dim tiled again inside (by a loop, or in place): the ops' extents are the inner tiles'
        again = [s for s in listed if s in retiled[id(loop)]]
        if squeezed or again:
            continue  # a step the program does not record (the docstring above)
        moved = {s: space[s][0] for s in listed}
        want = _shift_bytes(program, a, syms, moved)
        got = a.tile_advance[level]
        if not _same_size(got, want) and not (got == 0 and _per_tile(a, level, loop, uses, space, moved)):
            tiles = ", ".join(f"{s} by {n}" for s, n in moved.items()) or "nothing"
            raise LoweringError(
                f"program {program.name}: op {spec.name or spec.op}: HBM tensor {a.name} advances {got} bytes per "
                f"iteration of loop level {level} (count {loop.count}), but that loop moves {tiles} elements, "
                f"which moves its device coordinates {[str(c) for c in a.device_coordinates]} over device size "
                f"{[str(n) for n in a.device_size]} by {want} bytes: tile_advance[{level}] must be {want}")


def _per_tile(a: TensorArg, level: int, loop: LoopSpec, uses: list[tuple[OpSpec, TensorArg, tuple[LoopSpec, ...]]],
              space: Mapping[sympy.Symbol, tuple], moved: Mapping[sympy.Symbol, int | sympy.Expr]) -> bool:
    """``a`` is a per-tile tensor of ``loop``, which stays where it is: it cannot hold the
    loop's every tile, or it is no kernel argument and lives within the loop, no use moving it
    there (a per-tile tensor padded to a whole stick is as large as a whole one)."""
    if not _holds_every_tile(a, space, moved, loop.count):
        return True
    return a.arg_index < 0 and all(any(c is loop for c in chain) and u.tile_advance[level] == 0
                                   for _, u, chain in uses)


def _holds_every_tile(a: TensorArg, space: Mapping[sympy.Symbol, tuple],
                      moved: Mapping[sympy.Symbol, int | sympy.Expr], count: int | sympy.Expr) -> bool:
    """``a``'s device size holds the last point of the last tile: a tensor over the loop's whole
    range, which moves with it. A per-tile tensor (its coordinates over one tile) does not
    hold it and stays where it is."""
    last = {s: (count * moved[s] if s in moved else n) - 1 for s, (n, _) in space.items()}
    for c, n in zip(a.device_coordinates, a.device_size):
        if not _fits(sympy.sympify(c).xreplace(last), n - 1):
            return False
    return True


def _verify_lx_walk(program: Program, name: str,
                    uses: list[tuple[OpSpec, TensorArg, tuple[LoopSpec, ...]]]) -> None:
    where = f"program {program.name}: LX tensor {name}"
    common = _common_prefix([chain for _, _, chain in uses])
    walk: tuple[tuple, OpSpec] | None = None
    for spec, a, chain in uses:
        op = spec.name or spec.op
        space = {s.name for s in spec.iteration_space}
        used = frozenset().union(*map(free_names, a.device_coordinates))
        for level, loop in enumerate(chain):
            adv = a.tile_advance[level]
            if level < common:
                if adv != 0:
                    raise LoweringError(
                        f"{where} advances {adv} bytes per iteration of loop level {level} (count {loop.count}) "
                        f"in op {op}, but that loop encloses every use of it, so each iteration reuses its one "
                        f"region: tile_advance[{level}] must be 0")
                continue
            # (a tile whose coordinates move may still stay in one slot: a per-tile buffer's
            # coordinates are over the tile; every use walking alike, below, is what is checked)
            moves = bool({s.name for s in spec.tiled_symbols[level]} & used)
            squeezed = any(s.name not in space for s in loop.tiled_symbols)
            if not moves and not squeezed and adv != 0:
                raise LoweringError(
                    f"{where} advances {adv} bytes per iteration of loop level {level} (count {loop.count}) in op "
                    f"{op}, whose coordinates {[str(c) for c in a.device_coordinates]} do not move with the "
                    f"symbols the op lists there {[str(s) for s in spec.tiled_symbols[level]]}: "
                    f"tile_advance[{level}] must be 0")
        key = tuple((chain[k].count, a.tile_advance[k]) for k in range(common, len(chain)) if a.tile_advance[k] != 0)
        if walk is None:
            walk = (key, spec)
        elif key != walk[0]:
            other = walk[1].name or walk[1].op
            raise LoweringError(
                f"{where}: op {op} walks its slots as {_walk_text(key)} (loop count x bytes per iteration), but op "
                f"{other} as {_walk_text(walk[0])}; iteration j of each loop meets the tile iteration j of the "
                f"others left in LX only when every use walks alike")
        for (_, outer), (count, inner) in zip(key, key[1:]):
            if not _same_size(outer, inner * count):
                raise LoweringError(
                    f"{where}: op {op} walks its slots as {_walk_text(key)} (loop count x bytes per iteration): an "
                    f"outer loop steps over a whole row of the inner loop's slots, {inner} x {count} bytes")
        need = _lx_box_bytes(program, spec, a) if key and type(key[-1][1]) is int else None
        if need is not None and key[-1][1] < need:
            raise LoweringError(
                f"{where}: op {op} steps {key[-1][1]} bytes from one LX slot to the next, but a core's box of it "
                f"takes {need} bytes: the slots would overlap")


def _walk_text(key: tuple) -> str:
    return "[" + ", ".join(f"{c}x{b}" for c, b in key) + "]"


def _common_prefix(chains: list[tuple[LoopSpec, ...]]) -> int:
    """The number of loops (outermost first) that enclose every one of ``chains``."""
    n = min(len(c) for c in chains)
    first = chains[0]
    for k in range(n):
        if any(c[k] is not first[k] for c in chains):
            return k
    return n


def _lx_box_bytes(program: Program, spec: OpSpec, a: TensorArg) -> int | None:
    """The bytes of the largest per-core LX box of ``a`` in ``spec`` (None in a symbolic program)."""
    if program.symbolic is not None or spec.symbolic:
        return None
    lows, highs = coord_bounds(a.device_coordinates, tuple(spec.iteration_space), spec.slice_extents)
    _, extents = lx_box(lows, highs, a.device_size)
    return int(box_bytes(extents, formats.FORMATS[a.device_dtype].nbytes).max())


@dataclass(frozen=True, slots=True)
class _Member:
    """What one node of a loop body does to tensors, seen from that loop (level ``d``): the
    tensors it reads before writing them, writes, writes and does not read again before it
    ends (whose value it hands on), and writes at the same address in every iteration of the
    loop; and its ops."""

    exposed: frozenset[str]
    writes: frozenset[str]
    final: frozenset[str]
    fixed: frozenset[str]
    ops: tuple[OpSpec, ...]


def _member(node: Spec, level: int) -> _Member:
    exposed: set[str] = set()
    writes: set[str] = set()
    last: dict[str, str] = {}
    advancing: set[str] = set()
    ops = tuple(spec for spec, _ in _loop_ops((node,)))
    for spec in ops:
        *ins, out = spec.args
        names = {a.name for a in ins}
        exposed |= names - writes
        for n in names:
            last[n] = "r"
        writes.add(out.name)
        last[out.name] = "w"
        if out.tile_advance[level] != 0:
            advancing.add(out.name)
    final = frozenset(n for n in writes if last[n] == "w")
    return _Member(frozenset(exposed), frozenset(writes), final, frozenset(writes - advancing), ops)


def _verify_iterations(program: Program) -> None:
    """No iteration's work is lost: in a loop of more than one iteration, a result that
    changes from one iteration to the next (its op moves with the loop, or reads such a
    result) and is written at the same address in every iteration must be read by an op of
    the loop's every iteration before it is overwritten -- later in the iteration, or in the
    next one (a fold reads what it writes). The guards (``OpSpec.runs``) follow from it: an
    accumulator's fill runs in the first iteration only (run in every one, it overwrites the
    folded value), its fold in every one (run in the last only, the partials of the other
    iterations are overwritten unread), and what reads the folded result to store it runs in
    the last (run in every one, it stores each partial result over the one before). A
    loop-invariant op (a copy of an operand the loop reads) may run in every iteration: it
    does the same work each time. (A result nothing reads -- no op, no kernel output -- may be
    lost: a dead op's.)"""
    read = {k.buffer for k in program.kernel_args} | {a.name for spec in op_specs(program) for a in spec.args[:-1]}

    def visit(body: tuple[Spec, ...], depth: int) -> None:
        for spec in body:
            if isinstance(spec, LoopSpec):
                if spec.count != 1:
                    _verify_loop_iterations(program, spec, depth, read)
                visit(spec.body, depth + 1)

    visit(program.body, 0)


def _verify_loop_iterations(program: Program, loop: LoopSpec, depth: int, read: set[str]) -> None:
    members = [(k, m) for k, m in enumerate(loop.body) if isinstance(m, LoopSpec) or m.runs == "every"]
    info = {k: _member(m, depth) for k, m in members}
    # the ops whose work changes with the loop: each that moves with it (a symbol it lists
    # there, a tensor advancing there), and each that reads what such an op writes
    readers: dict[str, list[OpSpec]] = {}
    for k, _ in members:
        for op in info[k].ops:
            for a in op.args[:-1]:
                readers.setdefault(a.name, []).append(op)
    varying = [op for k, _ in members for op in info[k].ops
               if (op.tiled_symbols and op.tiled_symbols[depth]) or any(a.tile_advance[depth] != 0 for a in op.args)]
    seen = {id(op) for op in varying}
    changing: set[str] = set()
    while varying:
        op = varying.pop()
        changing.add(op.args[-1].name)
        for r in readers.get(op.args[-1].name, ()):
            if id(r) not in seen:
                seen.add(id(r))
                varying.append(r)
    events: dict[str, list[tuple[int, str]]] = {}  # per tensor, the members touching it in body order
    position: dict[tuple[str, int], int] = {}
    for k, _ in members:
        for n in info[k].exposed | info[k].writes:
            touches = events.setdefault(n, [])
            position[n, k] = len(touches)
            touches.append((k, "r" if n in info[k].exposed else "w"))
    for k, _ in members:
        for n in sorted(info[k].final & info[k].fixed & changing & read):
            touches = events[n]
            nxt, kind = touches[(position[n, k] + 1) % len(touches)]
            if kind == "w":
                writer = _label(loop.body[k])
                later = _label(loop.body[nxt])
                by = "itself in the next iteration" if nxt == k else f"{later}"
                raise LoweringError(
                    f"program {program.name}: loop at level {depth} (count {loop.count}): {writer} writes {n} at the "
                    f"same address in every iteration from work that changes with the iteration, but {by} "
                    f"overwrites it before any op of the loop's every iteration reads it, so every iteration's "
                    f"result but the last is lost: an accumulator's fill runs in the first iteration only "
                    f"(runs='first'), its fold in every one, and what stores the folded result in the last "
                    f"(runs='last')")


def _label(node: Spec) -> str:
    if isinstance(node, OpSpec):
        return f"op {node.name or node.op}"
    return f"the loop of count {node.count}"


def _verify_op_spec(spec: OpSpec, depth: int, program: Program, kernel: Mapping[int, KernelArg],
                    placed: dict[str, TensorArg], coord_names: dict[tuple, frozenset[str]]) -> None:
    where = f"program {program.name}: op {spec.name or spec.op}"
    if spec.cores > program.cores:
        raise LoweringError(f"{where} runs on {spec.cores} cores, more than the program's {program.cores}")
    if spec.tiled_symbols and len(spec.tiled_symbols) != depth:
        raise LoweringError(f"{where} sits in {depth} loops but lists tiled_symbols for {len(spec.tiled_symbols)}")
    if spec.runs != "every":
        moving = [a.name for a in spec.args if a.tile_advance and a.tile_advance[-1] != 0]
        if depth == 0 or moving or (spec.tiled_symbols and spec.tiled_symbols[-1]):
            why = ("it sits in no loop" if depth == 0 else f"tensor {moving[0]} advances there" if moving
                   else f"it tiles {[str(s) for s in spec.tiled_symbols[-1]]} there")
            raise LoweringError(f"{where} runs only in the {spec.runs} iteration of its innermost loop, but {why}; "
                                f"a guarded op runs once per iteration of the loops outside that one")
    space = {s.name for s in spec.iteration_space}
    stray = [s.name for level in spec.tiled_symbols for s in level if s.name not in space]
    if stray:
        raise LoweringError(f"{where}: tiled symbol {stray[0]} is not in its iteration space {sorted(space)}")
    *ins, out = spec.args
    if out.is_input or any(not a.is_input for a in ins):
        raise LoweringError(f"{where}: its args must be its inputs, then its one output; got is_input "
                            f"{[a.is_input for a in spec.args]}")
    fn, info = op_fn(spec.op), spec.op_info
    if fn not in POINTWISE_FNS and fn not in REDUCTION_FNS:
        raise LoweringError(f"{where}: program op {spec.op!r} is no operation fspyre emits")
    if spec.is_reduction != (fn in REDUCTION_FNS):
        raise LoweringError(f"{where}: program op {spec.op!r} is {'' if fn in REDUCTION_FNS else 'not '}a reduction, "
                            f"but is_reduction={spec.is_reduction}")
    outside = [s.name for s in info.reduced if s.name not in space]
    if outside or (not spec.is_reduction and (info.reduced or info.count != 1)) or (fn != "var" and info.correction):
        raise LoweringError(f"{where}: op info of {spec.op} reduces {[s.name for s in info.reduced]} (count "
                            f"{info.count}, correction {info.correction}); only a reduction reduces, only var has a "
                            f"correction, and the reduced symbols are in its iteration space {sorted(space)}")
    compute_of = _compute_dtype_refusal(spec)
    if compute_of is not None:
        raise LoweringError(f"{where}: op info computes in {info.compute}, but {compute_of}")
    stored = _bool_store_refusal(spec, fn, kernel)
    if stored is not None:
        raise LoweringError(f"{where}: op info says bool_store={info.bool_store}, but {stored}")
    if fn == "matmul" and len(ins) == 2:
        _verify_matmul_operands(spec, where)
    elif info.rows or info.cols:
        raise LoweringError(f"{where}: op info of {spec.op} records operand roles (rows, cols); only a batchmatmul "
                            f"has them")
    refs = list(info.args)
    if refs != list(range(len(ins))):
        raise LoweringError(f"{where}: operands refer to args {refs}, but it has {len(ins)} input args; each input "
                            f"must be an operand once, in order")
    for a in spec.args:
        if len(a.tile_advance) != depth:
            raise LoweringError(f"{where}: tensor {a.name} has {len(a.tile_advance)} tile advances inside {depth} "
                                f"loops; give one per enclosing loop")
        used = coord_names.get(a.device_coordinates)
        if used is None:
            used = coord_names[a.device_coordinates] = frozenset().union(*map(free_names, a.device_coordinates))
        if not used <= space:
            raise LoweringError(f"{where}: tensor {a.name} coordinates use {sorted(used - space)}, which its "
                                f"iteration space {sorted(space)} does not hold")
        first = placed.get(a.name)
        if first is not None:
            if (first.memory, first.address, first.device_size, first.device_dtype, first.arg_index) != (
                    a.memory, a.address, a.device_size, a.device_dtype, a.arg_index) and not moved_within(first, a):
                raise LoweringError(
                    f"{where}: tensor {a.name} is placed as {_place(a)}, but an earlier op placed it as "
                    f"{_place(first)}; one tensor has one place")
            continue  # its bounds and argument were checked where it first appeared
        placed[a.name] = a
        memory, address = a.memory, a.address
        if memory == "lx" and a.arg_index >= 0:
            raise LoweringError(f"{where}: tensor {a.name} is kernel argument {a.arg_index} but placed in LX; the "
                                f"runtime hands kernel arguments over in HBM")
        if memory == "lx":
            sizes = {size_symbol(d.name) for d in program.symbolic.dims} if program.symbolic is not None else set()
            if type(address) is not int and not (isinstance(address, sympy.Expr) and address.free_symbols <= sizes):
                # an expression only in a symbolic program's sizes: the whole form lays LX out by
                # |S|, and the symbolic compile recorded the |S| bound that keeps it within LX
                raise LoweringError(f"{where}: LX tensor {a.name} is at address {address}, an expression; an LX "
                                    f"address is a number of bytes, or an expression in the program's symbolic sizes")
            if type(address) is int and type(program.lx_bytes) is int and address >= program.lx_bytes:
                raise LoweringError(
                    f"{where}: LX tensor {a.name} at {address} is past the {program.lx_bytes}-byte LX")
            continue
        end = address + device_bytes(a.device_size, formats.FORMATS[a.device_dtype].nbytes)
        if not _fits(end, program.hbm_bytes):
            raise LoweringError(f"{where}: HBM tensor {a.name} at {address} ends at byte {end}, past the "
                                f"program's {program.hbm_bytes} bytes of HBM")
        if a.arg_index >= 0:
            k = kernel.get(a.arg_index)
            if k is None or (k.buffer, k.address, k.device_size, k.device_dtype) != (
                    a.name, address, a.device_size, a.device_dtype):
                got = "no such argument" if k is None else f"{k.buffer} at {k.address}, size {list(k.device_size)}"
                raise LoweringError(f"{where}: tensor {a.name} (at {address}, size {list(a.device_size)}) claims "
                                    f"kernel argument {a.arg_index}, which is {got}")


def _compute_dtype_refusal(spec: OpSpec) -> str | None:
    """Why ``op_info.compute`` cannot be the one ``numerics.compute_dtype`` gives the op, as far
    as the program tells (a bool and a float16 tensor share a device format), or None; and a
    bool store only into the format bools are stored in."""
    info = spec.op_info
    floats = [a for a in spec.args if a.device_dtype in ("BF16", "IEEE_FP32")]
    if info.compute == "int32" and floats:
        return f"tensor {floats[0].name} is in a float format ({floats[0].device_dtype})"
    scalars = [o.value for o in info.operands if isinstance(o, ScalarOperand) and type(o.value) is float]
    if info.compute == "int32" and scalars:
        return f"its scalar operand {scalars[0]!r} is a float, which computes in float32"
    out = spec.args[-1]
    if info.bool_store and out.device_dtype not in ("SEN169_FP16", "IEEE_FP16"):
        return f"it stores bools into {out.name}, a {out.device_dtype} tensor (bools are stored in the fp16 format)"
    return None


def _bool_store_refusal(spec: OpSpec, fn: str, kernel: Mapping[int, KernelArg]) -> str | None:
    """Why ``op_info.bool_store`` cannot be what the program says of the output, or None: a
    kernel argument records its dtype (bool or not), and a fn whose result is a float
    (``FLOAT_RESULT_FNS``) stores no bool. (An intermediate's dtype is not recorded: a bool
    and a float16 tensor share a device format.)"""
    info, out = spec.op_info, spec.args[-1]
    if info.bool_store and fn in FLOAT_RESULT_FNS:
        return f"{spec.op} computes a float, which no graph stores as a bool"
    k = kernel.get(out.arg_index) if out.arg_index >= 0 else None
    if k is not None and info.bool_store != (k.dtype == "bool"):
        return f"its output {out.name} is kernel argument {k.name}, a {k.dtype} tensor"
    return None


def _verify_matmul_operands(spec: OpSpec, where: str) -> None:
    """A batchmatmul's operands in the order its recorded roles say (``OpInfo.rows`` and
    ``cols``), as the device reads them: the first operand is the [.., M, K] one, carrying the
    output's ``rows`` symbols and none of its ``cols``, the second the [.., K, N] one; the roles
    are exactly the output symbols one operand carries and the other does not (a batch dim an
    operand is broadcast over is carried by the other alone, so it is a row or column of the
    product: the record decides, not a guess from the symbols' order)."""
    info = spec.op_info
    a, b, out = ({n for c in t.device_coordinates for n in free_names(c)} for t in (*spec.args[:2], spec.args[-1]))
    rows, cols = {s.name for s in info.rows}, {s.name for s in info.cols}
    if rows != (a - b) & out or cols != (b - a) & out:
        raise LoweringError(
            f"{where}: batchmatmul operands {spec.args[0].name}, {spec.args[1].name} do not take the roles its op "
            f"info records: rows {sorted(rows)} (output symbols of the first operand alone, the [.., M, K] one) "
            f"and cols {sorted(cols)} (of the second alone), but the first alone carries {sorted((a - b) & out)} "
            f"and the second alone {sorted((b - a) & out)}")


def _place(a: TensorArg) -> str:
    return f"{a.memory} at {a.address}, size {list(a.device_size)}, {a.device_dtype}, arg_index {a.arg_index}"
