"""bundle.mlir: the anchor-compatible SuperDSC bundle of a Program.

The bundle is planned once (``plan_bundle``: a small frozen statement list) and printed twice:
in the anchor's custom syntax here (``bundle_mlir``) and in MLIR generic syntax by
``fspyre.lower.generic``; ``fspyre.lower.sdsc`` reads the same plan for its symbol ids, so
the three outputs cannot disagree on names, numbering or addresses.

Address mapping. fspyre allocates one absolute HBM byte space (what the interpreter runs on);
the runtime instead hands the bundle one base address per kernel argument and the bundle
allocates a pool for everything else. An absolute HBM address therefore becomes:

- for a tensor with ``arg_index >= 0``: kernel argument ``ai``'s base plus
  ``address - KernelArg.address`` (``%arg_{ai}`` when that offset is 0, otherwise
  ``%arg_{ai}_slice_{off}``); the offset must lie inside the argument's device bytes;
- for an intermediate (``arg_index == -1``): ``%pool_addr_{off}`` with
  ``off = address - pool_base``, where ``pool_base`` is the lowest intermediate HBM address
  and the pool spans up to the end of the highest intermediate (rounded up to 128 bytes).
  An intermediate overlapping a kernel argument's bytes cannot be expressed this way and is a
  LoweringError;
- an LX tensor keeps its fixed scratchpad address as ``%lx_addr_{addr}`` (a constant).

Every such base value is a *symbol*; symbols are numbered in first use (depth-first over the
OpSpecs, args in order) and symbol id ``-(n+1)`` names the n-th, as in the anchor. Each
``sdsc_execute`` takes one operand per TensorArg in args order (the advanced address for a
tensor that moves in a loop, else its base value) and its ``symbol_ids`` list, parallel to
the operands, says which symbol each operand binds. OpSpec ``idx`` (depth-first) executes
``sdsc_{idx}.json``; the k-th LoopSpec in preorder owns ``%loop_bound_k`` and ``%i_k``.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Literal, Union

import sympy

from fspyre.errors import LoweringError
from fspyre.ir.frozen import FrozenMap
from fspyre.ir.kinds import DeviceFormat
from fspyre.ir.program import ArgOperand, LoopSpec, OpSpec, Program, Spec, TensorArg
from fspyre.ir.symbolic import is_symbolic, size_dim_name
from fspyre.machine import formats
from fspyre.machine.rules import device_bytes

POOL_ALIGN = 128  # the pool is handed out in whole sticks, like every HBM allocation
INPUT_ARG_TYPE = "!sdscbundle.input_arg<index>"


# --- the plan -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Constant:
    name: str
    value: int | sympy.Expr  # an expression in a symbolic size: computed from its parameter


@dataclass(frozen=True, slots=True, kw_only=True)
class AddIndex:
    name: str
    lhs: str
    rhs: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ExtractArg:
    name: str
    source: str


@dataclass(frozen=True, slots=True, kw_only=True)
class AllocatePool:
    name: str
    nbytes: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ApplyMap:
    """``name = base + sum(strides[m][j] * ivs[j])``."""

    name: str
    map_index: int
    ivs: tuple[str, ...]
    base: str


@dataclass(frozen=True, slots=True, kw_only=True)
class MulIndex:
    """``name = lhs * rhs``: an induction variable times a stride that is an expression in a
    symbolic size (affine maps take only fixed strides)."""

    name: str
    lhs: str
    rhs: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Execute:
    index: int
    filename: str
    operands: tuple[str, ...]
    symbol_ids: tuple[int, ...]
    loops: tuple[int, ...]  # preorder numbers of the enclosing loops, outermost first
    comment: str
    # each core's [start, extent, ...] per symbol, only for an uneven split (the even ones follow
    # from the SDSC JSON's split alone, as in the anchor's bundle)
    core_spaces: tuple[tuple[int, ...], ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class ForLoop:
    index: int
    count: int
    iv: str
    bound: str
    body: tuple["Stmt", ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class IfIteration:
    """``body`` runs only when induction variable ``iv`` equals ``at`` (``c0`` for an op that
    runs in its loop's first iteration, ``loop_last_K`` for one that runs in its last):
    ``%name = arith.cmpi eq, %iv, %at`` and an ``scf.if %name`` around the body."""

    name: str
    iv: str
    at: str
    body: tuple["Stmt", ...]


Stmt = Union[Constant, AddIndex, MulIndex, ExtractArg, AllocatePool, ApplyMap, Execute, ForLoop, IfIteration]


@dataclass(frozen=True, slots=True, kw_only=True)
class Base:
    """Where a tensor's address comes from: a kernel argument, the pool, or a fixed LX address."""

    kind: Literal["arg", "pool", "lx"]
    arg_index: int
    offset: int

    @property
    def name(self) -> str:
        off = _ident(self.offset)
        if self.kind == "arg":
            return f"arg_{self.arg_index}" if self.offset == 0 else f"arg_{self.arg_index}_slice_{off}"
        if self.kind == "pool":
            return f"pool_addr_{off}"
        return f"lx_addr_{off}"


def _ident(value: object) -> str:
    """A number, or an expression in symbolic sizes, as part of an SSA name:
    ``128*|S| + 49152`` is ``128S_49152``."""
    if not isinstance(value, sympy.Expr) or not is_symbolic(value):
        return str(value)
    if value.has(sympy.ceiling):  # a stick count: ceiling(|S|/64) is cS_d64
        text = str(value).replace("ceiling(", "c").replace("|", "").replace("/", "d").replace("*", "")
        return "".join(ch if ch.isalnum() else "_" for ch in text.replace("-", "m").replace(" ", ""))
    syms = sorted(value.free_symbols, key=str)
    parts = []
    for powers, coeff in sympy.Poly(value, *syms).terms():
        names = "".join(size_dim_name(s) * p for s, p in zip(syms, powers))  # type: ignore[arg-type]
        parts.append(f"{coeff}{names}".replace("/", "d").replace("-", "m"))
    return "_".join(parts)


@dataclass(frozen=True, slots=True, kw_only=True)
class BundlePlan:
    maps: tuple[tuple[int, ...], ...]  # map N: byte stride of each map dim
    params: tuple[str, ...]  # function parameters, without the leading %
    sizes: tuple[str, ...]  # ``index`` parameters after them: the symbolic dims' sizes (``%S``)
    prelude: tuple[Stmt, ...]
    body: tuple[Stmt, ...]
    symbols: tuple[Base, ...]  # symbol id -(n+1) is symbols[n]
    regions: HbmRegions

    def executes(self) -> list[Execute]:
        """The executes in depth-first order (= OpSpec index order)."""
        out: list[Execute] = []

        def walk(stmts: tuple[Stmt, ...]) -> None:
            for s in stmts:
                if isinstance(s, Execute):
                    out.append(s)
                elif isinstance(s, (ForLoop, IfIteration)):
                    walk(s.body)

        walk(self.body)
        return out


# --- address mapping ------------------------------------------------------------------------


def device_nbytes(arg_dtype: DeviceFormat, device_size: tuple[int, ...]) -> int:
    return device_bytes(device_size, formats.FORMATS[arg_dtype].nbytes)


@dataclass(frozen=True, slots=True, kw_only=True)
class HbmRegions:
    """The kernel arguments' HBM byte ranges and the pool: what the bundle's bases stand for."""

    args: FrozenMap[int, tuple[int, int]]  # arg_index -> (address, nbytes), sorted by arg_index
    pool_base: int  # absolute HBM address of pool offset 0 (0 when there is no pool)
    pool_bytes: int


def op_label(spec: OpSpec) -> str:
    """How errors name an op: its program op and its graph name (``add buf0``)."""
    return f"{spec.op} {spec.name}" if spec.name else spec.op


def hbm_regions(program: Program) -> HbmRegions:
    """Kernel-argument byte ranges and the pool that holds every HBM intermediate. For a
    symbolic program: the regions at each witness size, checked there and written as lines
    in the size (the layout is the same at every size: fspyre.stages.symbolic)."""
    if program.symbolic is not None:
        from fspyre.stages.symbolic import generalize, instantiate, program_basis

        record = program.symbolic
        (d,) = record.dims
        sizes = tuple(w[0] for w in record.witnesses)
        regions = tuple(hbm_regions(instantiate(program, {d.name: n})) for n in sizes)
        return generalize(regions, sizes, d.symbol, f"bundle of program {program.name}",
                          program_basis(program, d.symbol))
    args: dict[int, tuple[int, int]] = {}
    for k in program.kernel_args:
        region = (k.address, device_nbytes(k.device_dtype, k.device_size))
        if args.setdefault(k.arg_index, region) != region:
            raise LoweringError(
                f"kernel arg {k.name}: arg_index {k.arg_index} is bound to both {args[k.arg_index]} and {region} "
                f"(address, bytes); give each distinct buffer its own arg_index"
            )
    # Kernel args occupy disjoint ranges, so only the last one starting below an
    # intermediate's end can overlap it if any does.
    by_start = sorted((addr, nbytes, ai) for ai, (addr, nbytes) in args.items())
    starts = [addr for addr, _, _ in by_start]
    lo, hi = None, None
    for spec in _ops(program.body):
        for t in spec.args:
            if t.memory != "hbm" or t.arg_index >= 0:
                continue
            end = t.address + device_nbytes(t.device_dtype, t.device_size)
            j = bisect.bisect_left(starts, end) - 1
            if j >= 0:
                addr, nbytes, ai = by_start[j]
                if t.address < addr + nbytes:
                    raise LoweringError(
                        f"op {op_label(spec)}: intermediate {t.name} at HBM [{t.address:#x}, {end:#x}) overlaps kernel "
                        f"arg {ai} at [{addr:#x}, {addr + nbytes:#x}); the bundle can only place intermediates in "
                        f"the pool, so allocate them outside the kernel arguments"
                    )
            lo = t.address if lo is None else min(lo, t.address)
            hi = end if hi is None else max(hi, end)
    pool_bytes = 0 if lo is None else -(-(hi - lo) // POOL_ALIGN) * POOL_ALIGN
    return HbmRegions(args=FrozenMap(sorted(args.items())), pool_base=lo or 0, pool_bytes=pool_bytes)


def tensor_base(spec: OpSpec, t: TensorArg, regions: HbmRegions) -> Base:
    if t.memory == "lx":
        return Base(kind="lx", arg_index=-1, offset=t.address)
    if t.arg_index < 0:
        return Base(kind="pool", arg_index=-1, offset=t.address - regions.pool_base)
    region = regions.args.get(t.arg_index)
    if region is None:
        raise LoweringError(
            f"op {op_label(spec)}: tensor {t.name} has arg_index {t.arg_index}, but the program's kernel args are "
            f"{list(regions.args)}; use -1 for an intermediate or add the kernel arg"
        )
    addr, nbytes = region
    off = t.address - addr
    if is_symbolic(off) or is_symbolic(nbytes):
        off = sympy.expand(off)  # checked at the witness sizes (plan_bundle)
    elif not 0 <= off < nbytes:
        raise LoweringError(
            f"op {op_label(spec)}: tensor {t.name} at HBM {t.address:#x} lies outside kernel arg {t.arg_index} "
            f"[{addr:#x}, {addr + nbytes:#x}); its arg_index or its allocation is wrong"
        )
    return Base(kind="arg", arg_index=t.arg_index, offset=off)


def level_advance(spec: OpSpec, t: TensorArg, depth: int) -> tuple[int, ...]:
    """The tensor's byte step per enclosing loop, outermost first; ``()`` means none moves."""
    if not t.tile_advance:
        return (0,) * depth
    if len(t.tile_advance) != depth:
        raise LoweringError(
            f"op {op_label(spec)}: tensor {t.name} has tile_advance {list(t.tile_advance)} "
            f"({len(t.tile_advance)} levels) inside {depth} loops; give one byte step per enclosing loop"
        )
    return t.tile_advance


def _ops(body: tuple[Spec, ...]):
    for spec in body:
        if isinstance(spec, LoopSpec):
            yield from _ops(spec.body)
        else:
            yield spec


# --- planning -------------------------------------------------------------------------------


def plan_bundle(program: Program) -> BundlePlan:
    """The bundle's statements. A symbolic program's bundle takes each symbolic size as an
    ``index`` parameter and computes its loop bounds, pool size and offsets from it; the
    checks of the address mapping run on the program at each witness size first."""
    if program.symbolic is not None:
        from fspyre.stages.symbolic import instantiate

        for w in program.symbolic.witnesses:
            plan_bundle(instantiate(program, {d.name: n for d, n in zip(program.symbolic.dims, w)}))
    regions = hbm_regions(program)
    maps: dict[tuple[int, ...], int] = {}
    strides: dict[sympy.Expr, str] = {}  # a symbolic stride -> the SSA value computing it
    symbols: dict[Base, int] = {}
    bounds: list[Constant] = []
    lasts: dict[str, Constant] = {}  # the last iteration of each loop that guards an op with it
    n_ops, n_addr = 0, 0

    def op(spec: OpSpec, loops: tuple[int, ...]) -> list[Stmt]:
        nonlocal n_ops, n_addr
        stmts: list[Stmt] = []
        applied: dict[tuple, str] = {}
        operands, ids = [], []
        for t in spec.args:
            base = tensor_base(spec, t, regions)
            ids.append(-(symbols.setdefault(base, len(symbols)) + 1))
            adv = level_advance(spec, t, len(loops))
            levels = [lvl for lvl, step in enumerate(adv) if step]
            if not levels:
                operands.append(base.name)
                continue
            fixed = [lvl for lvl in levels if not is_symbolic(adv[lvl])]
            moving = [lvl for lvl in levels if is_symbolic(adv[lvl])]
            m = maps.setdefault(tuple(adv[lvl] for lvl in fixed), len(maps)) if fixed else -1
            ivs = tuple(f"i_{loops[lvl]}" for lvl in fixed)
            key = (m, ivs, base.name, tuple((loops[lvl], adv[lvl]) for lvl in moving))
            if key not in applied:
                applied[key] = name = f"addr_{n_addr}"
                n_addr += 1
                cur = base.name
                if fixed:
                    cur = name if not moving else f"{name}_fixed"
                    stmts.append(ApplyMap(name=cur, map_index=m, ivs=ivs, base=base.name))
                for j, lvl in enumerate(moving):
                    stride = strides.setdefault(adv[lvl], f"stride_{_ident(adv[lvl])}")
                    last = j == len(moving) - 1
                    stmts.append(MulIndex(name=f"{name}_step{j}", lhs=f"i_{loops[lvl]}", rhs=stride))
                    stmts.append(AddIndex(name=name if last else f"{name}_part{j}", lhs=cur, rhs=f"{name}_step{j}"))
                    cur = f"{name}_part{j}"
            operands.append(applied[key])
        stmts.append(Execute(
            index=n_ops, filename=f"sdsc_{n_ops}.json", operands=tuple(operands), symbol_ids=tuple(ids),
            loops=loops, comment=_comment(spec),
            core_spaces=() if spec.even else tuple(tuple(x for se in space for x in se) for space in spec.core_spaces),
        ))
        n_ops += 1
        return stmts

    def body(specs: tuple[Spec, ...], loops: tuple[int, ...]) -> tuple[Stmt, ...]:
        out: list[Stmt] = []
        for spec in specs:
            if isinstance(spec, LoopSpec):
                k = len(bounds)
                bounds.append(Constant(name=f"loop_bound_{k}", value=spec.count))
                out.append(ForLoop(index=k, count=spec.count, iv=f"i_{k}", bound=f"loop_bound_{k}",
                                   body=body(spec.body, loops + (k,))))
            elif spec.runs != "every":  # an op of one iteration of its innermost loop: guarded by an scf.if
                k = loops[-1]
                at = "c0"
                if spec.runs == "last":
                    at = f"loop_last_{k}"
                    if at not in lasts:
                        lasts[at] = Constant(name=at, value=bounds[k].value - 1)
                out.append(IfIteration(name=f"guard_{n_ops}", iv=f"i_{k}", at=at, body=tuple(op(spec, loops))))
            else:
                out.extend(op(spec, loops))
        return tuple(out)

    main = body(program.body, ())
    arg_indices = list(regions.args)
    prelude: list[Stmt] = []
    if regions.pool_bytes:
        prelude.append(AllocatePool(name="pool", nbytes=regions.pool_bytes))
    prelude.extend(ExtractArg(name=f"arg_{ai}", source=f"arg_{ai}_base_addr") for ai in arg_indices)
    if bounds:
        prelude += [Constant(name="c0", value=0), Constant(name="c1", value=1), *bounds, *lasts.values()]
    # a stride that is an expression in a symbolic size, computed once
    prelude += [Constant(name=name, value=x) for x, name in strides.items()]
    for base in symbols:
        if base.kind == "arg" and base.offset:
            off = f"arg_{base.arg_index}_slice_offset_{_ident(base.offset)}"
            prelude += [Constant(name=off, value=base.offset),
                        AddIndex(name=base.name, lhs=f"arg_{base.arg_index}", rhs=off)]
        elif base.kind == "pool":
            off = f"pool_offset_{_ident(base.offset)}"
            prelude += [Constant(name=off, value=base.offset), AddIndex(name=base.name, lhs="pool", rhs=off)]
        elif base.kind == "lx":
            prelude.append(Constant(name=base.name, value=base.offset))
    sizes = tuple(d.name for d in program.symbolic.dims) if program.symbolic is not None else ()
    return BundlePlan(
        maps=tuple(maps), params=tuple(f"arg_{ai}_base_addr" for ai in arg_indices), sizes=sizes,
        prelude=tuple(prelude),
        body=main, symbols=tuple(symbols), regions=regions,
    )


def core_spaces_attr(spaces: tuple[tuple[int, ...], ...]) -> str:
    """An array attribute of one [start, extent, start, extent, ...] array per core."""
    return "[" + ", ".join("[" + ", ".join(map(str, row)) + "]" for row in spaces) + "]"


def _comment(spec: OpSpec) -> str:
    def show(t: TensorArg) -> str:
        return f"{t.name}(lx)" if t.memory == "lx" else t.name

    ins = ", ".join(show(spec.args[o.index]) if isinstance(o, ArgOperand) else repr(o.value)
                    for o in spec.op_info.operands)
    outs = ", ".join(show(t) for t in spec.args if not t.is_input)
    return comment_text(f"{spec.op}: {ins} -> {outs}")


def comment_text(text: str) -> str:
    """``text`` fit for the rest of one ``//`` line: a character outside printable ASCII is
    written as its Python escape. Names are ASCII identifiers when checked (``require_name``),
    but a program built or edited by hand reaches the printer too, and a newline in a comment
    would start a line MLIR reads as an op."""
    return "".join(c if " " <= c <= "~" else c.encode("unicode_escape").decode("ascii") for c in text)


def index_arith(name: str, value: sympy.Expr) -> list[tuple[str, str, object, object]]:
    """``value``, a line ``(p*|S| + r) / q`` in one symbolic size, as index arithmetic on the
    size's function parameter ``%S``: ``(name, op, a, b)`` steps, ``op`` one of ``constant``
    (``a`` the number), ``muli``, ``addi``, ``divui`` (``a``, ``b`` SSA names); the last step
    defines ``name``. The division is exact where the program's assumptions hold. A stick
    count ``ceiling(u/q)`` of a whole-form program is ``(u + q - 1) / q``, times its
    coefficient, added to the rest."""
    counts = sorted(value.atoms(sympy.ceiling), key=str)
    if counts:
        rest = sympy.expand(value)
        steps: list[tuple[str, str, object, object]] = []
        terms = []
        for j, c in enumerate(counts):
            coeff = rest.coeff(c)
            rest = sympy.expand(rest - coeff * c)
            num, den = sympy.fraction(sympy.together(c.args[0]))
            if not (coeff.is_Integer and den.is_Integer):
                raise LoweringError(f"{name} = {value}: the bundle computes whole multiples of stick counts, not this")
            steps += index_arith(f"{name}_n{j}", (num + den - 1) / den)
            steps += [(f"{name}_k{j}", "constant", int(coeff), None),
                      (f"{name}_t{j}", "muli", f"{name}_n{j}", f"{name}_k{j}")]
            terms.append(f"{name}_t{j}")
        if rest.free_symbols:
            steps += index_arith(f"{name}_r", rest)
        else:
            steps.append((f"{name}_r", "constant", int(rest), None))
        cur = f"{name}_r"
        for j, t in enumerate(terms):
            steps.append((name if j == len(terms) - 1 else f"{name}_s{j}", "addi", cur, t))
            cur = steps[-1][0]
        return steps
    syms = [x for x in value.free_symbols]
    num, den = sympy.fraction(sympy.together(value))
    if len(syms) != 1 or not den.is_Integer or sympy.degree(num, syms[0]) != 1:
        raise LoweringError(f"{name} = {value}: the bundle computes lines in one symbolic size, not this")
    s = syms[0]
    p, r = num.coeff(s, 1), num.coeff(s, 0)
    steps = []
    cur = size_dim_name(s)

    def then(op: str, k: object) -> None:
        nonlocal cur
        steps.append((f"{name}_c{len(steps)}", "constant", k, None))
        steps.append((f"{name}_{op}{len(steps)}", op, cur, steps[-1][0]))
        cur = steps[-1][0]

    if p != 1:
        then("muli", int(p))
    if r != 0:
        then("addi", int(r))
    if den != 1:
        then("divui", int(den))
    if not steps:  # the value is the size itself
        steps.append((f"{name}_c0", "constant", 0, None))
        steps.append((f"{name}_addi1", "addi", cur, f"{name}_c0"))
    last = steps[-1]
    steps[-1] = (name, last[1], last[2], last[3])
    return steps


def map_expr(strides: tuple[int, ...]) -> str:
    """``(d0, d1)[s0] -> (s0 + S0*d0 + S1*d1)``; a negative stride prints as a subtraction."""
    dims = ", ".join(f"d{j}" for j in range(len(strides)))
    terms = "".join(f" + {s}*d{j}" if s >= 0 else f" - {-s}*d{j}" for j, s in enumerate(strides))
    return f"({dims})[s0] -> (s0{terms})"


# --- the anchor's custom syntax -------------------------------------------------------------


def bundle_mlir(program: Program) -> str:
    """The anchor-compatible bundle.mlir text (TAB indentation, as torch-spyre's bundle.py)."""
    return print_bundle(plan_bundle(program))


def print_bundle(plan: BundlePlan) -> str:
    lines = [f"#map_{n} = affine_map<{map_expr(s)}>" for n, s in enumerate(plan.maps)]
    lines.append("module {")
    params = ", ".join([f"%{p}: {INPUT_ARG_TYPE}" for p in plan.params] + [f"%{n}: index" for n in plan.sizes])
    lines.append(f"\tfunc.func @sdsc_bundle({params}) {{")
    _stmts(plan.prelude + plan.body, 2, lines)
    lines += ["\t\treturn", "\t}", "}"]
    return "\n".join(lines) + "\n"


def _stmts(stmts: tuple[Stmt, ...], depth: int, lines: list[str]) -> None:
    tab = "\t" * depth
    for s in stmts:
        if isinstance(s, Constant) and is_symbolic(s.value):
            for name, op, a, b in index_arith(s.name, s.value):
                rhs = f"arith.constant {a} : index" if op == "constant" else f"arith.{op} %{a}, %{b} : index"
                lines.append(f"{tab}%{name} = {rhs}")
        elif isinstance(s, Constant):
            lines.append(f"{tab}%{s.name} = arith.constant {s.value} : index")
        elif isinstance(s, AllocatePool) and is_symbolic(s.nbytes):
            for name, op, a, b in index_arith(f"{s.name}_bytes", s.nbytes):
                rhs = f"arith.constant {a} : index" if op == "constant" else f"arith.{op} %{a}, %{b} : index"
                lines.append(f"{tab}%{name} = {rhs}")
            lines.append(f"{tab}%{s.name} = sdscbundle.device_mem_allocate %{s.name}_bytes bytes : index")
        elif isinstance(s, AddIndex):
            lines.append(f"{tab}%{s.name} = arith.addi %{s.lhs}, %{s.rhs} : index")
        elif isinstance(s, ExtractArg):
            lines.append(f"{tab}%{s.name} = sdscbundle.input_arg_extract value from %{s.source} : "
                         f"{INPUT_ARG_TYPE} -> index")
        elif isinstance(s, AllocatePool):
            lines.append(f"{tab}%{s.name} = sdscbundle.device_mem_allocate {s.nbytes} bytes : index")
        elif isinstance(s, ApplyMap):
            ivs = ", ".join(f"%{v}" for v in s.ivs)
            lines.append(f"{tab}%{s.name} = affine.apply #map_{s.map_index}({ivs})[%{s.base}]")
        elif isinstance(s, MulIndex):
            lines.append(f"{tab}%{s.name} = arith.muli %{s.lhs}, %{s.rhs} : index")
        elif isinstance(s, Execute):
            operands = ", ".join(f"%{o}" for o in s.operands)
            ids = ", ".join(str(i) for i in s.symbol_ids)
            spaces = f', "core_spaces"={core_spaces_attr(s.core_spaces)}' if s.core_spaces else ""
            lines.append(f'{tab}sdscbundle.sdsc_execute ({operands}) {{sdsc_filename="{s.filename}", '
                         f'"symbol_ids"=[{ids}]{spaces}}} // {s.comment}')
        elif isinstance(s, IfIteration):
            lines.append(f"{tab}%{s.name} = arith.cmpi eq, %{s.iv}, %{s.at} : index")
            lines.append(f"{tab}scf.if %{s.name} {{")
            _stmts(s.body, depth + 1, lines)
            lines.append(f"{tab}}}")
        else:
            lines.append(f"{tab}scf.for %{s.iv} = %c0 to %{s.bound} step %c1 {{")
            _stmts(s.body, depth + 1, lines)
            lines.append(f"{tab}}}")
