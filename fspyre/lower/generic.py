"""The bundle in MLIR generic syntax: parseable by xdsl and by ``mlir-opt --allow-unregistered-dialect``.

Same plan as ``fspyre.lower.bundle`` (same SSA names, maps, symbol ids), printed op by op in
the ``"dialect.op"(operands) <{properties}> {attributes} : (types) -> types`` form, so a
real MLIR parser checks what the custom syntax only promises. The ``sdscbundle`` ops stay
unregistered; kernel-argument parameters keep the anchor's ``!sdscbundle.input_arg<index>``
type, which both parsers accept as an opaque type of an unregistered dialect. Addresses are
``index``. Affine maps are written inline on each ``affine.apply`` rather than as ``#map_N``
aliases, so each op reads on its own. ``arith.addi`` omits ``overflowFlags``: the property
has a default in current MLIR and does not exist in older releases.
"""

from __future__ import annotations

from fspyre.ir.program import Program
from fspyre.ir.symbolic import is_symbolic
from fspyre.lower.bundle import (
    INPUT_ARG_TYPE,
    AddIndex,
    AllocatePool,
    ApplyMap,
    BundlePlan,
    Constant,
    Execute,
    ExtractArg,
    ForLoop,
    IfIteration,
    MulIndex,
    Stmt,
    core_spaces_attr,
    index_arith,
    map_expr,
    plan_bundle,
)

_INDENT = "  "


def mlir_generic(program: Program) -> str:
    return print_generic(plan_bundle(program))


def print_generic(plan: BundlePlan) -> str:
    ind = _INDENT
    arg_types = ", ".join([INPUT_ARG_TYPE for _ in plan.params] + ["index" for _ in plan.sizes])
    lines = ['"builtin.module"() ({']
    lines.append(f'{ind}"func.func"() <{{sym_name = "sdsc_bundle", function_type = ({arg_types}) -> ()}}> ({{')
    if plan.params or plan.sizes:
        params = ", ".join([f"%{p}: {INPUT_ARG_TYPE}" for p in plan.params] + [f"%{n}: index" for n in plan.sizes])
        lines.append(f"{ind}^bb0({params}):")
    _stmts(plan.prelude + plan.body, 2, plan, lines)
    lines.append(f'{ind * 2}"func.return"() : () -> ()')
    lines.append(f"{ind}}}) : () -> ()")
    lines.append("}) : () -> ()")
    return "\n".join(lines) + "\n"


def _stmts(stmts: tuple[Stmt, ...], depth: int, plan: BundlePlan, lines: list[str]) -> None:
    tab = _INDENT * depth
    for s in stmts:
        if isinstance(s, Constant) and is_symbolic(s.value):
            _arith(s.name, s.value, tab, lines)
        elif isinstance(s, AllocatePool) and is_symbolic(s.nbytes):
            _arith(f"{s.name}_bytes", s.nbytes, tab, lines)
            lines.append(f'{tab}%{s.name} = "sdscbundle.device_mem_allocate"(%{s.name}_bytes) : (index) -> index')
        elif isinstance(s, Constant):
            lines.append(f'{tab}%{s.name} = "arith.constant"() <{{value = {s.value} : index}}> : () -> index')
        elif isinstance(s, AddIndex):
            lines.append(f'{tab}%{s.name} = "arith.addi"(%{s.lhs}, %{s.rhs}) : (index, index) -> index')
        elif isinstance(s, MulIndex):
            lines.append(f'{tab}%{s.name} = "arith.muli"(%{s.lhs}, %{s.rhs}) : (index, index) -> index')
        elif isinstance(s, ExtractArg):
            lines.append(f'{tab}%{s.name} = "sdscbundle.input_arg_extract"(%{s.source}) : ({INPUT_ARG_TYPE}) -> index')
        elif isinstance(s, AllocatePool):
            lines.append(f'{tab}%{s.name} = "sdscbundle.device_mem_allocate"() {{bytes = {s.nbytes} : i64}} '
                         f': () -> index')
        elif isinstance(s, ApplyMap):
            operands = ", ".join(f"%{v}" for v in (*s.ivs, s.base))
            types = ", ".join("index" for _ in range(len(s.ivs) + 1))
            lines.append(f'{tab}%{s.name} = "affine.apply"({operands}) '
                         f'<{{map = affine_map<{map_expr(plan.maps[s.map_index])}>}}> : ({types}) -> index')
        elif isinstance(s, Execute):
            operands = ", ".join(f"%{o}" for o in s.operands)
            types = ", ".join("index" for _ in s.operands)
            ids = ", ".join(str(i) for i in s.symbol_ids)
            spaces = f", core_spaces = {core_spaces_attr(s.core_spaces)}" if s.core_spaces else ""
            lines.append(f'{tab}"sdscbundle.sdsc_execute"({operands}) {{sdsc_filename = "{s.filename}", '
                         f'symbol_ids = [{ids}]{spaces}}} : ({types}) -> ()  // {s.comment}')
        elif isinstance(s, IfIteration):
            # predicate 0 is "eq"; an scf.if without results has an empty else region
            lines.append(f'{tab}%{s.name} = "arith.cmpi"(%{s.iv}, %{s.at}) <{{predicate = 0 : i64}}> '
                         f': (index, index) -> i1')
            lines.append(f'{tab}"scf.if"(%{s.name}) ({{')
            _stmts(s.body, depth + 1, plan, lines)
            lines.append(f'{tab}{_INDENT}"scf.yield"() : () -> ()')
            lines.append(f"{tab}}}, {{")
            lines.append(f"{tab}}}) : (i1) -> ()")
        else:
            assert isinstance(s, ForLoop)
            lines.append(f'{tab}"scf.for"(%c0, %{s.bound}, %c1) ({{')
            # Block labels are unique across the function so every parser accepts them.
            lines.append(f"{tab}^bb{s.index + 1}(%{s.iv}: index):")
            _stmts(s.body, depth + 1, plan, lines)
            lines.append(f'{tab}{_INDENT}"scf.yield"() : () -> ()')
            lines.append(f"{tab}}}) : (index, index, index) -> ()")


def _arith(name: str, value: object, tab: str, lines: list[str]) -> None:
    """A value computed from a symbolic size parameter (``fspyre.lower.bundle.index_arith``)."""
    for target, op, a, b in index_arith(name, value):  # type: ignore[arg-type]
        if op == "constant":
            lines.append(f'{tab}%{target} = "arith.constant"() <{{value = {a} : index}}> : () -> index')
        else:
            lines.append(f'{tab}%{target} = "arith.{op}"(%{a}, %{b}) : (index, index) -> index')
