"""A program as integer sets and maps (isl): every access of every op, over every loop
iteration, core and point of the op's iteration space, as a map from its instances to the
memory cells (bytes) and tensor elements it touches.

The model reads the fields the interpreter reads, and by its rules (fspyre/machine/interpreter.py,
fspyre/machine/rules.py):

- an op runs once per iteration of its enclosing loops (``LoopSpec.count``), or only in the
  first or last iteration of its innermost loop (``OpSpec.runs``);
- core ``c`` runs the points ``core_spaces[c]`` of the iteration space; every core reads, and
  with a split reduction only the cores holding slice 0 of every reduced symbol write, one
  instance per output point (``rules.writing_cores``);
- an HBM access touches ``address + nbytes * sum(coord_d * stride_d) + sum(i_L * tile_advance_L)``
  (``stride`` row-major over ``device_size``); an LX access touches the core's own LX at
  ``address + sum(i_L * tile_advance_L) + nbytes * sum((coord_d - low_d) * box_stride_d)``, the
  core's box (``rules.coord_bounds`` / ``rules.lx_box``) laid out row-major;
- kernel inputs are copied in before the body and outputs copied out after it, each host
  element at its stick layout (``layout.stick_layout``).

An instance of an access is ``[i_0 .. i_{d-1}, c, p_0 .. p_{n-1}, b]``: loop iterations, core,
point, and ``b`` the byte of the element (cells are bytes, so tensors of different element
sizes that share bytes meet). Symbolic sizes are isl parameters. Device coordinates are
quasi-affine (``floor`` and ``Mod`` by constants); what is not (a product of two variables, a
size times a coordinate) raises ``NotAffine``, which the proof reports as undecided.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import reduce
from typing import Any

import islpy as isl
import numpy as np
import sympy

from fspyre.ir.program import KernelArg, LoopSpec, OpSpec, Program, Spec
from fspyre.ir.symbolic import is_size_symbol
from fspyre.machine import formats
from fspyre.machine.layout import device_coordinates, stick_layout
from fspyre.machine.rules import coord_bounds, lx_box, row_major_strides, writing_cores

CTX = isl.DEFAULT_CONTEXT


class NotAffine(Exception):
    """An expression isl cannot hold: the proof of what needs it is undecided."""


def param_name(symbol: sympy.Symbol) -> str:
    return "sz_" + "".join(ch if ch.isalnum() else "_" for ch in symbol.name)


def isl_text(e: sympy.Basic | int, names: dict[sympy.Symbol, str]) -> str:
    """``e`` as an isl quasi-affine expression over ``names`` (iteration symbols to isl
    variables) and the symbolic sizes (isl parameters)."""
    if isinstance(e, int):
        return str(e)
    if e.is_Integer:
        return str(int(e))
    if e.is_Symbol:
        if e in names:
            return names[e]
        if is_size_symbol(e):
            return param_name(e)
        raise NotAffine(f"symbol {e} is neither an iteration symbol of the op nor a symbolic size")
    if e.free_symbols and all(is_size_symbol(x) for x in e.free_symbols) and not e.is_Symbol:
        # a size, count or address in the symbolic sizes: an integer wherever the program is
        # defined (|S|/64 under "divisible by 64"), so its floor is itself
        den = reduce(math.lcm, (int(t.as_coeff_Mul()[0].q) for t in sympy.Add.make_args(sympy.expand(e))), 1)
        if den > 1:
            return f"floor(({isl_text(sympy.expand(e * den), names)}) / {den})"
    if e.is_Add:
        return "(" + " + ".join(isl_text(a, names) for a in e.args) + ")"
    if e.is_Mul:
        coeff, rest = e.as_coeff_Mul()
        if not coeff.is_Integer:
            raise NotAffine(f"{e} has the fractional coefficient {coeff} outside a floor")
        factors = sympy.Mul.make_args(rest)
        variable = [f for f in factors if not (f.free_symbols and all(is_size_symbol(s) for s in f.free_symbols))]
        if len(factors) > 1 and (len(variable) > 1 or len(variable) == 1 and len(factors) > 1):
            raise NotAffine(f"{e} multiplies {' and '.join(map(str, factors))}: not affine")
        return f"({int(coeff)} * {isl_text(rest, names)})"
    if isinstance(e, (sympy.floor, sympy.ceiling)):
        arg = e.args[0]
        den = reduce(math.lcm, (int(t.as_coeff_Mul()[0].q) for t in sympy.Add.make_args(arg)), 1)
        fn = "floor" if isinstance(e, sympy.floor) else "ceil"
        return f"{fn}(({isl_text(sympy.expand(arg * den), names)}) / {den})"
    if isinstance(e, sympy.Mod):
        x, k = e.args
        if not k.is_Integer or int(k) <= 0:
            raise NotAffine(f"{e}: a modulus must be a positive constant")
        return f"(({isl_text(x, names)}) mod {int(k)})"
    raise NotAffine(f"{e} ({type(e).__name__}) is not a quasi-affine expression")


def _size(v: int | sympy.Expr) -> str:
    return isl_text(v, {})


_CASES = 256  # most cases one access is split into to keep a symbolic factor affine


def _terms(terms: Sequence[tuple[str, int | sympy.Expr, int | None, int | None]], what: str
           ) -> list[tuple[list[str], str]]:
    """``sum(factor * variable)`` as isl text, in cases: a factor that is a symbolic size (a
    row stride or an advance over ``|S|``) times a variable is not affine, so each value
    ``v`` of that variable (between the bounds given) is a case of its own, in which the term
    is ``v * factor``. Returns (conditions, text) per case."""
    fixed, split = [], []
    for var, factor, lo, hi in terms:
        if isinstance(factor, int) or getattr(factor, "is_Integer", False):
            if int(factor):
                fixed.append(f"{int(factor)} * ({var})")
        elif lo is None or hi is None:
            raise NotAffine(f"{what}: {factor} times {var}, which has no fixed bounds")
        else:
            split.append((var, factor, lo, hi))
    count = math.prod(hi - lo + 1 for _, _, lo, hi in split)
    if count > _CASES:
        raise NotAffine(f"{what}: a symbolic stride or advance times a variable of {count} values")
    cases: list[tuple[list[str], str]] = [([], " + ".join(fixed) or "0")]
    for var, factor, lo, hi in split:
        cases = [(cond + [f"{var} = {v}"], f"{text} + {isl_text(sympy.expand(v * factor), {})}")
                 for cond, text in cases for v in range(lo, hi + 1)]
    return cases


@dataclass(frozen=True, slots=True)
class Access:
    """One access of one op: ``stmt`` names its instances (``R<t>_<k>`` reads arg ``k`` of op
    ``t``, ``W<t>`` the op's write); ``pieces`` per core: the instance constraints, the
    memory, the address of the element's first byte in that memory (``cell``, isl text) and
    the tensor element (``elem``: the byte offset of its first byte in the tensor)."""

    stmt: str
    t: int
    spec: OpSpec | None
    arg: Any  # a TensorArg, or the KernelArg of a copy-in or copy-out
    is_write: bool
    dims: tuple[str, ...]  # the instance's variables: loop iterations, core, point
    pieces: tuple[tuple[str, str, str, str], ...]  # (constraints, memory, cell, tensor element)
    coords: tuple[tuple[str, ...], ...]  # per piece: each device coordinate (isl text)
    memory: str
    nbytes: int
    loops: int  # enclosing loops
    syms: tuple[sympy.Symbol, ...]
    path: tuple[int, ...] = ()  # body positions from the program's top (the op's place in program order)
    tensor: str = ""  # the tensor's isl name (``T<n>``)
    span: tuple[int, int] | None = None  # the bytes it may touch, [low, high) (None: symbolic)
    exprs: tuple = ()  # the device coordinates as sympy expressions in ``syms``
    counts: tuple = ()  # the enclosing loops' counts

    def head(self) -> str:
        return f"{self.stmt}[{', '.join(self.dims)}]"


@dataclass(frozen=True, slots=True)
class Model:
    program: Program
    params: tuple[str, ...]
    assumptions: str  # isl constraints on the parameters (Program.symbolic's assumptions)
    accesses: tuple[Access, ...]
    schedule: tuple[tuple[str, str], ...]  # (stmt, isl text of its schedule map)
    tensor_ids: dict[str, int]
    cache: dict = field(default_factory=dict)  # parsed isl objects, by what they are (internal)

    def space(self, body: str) -> str:
        head = f"[{', '.join(self.params)}] -> " if self.params else ""
        if not body:
            return f"{head}{{ }}"
        cond = f" and {self.assumptions}" if self.assumptions and ":" in body else (
            f" : {self.assumptions}" if self.assumptions else "")
        return f"{head}{{ {body}{cond} }}"

    def union_map(self, parts: Sequence[str]) -> isl.UnionMap:
        out = None
        for text in parts:
            one = isl.UnionMap.read_from_str(CTX, self.space(text))
            out = one if out is None else out.union(one)
        return out if out is not None else self.empty_map()

    def empty_map(self) -> isl.UnionMap:
        if "empty" not in self.cache:
            self.cache["empty"] = isl.UnionMap.read_from_str(CTX, self.space(""))
        return self.cache["empty"]

    def instances(self, acc: Access) -> isl.UnionSet:
        """Every instance of ``acc``."""
        key = ("inst", acc.stmt)
        if key not in self.cache:
            self.cache[key] = self.union_map([]).domain() if not acc.pieces else \
                self.access(acc, "elem").domain()
        return self.cache[key]

    def access(self, acc: Access, target: str, bytewise: bool = False) -> isl.UnionMap:
        """Instances of ``acc`` -> the memory cells (``target="cell"``) or tensor elements
        (``"elem"``) it touches: the element's first byte, or every byte (``bytewise``)."""
        key = (target, bytewise, acc.stmt)
        if key not in self.cache:
            if bytewise:
                name = "LX" if target == "cell" and acc.memory == "lx" else "HBM" if target == "cell" else acc.tensor
                per_core = acc.memory == "lx"
                spread = (f"{name}[c, a] -> {name}[c, y] : a <= y < a + {acc.nbytes}" if per_core
                          else f"{name}[a] -> {name}[y] : a <= y < a + {acc.nbytes}")
                self.cache[key] = self.access(acc, target).apply_range(self.union_map([spread]))
            elif target == "cell":
                # a tensor's element sits at the tensor's address plus its offset: the cells
                # are the elements moved, which is cheaper than reading them again
                at = _size(acc.arg.address)
                move = (f"{acc.tensor}[c, e] -> LX[c, {at} + e]" if acc.memory == "lx"
                        else f"{acc.tensor}[e] -> HBM[{at} + e]")
                self.cache[key] = self.access(acc, "elem").apply_range(self.union_map([move]))
            else:
                self.cache[key] = self.union_map([f"{acc.head()} -> {elem} : {cond}"
                                                  for cond, _, _, elem in acc.pieces])
        return self.cache[key]


def _assumptions(program: Program) -> tuple[tuple[str, ...], str]:
    if program.symbolic is None:
        return (), ""
    params, conds = [], []
    for dim in program.symbolic.dims:
        from fspyre.ir.symbolic import size_symbol

        p = param_name(size_symbol(dim.name))
        params.append(p)
        conds.append(f"{p} >= 1")
    for a in program.symbolic.assumptions:
        from fspyre.ir.symbolic import size_symbol

        p = param_name(size_symbol(a.dim))
        conds.append({"divisible": f"{p} mod {a.value} = 0", "at_least": f"{p} >= {a.value}",
                      "at_most": f"{p} <= {a.value}"}[a.kind])
    return tuple(params), " and ".join(conds)


def _op_accesses(program: Program, spec: OpSpec, t: int, counts: tuple, path: tuple[int, ...],
                 tensor_ids: dict[str, int]) -> list[Access]:
    if spec.symbolic:
        raise NotAffine(f"op {spec.name or spec.op}: its iteration space has a symbolic size")
    syms = tuple(spec.iteration_space)
    splits = [k for _, k in spec.iteration_space.values()]
    reduced = set(spec.op_info.reduced) if spec.is_reduction else set()
    writers = writing_cores(splits, [s in reduced for s in syms])
    loops = [f"i{L}" for L in range(len(counts))]
    pnames = {s: f"p{j}" for j, s in enumerate(syms)}
    # the slice of each symbol the core holds (a function of c, kept as dims so that one piece
    # describes every core of an even division without integer divisions, which make every
    # relation built on it costlier)
    knames = [f"k{j}" for j in range(len(syms))]
    dims = tuple(loops) + ("c",) + tuple(knames) + tuple(pnames[s] for s in syms)
    loop_cond = [f"0 <= i{L} < {_size(n)}" for L, n in enumerate(counts)]
    if spec.runs == "first" and counts:
        loop_cond.append(f"i{len(counts) - 1} = 0")
    elif spec.runs == "last" and counts:
        loop_cond.append(f"i{len(counts) - 1} = {_size(counts[-1])} - 1")
    out = []
    for k, arg in enumerate(spec.args):
        is_write = k == len(spec.args) - 1
        nb = formats.FORMATS[arg.device_dtype].nbytes
        coords = tuple(isl_text(c, pnames) for c in arg.device_coordinates)
        lows, highs = coord_bounds(arg.device_coordinates, syms, spec.slice_extents)
        if arg.memory == "lx":
            box_lo, box_ext = lx_box(lows, highs, [int(n) for n in arg.device_size])
        loop_terms = [(f"i{L}", a, 0 if _fixed(counts[L]) else None, int(counts[L]) - 1 if _fixed(counts[L]) else None)
                      for L, a in enumerate(arg.tile_advance[:len(counts)])]
        what = f"op {spec.name or spec.op} tensor {arg.name}"
        pieces, piece_coords, boxes = [], [], [0]
        for cond, low, ext in _core_pieces(spec, syms, knames, pnames, is_write, writers, reduced,
                                           box_lo if arg.memory == "lx" else None,
                                           box_ext if arg.memory == "lx" else None):
            cond = loop_cond + cond
            boxes.append(math.prod(ext) if ext is not None else 0)
            coord_terms: list[tuple[str, Any, int | None, int | None]]
            if arg.memory == "hbm":
                strides = row_major_strides(arg.device_size)
                coord_terms = [(x, st, int(lows[:, d].min()), int(highs[:, d].max()))
                               for d, (st, x) in enumerate(zip(strides, coords))]
            else:
                coord_terms = [(f"{x} - ({lo})", st, None, None)
                               for st, x, lo in zip(row_major_strides(ext), coords, low)]
            for extra, offset in _terms(coord_terms, what):
                for extra2, moved in _terms(loop_terms, what):
                    elem = f"{nb} * ({offset}) + {moved}"
                    if arg.memory == "hbm":
                        cell = f"HBM[{_size(arg.address)} + {elem}]"
                        tensor = f"T{tensor_ids[arg.name]}[{elem}]"
                    else:
                        cell = f"LX[c, {_size(arg.address)} + {elem}]"
                        tensor = f"T{tensor_ids[arg.name]}[c, {elem}]"
                    pieces.append((" and ".join(cond + extra + extra2), arg.memory, cell, tensor))
                    piece_coords.append(coords)
        stmt = f"W{t}" if is_write else f"R{t}_{k}"
        out.append(Access(stmt=stmt, t=t, spec=spec, arg=arg, is_write=is_write, dims=dims, pieces=tuple(pieces),
                          coords=tuple(piece_coords), memory=arg.memory, nbytes=nb, loops=len(counts), syms=syms,
                          path=path, tensor=f"T{tensor_ids[arg.name]}", span=_span(arg, nb, counts, max(boxes)),
                          exprs=tuple(arg.device_coordinates), counts=tuple(counts)))
    return out


def _span(arg, nb: int, counts: tuple, box: int) -> tuple[int, int] | None:
    """The bytes an access may touch: its allocation in HBM (memory safety keeps it there),
    its box moved by its loops' advances in LX; None when a size is symbolic."""
    values = [arg.address, *arg.device_size, *counts, *arg.tile_advance]
    if not all(_fixed(v) for v in values):
        return None
    if arg.memory == "hbm":
        return int(arg.address), int(arg.address) + nb * math.prod(int(n) for n in arg.device_size)
    moves = [int(a) * (int(n) - 1) for a, n in zip(arg.tile_advance, counts)]
    return (int(arg.address) + sum(min(0, m) for m in moves),
            int(arg.address) + sum(max(0, m) for m in moves) + nb * box)


def _runs(extents) -> list[tuple[int, int, int, int]]:
    """A symbol's slices as runs of equal extent: (first slice, slices, extent, start)."""
    out: list[tuple[int, int, int, int]] = []
    start = 0
    for k, e in enumerate(int(x) for x in extents):
        if out and out[-1][2] == e:
            out[-1] = (out[-1][0], out[-1][1] + 1, e, out[-1][3])
        else:
            out.append((k, 1, e, start))
        start += e
    return out


def _core_pieces(spec: OpSpec, syms, knames, pnames, is_write: bool, writers, reduced, box_lo, box_ext):
    """(constraints, LX box low per device dim as isl text, box extents) per piece of the
    cores. Each symbol's slices fall into runs of one extent (one run in an even division,
    two in the usual uneven one: the larger slices first); a piece is one run of each symbol,
    core ``c`` holding slice ``k_s`` of each, with ``p_s`` in ``[start + e * (k_s - first),
    ... + e)`` -- so the pieces do not grow with the cores. In LX every core of a piece must
    have its box of one shape at a low affine in its slice indices; a piece where that fails
    is split into its cores."""
    from fspyre.machine.rules import core_slices

    splits = [k for _, k in spec.iteration_space.values()]
    slices = core_slices(splits)
    strides = [math.prod(splits[:j]) for j in range(len(splits))]
    runs = [_runs(e) for e in spec.slice_extents]
    starts = [[0] + list(itertools.accumulate(int(x) for x in e)) for e in spec.slice_extents]
    spaces = np.array([[int(start) for start, _ in space] for space in spec.core_spaces], dtype=np.int64)
    sizes = np.array([[int(n) for _, n in space] for space in spec.core_spaces], dtype=np.int64)
    if len(splits) and not all((spaces[:, j] == np.array(starts[j])[slices[:, j]]).all() and
                               (sizes[:, j] == np.array([int(x) for x in spec.slice_extents[j]])[slices[:, j]]).all()
                               for j in range(len(splits))):
        runs = []  # the cores do not hold the slices in core_slices order: one piece per core
    out: list[tuple[list[str], list[str] | None, list[int] | None]] = []
    for combo in (itertools.product(*runs) if runs or not splits else ()):
        # the write of a split reduction: only the run holding slice 0 of each reduced symbol
        if is_write and any(s in reduced and run[0] != 0 for s, run in zip(syms, combo)):
            continue
        inside = np.ones(len(slices), dtype=bool)
        for j, (first, m, _, _) in enumerate(combo):
            inside &= (slices[:, j] >= first) & (slices[:, j] < first + m)
        cores = np.flatnonzero(inside & (writers if is_write else True))
        low, ext = None, None
        if box_lo is not None:
            base = box_lo[cores[0]]
            unit = []
            for j, (first, m, _, _) in enumerate(combo):
                nxt = [c for c in cores if slices[c, j] == slices[cores[0], j] + 1 and
                       all(slices[c, i] == slices[cores[0], i] for i in range(len(splits)) if i != j)]
                unit.append(box_lo[nxt[0]] - base if nxt else base * 0)
            rel = slices[cores] - slices[cores[0]]
            fit = base + rel @ np.array(unit).reshape(len(splits), -1) if unit else np.tile(base, (len(cores), 1))
            if not (fit == box_lo[cores]).all() or not (box_ext[cores] == box_ext[cores[0]]).all():
                out += _per_core(spec, syms, knames, pnames, is_write, reduced, slices, cores, box_lo, box_ext)
                continue
            k0 = slices[cores[0]]
            low = [" + ".join([str(int(base[d]))] + [f"{int(unit[j][d])} * ({knames[j]} - {int(k0[j])})"
                                                     for j in range(len(splits)) if int(unit[j][d])])
                   for d in range(len(base))]
            ext = [int(x) for x in box_ext[cores[0]]]
        cond = [f"c = {' + '.join(f'{st} * {k}' for st, k in zip(strides, knames)) or '0'}"]
        for j, s in enumerate(syms):
            k, p = knames[j], pnames[s]
            first, m, e, st = combo[j]
            if is_write and s in reduced:
                cond += [f"{k} = 0", f"{p} = 0"]
            else:
                cond += [f"{first} <= {k} < {first + m}",
                         f"{st} + {e} * ({k} - {first}) <= {p} < {st} + {e} * ({k} - {first}) + {e}"]
        out.append((cond, low, ext))
    if not runs and splits:
        out = _per_core(spec, syms, knames, pnames, is_write, reduced, slices,
                        np.flatnonzero(writers if is_write else np.ones(len(slices), dtype=bool)), box_lo, box_ext)
    return out


def _per_core(spec: OpSpec, syms, knames, pnames, is_write: bool, reduced, slices, cores, box_lo, box_ext):
    out: list[tuple[list[str], list[str] | None, list[int] | None]] = []
    for c in cores:
        cond = [f"c = {c}"] + [f"{k} = {int(v)}" for k, v in zip(knames, slices[c])]
        for s, (start, n) in zip(syms, spec.core_spaces[c]):
            if is_write and s in reduced:
                cond.append(f"{pnames[s]} = {start}")
            else:
                cond.append(f"{start} <= {pnames[s]} < {start + n}")
        if box_lo is None:
            out.append((cond, None, None))
        else:
            out.append((cond, [str(int(x)) for x in box_lo[c]], [int(x) for x in box_ext[c]]))
    return out


def _host_digit_coordinates(layout, hsyms) -> tuple | None:
    """The device coordinates of host element ``hsyms`` (one variable per host dim) in a
    stick layout: each device dim takes its host dim's digit -- the stick dim's outer
    occurrence the stick, its inner one the element in it -- as ``exact_coordinates`` does
    for a flat index, here without recovering the digits from it. None for a sparse layout."""
    dims = layout.dim_map
    if not dims or dims[-1] == -1:
        return None
    out, seen = [], set()
    for h in reversed(dims):  # inner occurrences first
        if h == -1 or layout.host_size[h] == 1:
            out.append(sympy.Integer(0))
        elif h == dims[-1]:
            eps = layout.elems_per_stick
            out.append(sympy.Mod(hsyms[h], eps) if h not in seen else sympy.floor(hsyms[h] / eps))
        else:
            out.append(hsyms[h])
        seen.add(h)
    return tuple(reversed(out))


def _kernel_access(arg: KernelArg, t: int, tensor_ids: dict[str, int]) -> Access:
    """The copy-in (a write before the body) or copy-out (a read after it) of a kernel argument:
    every host element at its stick layout."""
    fmt = formats.FORMATS[arg.device_dtype]
    nb, e = fmt.nbytes, fmt.elems_per_stick
    shape = list(arg.host_shape)
    hsyms = [sympy.Symbol(f"h{j}", integer=True, nonnegative=True) for j in range(len(shape))]
    names = {s: f"h{j}" for j, s in enumerate(hsyms)}
    if all(_fixed(n) for n in shape):
        shape = [int(n) for n in shape]
        layout = stick_layout(shape, e)
        coords = _host_digit_coordinates(layout, hsyms)
        if coords is None:
            index = sum((s * math.prod(shape[j + 1:]) for j, s in enumerate(hsyms)), sympy.Integer(0))
            coords = device_coordinates(layout, index, {s: n for s, n in zip(hsyms, shape)}) \
                if any(n > 1 for n in shape) else tuple(sympy.Integer(0) for _ in layout.device_size)
        size: tuple = layout.device_size
    else:
        # the stick layout of a host shape with a symbolic dim: sticks of the last dim
        # outermost, then the other dims in order, then the element in its stick
        last = hsyms[-1]
        coords = (sympy.floor(last / e), *hsyms[:-1], sympy.Mod(last, e))
        size = (sympy.ceiling(shape[-1] / e), *shape[:-1], e)
        if tuple(sympy.simplify(a - b) for a, b in zip(size, arg.device_size)) != (0,) * len(size) \
                or len(size) != len(arg.device_size):
            raise NotAffine(f"kernel argument {arg.name}: device size {list(arg.device_size)} is not the stick "
                            f"layout {list(size)} of its symbolic host shape")
    texts = tuple(isl_text(c, names) for c in coords)
    bounds = [(0, int(sympy.ceiling(sympy.Integer(shape[-1]) / e)) - 1) if _fixed(shape[-1]) else (None, None)] \
        if not all(_fixed(n) for n in shape) else []
    strides = row_major_strides(size)
    terms = []
    for d, (st, x) in enumerate(zip(strides, texts)):
        if bounds and d == 0:
            lo, hi = bounds[0]
        elif bounds and 0 < d < len(texts) - 1:
            n = shape[d - 1]
            lo, hi = (0, int(n) - 1) if _fixed(n) else (None, None)
        else:
            lo, hi = None, None
        terms.append((x, st, lo, hi))
    cond = [f"0 <= h{j} < {_size(n)}" for j, n in enumerate(shape)]
    pieces, piece_coords = [], []
    for extra, offset in _terms(terms, f"kernel argument {arg.name}"):
        elem = f"{nb} * ({offset})"
        pieces.append((" and ".join(cond + extra), "hbm", f"HBM[{_size(arg.address)} + {elem}]",
                       f"T{tensor_ids[arg.buffer]}[{elem}]"))
        piece_coords.append(texts)
    stmt = f"IN{t}" if arg.is_input else f"OUT{t}"
    return Access(stmt=stmt, t=t, spec=None, arg=arg, is_write=arg.is_input, dims=tuple(names.values()),
                  pieces=tuple(pieces), coords=tuple(piece_coords), memory="hbm", nbytes=nb, loops=0,
                  syms=tuple(hsyms), tensor=f"T{tensor_ids[arg.buffer]}", exprs=tuple(coords),
                  span=(int(arg.address), int(arg.address) + nb * math.prod(int(n) for n in arg.device_size))
                  if all(_fixed(v) for v in (arg.address, *arg.device_size)) else None)


def build_model(program: Program) -> Model:
    """Every access of ``program`` (raises NotAffine for what isl cannot hold)."""
    params, assumptions = _assumptions(program)
    tensor_ids: dict[str, int] = {}
    for k in program.kernel_args:
        tensor_ids.setdefault(k.buffer, len(tensor_ids))
    accesses: list[Access] = []
    schedule: list[tuple[str, str]] = []
    depth = _depth(program.body)
    width = 2 * depth + 1

    def sched(stmt: str, dims: Sequence[str], prefix: Sequence[str], phase: int) -> None:
        # loops and body positions (2 * depth + 1), then reads before writes; the instances of
        # one op instance (its cores and points) run at one time: they are parallel, and two
        # of them writing one element is a race the coverage property refutes by itself
        vec = list(prefix) + ["0"] * (width - len(prefix)) + [str(phase)]
        schedule.append((stmt, f"{stmt}[{', '.join(dims)}] -> [{', '.join(vec)}]"))

    ops = [0]

    def visit(body: tuple[Spec, ...], counts: tuple, path: tuple[int, ...]) -> None:
        for q, spec in enumerate(body):
            if isinstance(spec, LoopSpec):
                visit(spec.body, counts + (spec.count,), path + (q,))
                continue
            for arg in spec.args:
                tensor_ids.setdefault(arg.name, len(tensor_ids))
            t = ops[0]
            ops[0] += 1
            for acc in _op_accesses(program, spec, t, counts, path + (q,), tensor_ids):
                accesses.append(acc)
                prefix = [x for L, pos in enumerate(path + (q,))
                          for x in ([str(pos + 1)] + ([f"i{L}"] if L < len(counts) else []))]
                sched(acc.stmt, acc.dims, prefix, 1 if acc.is_write else 0)

    visit(program.body, (), ())
    for j, k in enumerate(program.kernel_args):
        acc = _kernel_access(k, j, tensor_ids)
        acc = replace(acc, path=(-1,) if k.is_input else (len(program.body),))
        accesses.append(acc)
        at = "0" if k.is_input else str(len(program.body) + 1)
        sched(acc.stmt, acc.dims, [at], 1 if k.is_input else 0)
    return Model(program=program, params=params, assumptions=assumptions, accesses=tuple(accesses),
                 schedule=tuple(schedule), tensor_ids=tensor_ids)


def _fixed(n: int | sympy.Expr) -> bool:
    return isinstance(n, int) or bool(getattr(n, "is_Integer", False))


def _depth(body: tuple[Spec, ...]) -> int:
    return max((1 + _depth(s.body) if isinstance(s, LoopSpec) else 0 for s in body), default=0)
