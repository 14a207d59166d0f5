"""Memory-safety check of a Program: overlapping live allocations, LX overflow, out-of-bounds
accesses, LX slices a consumer reads differently from how its producer wrote them, and reads
of never-written bytes.

The rules it checks against are the interpreter's, restated here as data so the ``allocate``
stage plans with the very same rules (whatever it puts in LX passes this check):

- **Core -> slice** (``core_slices``): the splits of an op's iteration space, first symbol
  fastest: ``slice[i] = (core // prod(splits[:i])) % splits[i]`` (the anchor's
  ``core_to_slice_mapping``).
- **LX box** (``coord_bounds`` / ``lx_box``): a core holds an LX tensor as the box spanned by
  its slice's device coordinates, row-major, whole sticks in the stick dim, at the tensor's
  LX address. A consumer finds the right bytes only if its slice spans the same box on that
  core as the producer's did.
- **Lifetime** (``live_intervals``): program time is the index of an op in program order,
  loop bodies included once. A buffer lives from its first use to its last; a use inside a
  loop that does not hold every use of the buffer stretches over that whole loop (the value
  crosses iterations); a buffer used only inside one loop body lives within one iteration.

A coordinate is a sum of terms; grouped so that no two groups share a variable, its min and
max over a core's box of the iteration grid is the sum of each group's min and max over the
box of that group's variables: exact, and linear in the iteration sizes when every group has
one variable (the stick rule's forms; the exact floor/Mod forms of odd views have more).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import sympy

from fspyre.errors import ExecutionError
from fspyre.ir.program import LoopSpec, OpSpec, Program, Spec, TensorArg
from fspyre.machine import formats
from fspyre.machine.formats import STICK_BYTES
from fspyre.machine.indexing import as_expr, compile_index
from fspyre.machine.layout import row_major_strides
from fspyre.machine.reference import open_grid

# -- the shared rules ---------------------------------------------------------------------------


def core_slices(splits: Sequence[int]) -> np.ndarray:
    """``[cores, len(splits)]``: the slice index of each core per symbol, first symbol fastest."""
    cores = math.prod(splits)
    c = np.arange(cores, dtype=np.int64)
    cols, stride = [], 1
    for s in splits:
        cols.append((c // stride) % s)
        stride *= s
    return np.stack(cols, axis=1) if cols else np.zeros((cores, 0), dtype=np.int64)


@lru_cache(maxsize=8192)
def coord_terms(expr: sympy.Expr) -> tuple[int, tuple[tuple[tuple[sympy.Symbol, ...], sympy.Expr], ...]]:
    """A coordinate as ``const + sum(group)``: its terms grouped so that no two groups share a
    variable (``floor(c1/64) + Mod(c2, 4)`` has two groups; ``floor((2*P1 + P2)/64)`` one of
    two variables). Over a box of the iteration grid, each group ranges independently."""
    const = 0
    groups: list[tuple[frozenset, sympy.Expr]] = []
    for term in sympy.Add.make_args(as_expr(expr, "coord_terms")):
        free = frozenset(term.free_symbols)
        if not free:
            const += int(term)
            continue
        joined = [g for g in groups if g[0] & free]
        for g in joined:
            groups.remove(g)
        groups.append((free.union(*(g[0] for g in joined)), sympy.Add(term, *(g[1] for g in joined))))
    return const, tuple((tuple(sorted(v, key=str)), e) for v, e in groups)


@lru_cache(maxsize=8192)
def term_extremes(term: sympy.Expr, syms: tuple[sympy.Symbol, ...], sizes: tuple[int, ...],
                  splits: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Min and max of ``term`` over each slice block: arrays of shape ``splits`` (block
    ``(k1, k2, ...)`` holds ``syms[i]`` in ``[k_i * n_i, (k_i + 1) * n_i)``, ``n_i = sizes[i] // splits[i]``).
    Evaluated on the whole grid of the term's own variables."""
    grid = open_grid(list(sizes))
    vals = np.broadcast_to(np.asarray(compile_index(term, syms)(*grid)), sizes)
    blocks = [x for s, n in zip(splits, sizes) for x in (s, n // s)]
    vals = vals.reshape(blocks)
    inner = tuple(range(1, len(blocks), 2))
    return vals.min(axis=inner), vals.max(axis=inner)


def coord_bounds(coords: Sequence[sympy.Expr], syms: Sequence[sympy.Symbol], sizes: Sequence[int],
                 splits: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """``lows, highs`` of shape ``[cores, len(coords)]``: each device coordinate's min and max
    over each core's slice of the iteration grid (``sizes`` are whole per-tile sizes)."""
    slices = core_slices(splits)
    pos = {s: i for i, s in enumerate(syms)}
    lows = np.zeros((len(slices), len(coords)), dtype=np.int64)
    highs = np.zeros_like(lows)
    for d, expr in enumerate(coords):
        const, groups = coord_terms(expr)
        lows[:, d] = highs[:, d] = const
        for group_syms, term in groups:
            missing = [str(v) for v in group_syms if v not in pos]
            if missing:
                raise ExecutionError(
                    f"device coordinate {expr} uses {missing}, which are not among {list(map(str, syms))}"
                )
            idx = [pos[v] for v in group_syms]
            lo, hi = term_extremes(term, group_syms, tuple(int(sizes[i]) for i in idx),
                                   tuple(int(splits[i]) for i in idx))
            at = tuple(slices[:, i] for i in idx)
            lows[:, d] += lo[at]
            highs[:, d] += hi[at]
    return lows, highs


def lx_box(lows: np.ndarray, highs: np.ndarray, device_size: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """The interpreter's LX box per core: (lows, extents), the stick dim whole."""
    lows = lows.copy()
    ext = highs - lows + 1
    lows[:, -1] = 0
    ext[:, -1] = device_size[-1]
    return lows, ext


def box_bytes(extents: np.ndarray, elem_bytes: int) -> np.ndarray:
    return np.prod(extents, axis=1) * elem_bytes


def tensor_bytes(device_size: Sequence[int]) -> int:
    """Device bytes of a whole tensor, padded sticks included."""
    return math.prod(device_size[:-1]) * STICK_BYTES


def writing_cores(splits: Sequence[int], reduced: Sequence[bool]) -> np.ndarray:
    """Cores that store an op's result: with a split reduction only the core holding slice 0
    of every reduced symbol writes the combined value (the interpreter's rule)."""
    slices = core_slices(splits)
    red = [i for i, r in enumerate(reduced) if r]
    if not red:
        return np.ones(len(slices), dtype=bool)
    return np.all(slices[:, red] == 0, axis=1)


def reduced_symbols(spec: OpSpec) -> set[sympy.Symbol]:
    reduced = spec.op_info.get("reduced", ()) if spec.is_reduction else ()
    assert isinstance(reduced, tuple)
    return set(reduced)


def live_intervals(uses: Mapping[str, Sequence[tuple[int, tuple[int, ...]]]],
                   loop_spans: Mapping[int, tuple[int, int]]) -> dict[str, tuple[int, int]]:
    """``[start, end)`` per buffer from its uses ``(time, enclosing loop ids outermost first)``."""
    out = {}
    for name, us in uses.items():
        if not us:
            continue
        chains = [c for _, c in us]
        common = 0
        while all(len(c) > common for c in chains) and len({c[common] for c in chains}) == 1:
            common += 1
        lo, hi = math.inf, -math.inf
        for t, chain in us:
            if len(chain) > common:
                s, e = loop_spans[chain[common]]
            else:
                s, e = t, t + 1
            lo, hi = min(lo, s), max(hi, e)
        out[name] = (int(lo), int(hi))
    return out


# -- the report --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryIssue:
    """One finding. ``kind``: overlap | lx_overflow | out_of_bounds | lx_slice_mismatch |
    unwritten_read | execution. ``core`` is -1 for HBM."""

    kind: str
    op: str
    tensor: str
    core: int
    memory: str
    address: int
    message: str

    def __str__(self) -> str:
        where = f"{self.memory}" + (f" core {self.core}" if self.core >= 0 else "")
        return f"[{self.kind}] op {self.op} tensor {self.tensor} {where} address {self.address:#x}: {self.message}"


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryReport:
    program: str
    issues: tuple[MemoryIssue, ...]
    lx_high_water: tuple[int, ...]  # per core: highest LX byte used + 1
    hbm_bytes: int

    @property
    def clean(self) -> bool:
        return not self.issues

    def __str__(self) -> str:
        peak = max(self.lx_high_water, default=0)
        head = (f"memory check {self.program}: {'CLEAN' if self.clean else f'{len(self.issues)} issue(s)'} "
                f"(HBM {self.hbm_bytes} B, LX high water {peak} B per core)")
        return "\n".join([head] + [f"  {i}" for i in self.issues])


@dataclass(frozen=True, slots=True, kw_only=True)
class _Access:
    time: int
    spec: OpSpec
    arg: TensorArg
    is_write: bool
    cores: np.ndarray  # bool per core of the op: does this core perform the access
    lows: np.ndarray
    highs: np.ndarray
    counts: tuple[int, ...]


def program_timeline(program: Program) -> tuple[list[tuple[int, OpSpec, tuple[int, ...], tuple[int, ...]]],
                                                dict[int, tuple[int, int]]]:
    """``(time, spec, loop ids, loop counts)`` per op in program order, and each loop's span."""
    ops: list[tuple[int, OpSpec, tuple[int, ...], tuple[int, ...]]] = []
    spans: dict[int, tuple[int, int]] = {}

    def visit(body: tuple[Spec, ...], chain: tuple[int, ...], counts: tuple[int, ...]) -> None:
        for spec in body:
            if isinstance(spec, LoopSpec):
                lid, start = len(spans), len(ops)
                spans[lid] = (start, start)
                visit(spec.body, chain + (lid,), counts + (spec.count,))
                spans[lid] = (start, len(ops))
            else:
                ops.append((len(ops), spec, chain, counts))

    visit(program.body, (), ())
    return ops, spans


def program_accesses(program: Program) -> tuple[list[_Access], dict[str, tuple[int, int]], int]:
    """Every tensor access of the program with its per-core coordinate bounds, the lifetime
    of every tensor, and the number of ops (program time runs over ``range(n)``)."""
    ops, spans = program_timeline(program)
    accesses: list[_Access] = []
    uses: dict[str, list[tuple[int, tuple[int, ...]]]] = {}
    for t, spec, chain, counts in ops:
        syms = list(spec.iteration_space)
        sizes = [s for s, _ in spec.iteration_space.values()]
        splits = [p for _, p in spec.iteration_space.values()]
        reduced = reduced_symbols(spec)
        writers = writing_cores(splits, [s in reduced for s in syms])
        for k, arg in enumerate(spec.args):
            is_write = k == len(spec.args) - 1
            lows, highs = coord_bounds(arg.device_coordinates, syms, sizes, splits)
            accesses.append(_Access(time=t, spec=spec, arg=arg, is_write=is_write,
                                    cores=writers if is_write else np.ones(len(writers), dtype=bool),
                                    lows=lows, highs=highs, counts=counts))
            uses.setdefault(arg.name, []).append((t, chain))
    return accesses, live_intervals(uses, spans), len(ops)


def _name(spec: OpSpec) -> str:
    return spec.name or spec.op


def check_memory(program: Program, *, run: bool = False, inputs: Mapping[str, object] | None = None,
                 seed: int = 0) -> MemoryReport:
    """Check every allocation and access of ``program`` statically; with ``run=True`` also run
    the interpreter (random inputs unless given) and report its first ExecutionError, which
    catches reads of never-written bytes the static rules cannot see."""
    accesses, live, nops = program_accesses(program)
    issues: list[MemoryIssue] = []
    whole = (0, max(nops, 1))
    kernel_inputs = {a.buffer for a in program.kernel_args if a.is_input}
    for a in program.kernel_args:
        live[a.buffer] = whole  # arguments exist for the whole kernel

    def issue(kind: str, acc: _Access, core: int, address: int, message: str) -> None:
        issues.append(MemoryIssue(kind=kind, op=_name(acc.spec), tensor=acc.arg.name, core=core,
                                  memory=acc.arg.memory, address=int(address), message=message))

    by_tensor: dict[str, list[_Access]] = {}
    for acc in accesses:
        by_tensor.setdefault(acc.arg.name, []).append(acc)
    lx_bytes: dict[str, np.ndarray] = {}  # LX tensor -> per-core footprint (0 where unused)
    where: dict[str, tuple[str, int, int]] = {}  # tensor -> (memory, address, device bytes)

    for name, accs in by_tensor.items():
        first = accs[0].arg
        where[name] = (first.memory, first.address, tensor_bytes(first.device_size))
        for acc in accs:
            arg = acc.arg
            if (arg.memory, arg.address) != (first.memory, first.address):
                issue("overlap", acc, -1, arg.address,
                      f"placed at {arg.memory} {arg.address:#x} here but at {first.memory} {first.address:#x} "
                      f"in op {_name(accs[0].spec)}; every access of a tensor must use one allocation")
            _check_bounds(program, acc, issue, lx_bytes)
        _check_dataflow(name, accs, name in kernel_inputs, issue)

    issues += _overlaps(accesses, live, where, lx_bytes)
    if run:
        issues += _run(program, inputs, seed)
    high = np.zeros(program.cores, dtype=np.int64)
    for name, per_core in lx_bytes.items():
        used = per_core > 0
        high[used] = np.maximum(high[used], where[name][1] + per_core[used])
    return MemoryReport(program=program.name, issues=tuple(issues), lx_high_water=tuple(int(h) for h in high),
                        hbm_bytes=program.hbm_bytes)


def _check_bounds(program: Program, acc: _Access, issue, lx_bytes: dict[str, np.ndarray]) -> None:
    arg = acc.arg
    size = np.array(arg.device_size, dtype=np.int64)
    cores = np.nonzero(acc.cores)[0]
    bad = np.nonzero(np.any((acc.lows[cores] < 0) | (acc.highs[cores] >= size), axis=1))[0]
    if len(bad):
        c = int(cores[bad[0]])
        issue("out_of_bounds", acc, c, arg.address,
              f"device coordinates span {acc.lows[c].tolist()}..{acc.highs[c].tolist()} outside device size "
              f"{list(arg.device_size)}")
        return
    elem = formats.FORMATS[arg.device_dtype].nbytes
    if arg.memory == "hbm":
        strides = np.array(row_major_strides(arg.device_size), dtype=np.int64)
        lo = int((acc.lows[cores] @ strides).min()) * elem
        hi = int((acc.highs[cores] @ strides).max()) * elem + elem
        moves = [(n - 1) * a for n, a in zip(acc.counts, arg.tile_advance)]
        lo += sum(m for m in moves if m < 0)
        hi += sum(m for m in moves if m > 0)
        end = arg.address + tensor_bytes(arg.device_size)
        if lo < 0 or arg.address + hi > end:
            issue("out_of_bounds", acc, -1, arg.address + hi - elem,
                  f"accesses bytes [{arg.address + lo:#x}, {arg.address + hi:#x}) over all loop iterations, outside "
                  f"its allocation [{arg.address:#x}, {end:#x}); check tile_advance {list(arg.tile_advance)}")
        elif end > program.hbm_bytes:
            issue("out_of_bounds", acc, -1, arg.address,
                  f"allocation [{arg.address:#x}, {end:#x}) ends past HBM ({program.hbm_bytes} bytes)")
        return
    _, ext = lx_box(acc.lows, acc.highs, arg.device_size)
    nbytes = box_bytes(ext, elem) * acc.cores
    have = lx_bytes.setdefault(arg.name, np.zeros(program.cores, dtype=np.int64))
    n = min(len(nbytes), program.cores)
    have[:n] = np.maximum(have[:n], nbytes[:n])
    over = np.nonzero(arg.address + nbytes > program.lx_bytes)[0]
    if len(over):
        c = int(over[0])
        issue("lx_overflow", acc, c, arg.address,
              f"needs {int(nbytes[c])} bytes at LX {arg.address:#x} on core {c}, past the {program.lx_bytes}-byte LX")


def _check_dataflow(name: str, accs: list[_Access], is_input: bool, issue) -> None:
    """Reads follow a write (or the tensor is a kernel input). In LX every access after the
    first write must use, on each of its cores, the box the latest earlier write left there."""
    writes = [a for a in accs if a.is_write]
    for acc in accs:
        before = [w for w in writes if w.time < acc.time]
        if not acc.is_write and not before and not is_input:
            issue("unwritten_read", acc, -1, acc.arg.address,
                  "reads a tensor no earlier op writes and that is not a kernel input")
            continue
        if acc.arg.memory != "lx" or not before:
            continue
        w = before[-1]
        wl, we = lx_box(w.lows, w.highs, w.arg.device_size)
        rl, re_ = lx_box(acc.lows, acc.highs, acc.arg.device_size)
        verb = "writes" if acc.is_write else "reads"
        for core in np.nonzero(acc.cores)[0]:
            c = int(core)
            if c >= len(w.cores) or not w.cores[c]:
                if acc.is_write:
                    continue  # a later writer may cover more cores
                issue("lx_slice_mismatch", acc, c, acc.arg.address,
                      f"core {c} reads its LX copy, but op {_name(w.spec)} ({w.spec.cores} cores) never "
                      f"wrote it on core {c}; split both ops the same way or keep {name} in HBM")
                return
            if not (np.array_equal(wl[c], rl[c]) and np.array_equal(we[c], re_[c])):
                issue("lx_slice_mismatch", acc, c, acc.arg.address,
                      f"core {c} {verb} the LX box at {rl[c].tolist()} extent {re_[c].tolist()}, but op "
                      f"{_name(w.spec)} wrote the box at {wl[c].tolist()} extent {we[c].tolist()} there; split "
                      f"both ops the same way or keep {name} in HBM")
                return


def _in_place(a: str, b: str, live: Mapping[str, tuple[int, int]], accesses_at: Mapping[int, list[_Access]],
              where: Mapping[str, tuple[str, int, int]]) -> bool:
    """``b`` takes over ``a``'s slot at ``a``'s last use: one op reads ``a`` there, element for
    element where it writes ``b``, and nothing else of the two lives at once."""
    ea, sb = live[a][1], live[b][0]
    if ea != sb + 1 or where[a][1] != where[b][1]:
        return False
    accs = accesses_at.get(sb, [])
    store = [x for x in accs if x.is_write and x.arg.name == b]
    loads = [x for x in accs if not x.is_write and x.arg.name == a]
    if not store or not loads:
        return False
    s = store[0].arg
    return all(x.arg.device_coordinates == s.device_coordinates and x.arg.device_size == s.device_size
               for x in loads)


def _overlaps(accesses: list[_Access], live: Mapping[str, tuple[int, int]],
              where: Mapping[str, tuple[str, int, int]], lx_bytes: Mapping[str, np.ndarray]) -> list[MemoryIssue]:
    accesses_at: dict[int, list[_Access]] = {}
    for acc in accesses:
        accesses_at.setdefault(acc.time, []).append(acc)
    spaces: dict[int, list[tuple[int, int, str]]] = {-1: []}  # core (-1 = HBM) -> (lo, hi, name)
    for name, (mem, addr, nbytes) in where.items():
        if mem == "hbm":
            spaces[-1].append((addr, addr + nbytes, name))
        else:
            for c, n in enumerate(lx_bytes.get(name, ())):
                if n:
                    spaces.setdefault(c, []).append((addr, addr + int(n), name))
    out, checked = [], set()
    for core, items in spaces.items():
        key = tuple(sorted(items))
        if core >= 0 and key in checked:
            continue  # a core laid out like one already checked has the same overlaps
        checked.add(key)
        # Sweep in time: each buffer is compared only with the buffers alive when it is born.
        alive: list[tuple[int, int, str]] = []
        for lo, hi, b in sorted(items, key=lambda x: live[x[2]][0]):
            sb, eb = live[b]
            alive = [x for x in alive if live[x[2]][1] > sb]
            for lo2, hi2, a in alive:
                if lo2 >= hi or lo >= hi2:
                    continue
                if core >= 0 and (_in_place(a, b, live, accesses_at, where)
                                  or _in_place(b, a, live, accesses_at, where)):
                    continue
                op = next((_name(x.spec) for x in accesses_at.get(sb, []) if x.arg.name == b), "?")
                mem = "HBM" if core < 0 else "LX"
                out.append(MemoryIssue(
                    kind="overlap", op=op, tensor=b, core=core, memory=mem.lower(), address=max(lo, lo2),
                    message=f"{b} [{lo:#x}, {hi:#x}) live {list(live[b])} overlaps {a} [{lo2:#x}, {hi2:#x}) live "
                            f"{list(live[a])} in {mem}" + (f" on core {core}" if core >= 0 else "")))
            alive.append((lo, hi, b))
    return out


_WHAT = re.compile(r"op (\S+) tensor (\S+) core (\d+)")
_ADDR = re.compile(r"address (0x[0-9a-f]+)")


def _run(program: Program, inputs: Mapping[str, object] | None, seed: int) -> list[MemoryIssue]:
    from fspyre.ir.graph import Dim, TensorType
    from fspyre.machine.hostio import random_inputs
    from fspyre.machine.interpreter import run_program

    if inputs is None:
        types = {a.name: TensorType(dims=tuple(Dim(f"h{i}", s) for i, s in enumerate(a.host_shape)), dtype=a.dtype)
                 for a in program.kernel_args if a.is_input}
        inputs = random_inputs(types, seed)
    try:
        run_program(program, inputs)
    except ExecutionError as err:
        text = str(err)
        m, addr = _WHAT.search(text), _ADDR.search(text)
        memory = "lx" if " LX" in text else "hbm"
        return [MemoryIssue(kind="execution", op=m.group(1) if m else "?", tensor=m.group(2) if m else "?",
                            core=int(m.group(3)) if m else -1, memory=memory,
                            address=int(addr.group(1), 16) if addr else 0, message=text)]
    return []
