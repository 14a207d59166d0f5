"""The unrolled program: every LoopSpec expanded into straight-line OpSpecs (``--emit unrolled``).

Innermost loops first, as the anchor's E1/E2 ``unroll_loop_specs``: copy ``i`` of a loop's
body has each HBM tensor's address moved by ``i * tile_advance[level]`` and that level
dropped from ``tile_advance`` and ``tiled_symbols``, so once every loop is gone both are
``()``; an op that runs only in the first or last iteration (``OpSpec.runs``) is in that copy
only. Execution order is unchanged, which is why the interpreter must give identical
results on both forms. Programs and OpSpecs outside loops are returned as they are.
"""

from __future__ import annotations

from dataclasses import replace

from fspyre.errors import LoweringError
from fspyre.ir.program import LoopSpec, OpSpec, Program, Spec, TensorArg
from fspyre.lower.bundle import op_label


def unroll(program: Program) -> Program:
    if not any(isinstance(s, LoopSpec) for s in program.body):
        return program
    return replace(program, body=tuple(op for spec in program.body for op in _expand(spec, 0)))


def _expand(spec: Spec, depth: int) -> tuple[OpSpec, ...]:
    """The straight-line ops of ``spec``, which sits inside ``depth`` loops; each result still
    carries the advances of those ``depth`` levels."""
    if isinstance(spec, OpSpec):
        _check_levels(spec, depth)
        return (spec,)
    inner = [(s.runs if isinstance(s, OpSpec) else "every", _expand(s, depth + 1)) for s in spec.body]
    last = spec.count - 1
    # a guarded op (OpSpec.runs) is copied into its one iteration, where it runs unguarded
    return tuple(_peel(op, depth, i) if runs == "every" else replace(_peel(op, depth, i), runs="every")
                 for i in range(spec.count) for runs, ops in inner
                 if runs == "every" or i == (0 if runs == "first" else last) for op in ops)


def _check_levels(spec: OpSpec, depth: int) -> None:
    for t in spec.args:
        if t.tile_advance and len(t.tile_advance) != depth:
            raise LoweringError(
                f"op {op_label(spec)}: tensor {t.name} has tile_advance {list(t.tile_advance)} "
                f"({len(t.tile_advance)} levels) inside {depth} loops; give one byte step per enclosing loop"
            )
    if spec.tiled_symbols and len(spec.tiled_symbols) != depth:
        raise LoweringError(
            f"op {op_label(spec)}: tiled_symbols has {len(spec.tiled_symbols)} levels inside {depth} loops; "
            f"give one tuple of symbols per enclosing loop, outermost first"
        )


def _peel(spec: OpSpec, level: int, i: int) -> OpSpec:
    """Iteration ``i`` of the loop at ``level``, the innermost level ``spec`` still carries."""
    args = tuple(_advance(t, level, i) for t in spec.args)
    tiled = spec.tiled_symbols[:level]
    if tiled == spec.tiled_symbols and all(a is t for a, t in zip(args, spec.args)):
        return spec
    return replace(spec, args=args, tiled_symbols=tiled)


def _advance(t: TensorArg, level: int, i: int) -> TensorArg:
    if not t.tile_advance:
        return t
    step = t.tile_advance[level] * i
    if step == 0:
        return replace(t, tile_advance=t.tile_advance[:level])
    # TensorArg refuses an advancing LX tensor, so a nonzero step is always an HBM move.
    return replace(t, address=t.address + step, tile_advance=t.tile_advance[:level])
