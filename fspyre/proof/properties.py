"""The three properties of a program's model (``fspyre.proof.sets``), each proved over all
instances with isl or refuted with a sampled counterexample (docs/proof.md)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from fractions import Fraction

import islpy as isl
import sympy

from fspyre.ir.graph import POINTWISE_FNS, Graph
from fspyre.ir.program import op_fn
from fspyre.machine import formats
from fspyre.machine.rules import row_major_strides
from fspyre.proof.artifact import Counterexample, PropertyResult
from fspyre.proof.sets import CTX, Access, Model


def _values(point: isl.Point, kind: isl.dim_type, n: int) -> list[int]:
    return [int(point.get_coordinate_val(kind, j).to_python()) for j in range(n)]


def counterexample(model: Model, points: isl.UnionSet) -> Counterexample:
    """A concrete instance of ``points`` (a union set of access instances), with the address
    it touches."""
    one = points.sample_point()
    stmt = one.get_space().get_tuple_name(isl.dim_type.set)
    acc = next(a for a in model.accesses if a.stmt == stmt)
    vals = _values(one, isl.dim_type.set, len(acc.dims))
    params = _values(one, isl.dim_type.param, len(model.params))
    # the address: the access map at that instance
    fixed = isl.Set.from_point(one)
    cells = model.access(acc, "cell").intersect_domain(isl.UnionSet.from_set(fixed))
    address, memory = -1, acc.memory
    if not cells.is_empty():
        cell = cells.range().sample_point()
        n = cell.get_space().dim(isl.dim_type.set)
        address = _values(cell, isl.dim_type.set, n)[-1]
    loops = tuple(vals[:acc.loops])
    if acc.spec is None:  # copy-in / copy-out: host index, no core
        core, point = -1, tuple(vals)
        op = f"copy-{'in' if acc.is_write else 'out'}"
    else:
        core, point = vals[acc.loops], tuple(vals[acc.loops + 1 + len(acc.syms):])
        op = acc.spec.name or acc.spec.op
    dims = [d.name for d in model.program.symbolic.dims] if model.program.symbolic is not None else []
    sizes = tuple((d, v) for d, v in zip(dims, params))
    return Counterexample(op=op, tensor=acc.arg.name, iteration=loops, core=core, point=point, memory=memory,
                          address=address, sizes=sizes)


def access_map(model: Model, accesses: Iterable[Access], target: str, bytewise: bool = False) -> isl.UnionMap:
    """Instances -> memory cells (``target="cell"``) or tensor elements (``"elem"``): the
    first byte of each element, or all its bytes (``bytewise``)."""
    out = model.empty_map()
    for acc in accesses:
        out = out.union(model.access(acc, target, bytewise))
    return out


def _violations(model: Model, acc: Access, checks) -> tuple[str, isl.UnionSet] | None:
    """The first of ``checks`` (``(why, where)``, ``where(piece_index, address)`` an isl
    condition) some instance of ``acc`` meets, with those instances; None when none does.
    All the checks are asked at once first: a program that keeps them all pays one question."""
    def bad(selected) -> isl.UnionSet | None:
        parts = []
        for j, (cond, _, cell, _) in enumerate(acc.pieces):
            address = cell[cell.index("[") + 1:-1].split(", ", 1)[-1] if acc.memory == "lx" else cell[4:-1]
            wheres = [w for w in (where(j, address) for _, where in selected) if w]
            if wheres:
                parts.append(f"{acc.head()} : {cond} and ({' or '.join(f'({w})' for w in wheres)})")
        out = None
        for p in parts:
            one = isl.UnionSet.read_from_str(CTX, model.space(p))
            out = one if out is None else out.union(one)
        return None if out is None or out.is_empty() else out

    if bad(checks) is None:
        return None
    for why, where in checks:
        found = bad([(why, where)])
        if found is not None:
            return why, found
    return None  # pragma: no cover -- the union of the checks was not empty, so one of them is not


def memory_safety(model: Model) -> PropertyResult:
    """Every access of every op, over all iterations and cores, stays inside its device dims,
    its own allocation (HBM: the tensor's bytes, inside the kernel argument its ``arg_index``
    names or outside every argument; LX: the core's LX) and is element-aligned."""
    program = model.program
    regions = {}
    for k in program.kernel_args:
        regions[k.arg_index] = (_t(k.address), f"{_t(k.address)} + {_bytes(k)}")
    checked = 0
    for acc in model.accesses:
        arg = acc.arg
        broken = _malformed(acc, program)
        if broken:
            found = _violations(model, acc, [(broken, lambda j, a: "0 = 0")])
            assert found is not None
            return PropertyResult(name="memory_safety", verdict="refuted", reason=broken,
                                  counterexample=counterexample(model, found[1]))
        nb = acc.nbytes
        checks: list[tuple[str, Callable[..., str]]] = []
        for d, size in enumerate(arg.device_size):
            checks.append((f"device coordinate {d} leaves its device size {size}",
                           lambda j, a, d=d, size=size: f"{acc.coords[j][d]} < 0 or {acc.coords[j][d]} >= {_t(size)}"))
        checks.append((f"an element address is not aligned to {nb} bytes",
                       lambda j, a: f"({a}) mod {nb} > 0"))
        if acc.memory == "hbm":
            own = f"{_t(arg.address)} + {_bytes(arg)}"
            checks.append((f"leaves its allocation [{arg.address}, {own})",
                           lambda j, a: f"{a} < {_t(arg.address)} or {a} + {nb} > {own}"))
            checks.append((f"leaves HBM ({program.hbm_bytes} bytes)",
                           lambda j, a: f"{a} < 0 or {a} + {nb} > {_t(program.hbm_bytes)}"))
            if arg.arg_index >= 0:
                lo, hi = regions.get(arg.arg_index, ("0", "0"))
                checks.append((f"leaves kernel argument {arg.arg_index}, which its arg_index names",
                               lambda j, a: f"{a} < {lo} or {a} + {nb} > {hi}"))
            else:
                for index, (lo, hi) in regions.items():
                    checks.append((f"an intermediate reaches into kernel argument {index}",
                                   lambda j, a, lo=lo, hi=hi: f"{a} + {nb} > {lo} and {a} < {hi}"))
        else:
            checks.append((f"leaves the core's LX ({program.lx_bytes} bytes)",
                           lambda j, a: f"{a} < 0 or {a} + {nb} > {_t(program.lx_bytes)}"))
        checked += len(checks)
        if _inside(model, acc, checks):
            continue
        found = _violations(model, acc, checks)
        if found is not None:
            why, bad = found
            ce = counterexample(model, bad)
            return PropertyResult(name="memory_safety", verdict="refuted",
                                  reason=f"op {ce.op} tensor {arg.name}: {why}", counterexample=ce)
    return PropertyResult(name="memory_safety", verdict="proved",
                          reason=f"{len(model.accesses)} accesses ({checked} conditions) inside their device dims, "
                                 f"allocations and memories, aligned, over every iteration and core")


def _inside(model: Model, acc: Access, checks) -> bool:
    """The usual answer to ``checks``, cheaper: the image of the instances (device coordinates,
    byte addresses) inside the box the checks describe. False: the checks decide."""
    if len(acc.pieces) != 1:
        return False
    fast = _inside_by_intervals(model, acc)
    if fast == "all":
        return True
    # the device coordinates over a box of points holding every core's (a superset of the
    # instances: enough to show them inside, never to refute)
    coords = acc.coords[0]
    if acc.spec is None:
        points = [f"h{j}" for j in range(len(acc.syms))]
        spans = [f"0 <= h{j} < {_t(n)}" for j, n in enumerate(acc.arg.host_shape)]
    else:
        points = [f"p{j}" for j in range(len(acc.syms))]
        spans = [f"{min(int(sp[j][0]) for sp in acc.spec.core_spaces)} <= p{j} < "
                 f"{max(int(sp[j][0]) + int(sp[j][1]) for sp in acc.spec.core_spaces)}" for j in range(len(points))]
    xs = [f"x{d}" for d in range(len(coords))]
    box = " and ".join(f"0 <= x{d} < {_t(n)}" for d, n in enumerate(acc.arg.device_size)) or "0 = 0"
    if fast != "coordinates":
        image = isl.UnionMap.read_from_str(CTX, model.space(
            f"[{', '.join(points)}] -> [{', '.join(coords)}]" + (f" : {' and '.join(spans)}" if spans else ""))).range()
        if not image.is_subset(isl.UnionSet.read_from_str(CTX, model.space(f"[{', '.join(xs)}] : {box}"))):
            return False
    # the address checks (every one after the device coordinates'), as one set of allowed cells
    name, per_core = ("LX", "c, ") if acc.memory == "lx" else ("HBM", "")
    allowed = " and ".join(f"not ({where(0, 'a')})" for why, where in checks
                           if not why.startswith("device coordinate"))
    return model.access(acc, "cell").range().is_subset(isl.UnionSet.read_from_str(
        CTX, model.space(f"{name}[{per_core}a] : {allowed}")))


def _interval(e, ranges: dict) -> tuple[Fraction, Fraction] | None:
    """Bounds of a quasi-affine expression over ``ranges`` (symbol -> (low, high)) by interval
    arithmetic: never narrower than the truth; None for a form it does not know."""
    if isinstance(e, int):
        return Fraction(e), Fraction(e)
    if e.is_Rational:
        v = Fraction(int(e.p), int(e.q))
        return v, v
    if e.is_Symbol:
        return ranges.get(e)
    if e.is_Add:
        parts = [_interval(a, ranges) for a in e.args]
        if any(x is None for x in parts):
            return None
        return sum((x[0] for x in parts if x), Fraction(0)), sum((x[1] for x in parts if x), Fraction(0))
    if e.is_Mul:
        coeff, rest = e.as_coeff_Mul()
        inner = _interval(rest, ranges) if coeff.is_Rational and rest != e else None
        if inner is None:
            return None
        scale = Fraction(int(coeff.p), int(coeff.q))
        return (scale * inner[0], scale * inner[1]) if scale >= 0 else (scale * inner[1], scale * inner[0])
    if isinstance(e, sympy.floor):
        inner = _interval(e.args[0], ranges)
        return None if inner is None else (Fraction(math.floor(inner[0])), Fraction(math.floor(inner[1])))
    if isinstance(e, sympy.Mod) and e.args[1].is_Integer and int(e.args[1]) > 0:
        k = int(e.args[1])
        within = _interval(e.args[0], ranges)
        if within is not None and 0 <= within[0] and within[1] < k:
            return within
        return Fraction(0), Fraction(k - 1)  # an integer's remainder
    return None


def _inside_by_intervals(model: Model, acc: Access) -> str:
    """Memory safety of ``acc`` by interval arithmetic where it suffices: "all" (coordinates
    and HBM addresses shown inside), "coordinates" (the coordinates only), or "" (isl
    decides). Intervals are never narrower than the truth, so this proves, never refutes."""
    arg = acc.arg
    if acc.spec is None:
        shape = arg.host_shape
        if not all(isinstance(n, int) or getattr(n, "is_Integer", False) for n in shape):
            return ""
        ranges = {s: (Fraction(0), Fraction(int(n) - 1)) for s, n in zip(acc.syms, shape)}
    else:
        ranges = {s: (Fraction(min(int(sp[j][0]) for sp in acc.spec.core_spaces)),
                      Fraction(max(int(sp[j][0]) + int(sp[j][1]) for sp in acc.spec.core_spaces) - 1))
                  for j, s in enumerate(acc.syms)}
    sizes = arg.device_size
    bounds = [_interval(e, ranges) for e in acc.exprs]
    if len(bounds) != len(sizes) or not all(
            b is not None and (isinstance(n, int) or getattr(n, "is_Integer", False)) and 0 <= b[0] and b[1] < int(n)
            for b, n in zip(bounds, sizes)):
        return ""
    program, nb = model.program, acc.nbytes
    values = [arg.address, program.hbm_bytes, *acc.counts, *getattr(arg, "tile_advance", ())]
    if acc.memory != "hbm" or not all(isinstance(v, int) or getattr(v, "is_Integer", False) for v in values):
        return "coordinates"
    strides = row_major_strides([int(n) for n in sizes])
    moves = [int(a) * (int(n) - 1) for a, n in zip(getattr(arg, "tile_advance", ()), acc.counts)]
    base = int(arg.address)
    low = base + nb * sum(st * b[0] for st, b in zip(strides, bounds) if b) + sum(min(0, m) for m in moves)
    high = base + nb * sum(st * b[1] for st, b in zip(strides, bounds) if b) + sum(max(0, m) for m in moves) + nb
    if base % nb or any(int(a) % nb for a in getattr(arg, "tile_advance", ())):
        return "coordinates"
    if low < base or high > base + nb * math.prod(int(n) for n in sizes) or low < 0 or high > int(program.hbm_bytes):
        return "coordinates"
    for k in program.kernel_args:
        if not all(isinstance(v, int) or getattr(v, "is_Integer", False) for v in (k.address, *k.device_size)):
            return "coordinates"
        lo = int(k.address)
        hi = lo + formats.FORMATS[k.device_dtype].nbytes * math.prod(int(n) for n in k.device_size)
        if k.arg_index == arg.arg_index and not (lo <= low and high <= hi):
            return "coordinates"
        if arg.arg_index < 0 and low < hi and lo < high:
            return "coordinates"
    if arg.arg_index >= 0 and not any(k.arg_index == arg.arg_index for k in program.kernel_args):
        return "coordinates"
    return "all"


def _malformed(acc: Access, program) -> str:
    """What makes the interpreter refuse an access before any address (its direction, where a
    kernel argument lives, its layout, the cores): '' when nothing does."""
    from fspyre.machine.layout import stick_layout

    arg, spec = acc.arg, acc.spec
    if spec is None and all(isinstance(n, int) for n in arg.host_shape):
        fmt = formats.FORMATS[arg.device_dtype]
        layout = stick_layout([int(n) for n in arg.host_shape], fmt.elems_per_stick)
        if layout.device_size != tuple(arg.device_size) or tuple(layout.stride_map) != tuple(arg.stride_map):
            return (f"kernel argument {arg.name}: device size {list(arg.device_size)} / stride map "
                    f"{list(arg.stride_map)} are not the stick layout of host shape {list(arg.host_shape)}")
        return ""
    if spec is None:
        return ""
    name = spec.name or spec.op
    if spec.cores > program.cores:
        return f"op {name} runs on {spec.cores} cores, the program has {program.cores}"
    if arg.is_input == acc.is_write:
        return (f"op {name} tensor {arg.name}: is_input is {arg.is_input}, but an op reads every arg but the last "
                f"and writes the last")
    if spec.runs != "every" and arg.tile_advance and arg.tile_advance[-1] != 0:
        return (f"op {name} runs only in the {spec.runs} iteration of its innermost loop, but tensor {arg.name} "
                f"advances {arg.tile_advance[-1]} bytes per iteration there")
    if acc.is_write and op_fn(spec.op) in POINTWISE_FNS:
        used = {x.name for c in arg.device_coordinates for x in getattr(c, "free_symbols", ())}
        spread = [s for s, (n, k) in spec.iteration_space.items() if s.name not in used and n != k]
        if spread:
            return (f"op {name}: symbol {spread[0]} is not in its output's coordinates, so every one of its points "
                    f"writes the same elements")
    if arg.memory == "lx" and arg.arg_index >= 0:
        return f"op {name} tensor {arg.name}: an LX tensor cannot be kernel argument {arg.arg_index}"
    if arg.arg_index >= 0 and not any(k.arg_index == arg.arg_index for k in program.kernel_args):
        return f"op {name} tensor {arg.name}: arg_index {arg.arg_index} names no kernel argument"
    return ""


def _t(v) -> str:
    from fspyre.proof.sets import isl_text

    return isl_text(v, {})


def _bytes(arg) -> str:
    """A tensor's device bytes as isl text (at most one factor symbolic: else not affine)."""
    import sympy

    return _t(sympy.expand(sympy.Mul(formats.FORMATS[arg.device_dtype].nbytes, *arg.device_size)))


def schedule(model: Model, accesses: Iterable[Access] | None = None) -> isl.UnionMap:
    stmts = None if accesses is None else {a.stmt for a in accesses}
    return model.union_map([text for stmt, text in model.schedule if stmts is None or stmt in stmts])


def _compute_flow(model: Model, accesses: list[Access], target: str,
                  bytewise: bool) -> tuple[isl.UnionMap, isl.UnionSet]:
    """isl's last-writer analysis over ``accesses`` (program order): (last writer -> read,
    reads with no writer)."""
    reads = access_map(model, [a for a in accesses if not a.is_write], target, bytewise)
    writes = access_map(model, [a for a in accesses if a.is_write], target, bytewise)
    info = isl.UnionAccessInfo.from_sink(reads).set_must_source(writes).set_schedule_map(schedule(model, accesses))
    flow = info.compute_flow()
    return flow.get_must_dependence(), flow.get_must_no_source().domain()


def _shared_loops(w: Access, r: Access) -> int:
    m = 0
    while m < min(w.loops, r.loops) and w.path[m] == r.path[m]:
        m += 1
    return m


def _same_iteration(model: Model, w: Access, r: Access) -> isl.UnionMap | None:
    """The last writer of every element ``r`` reads, when it is found without isl's
    last-writer search: ``w`` (its tensor's only write) comes before ``r`` in program order,
    and in ``r``'s iteration of the loops they share exactly one instance of ``w`` wrote each
    element ``r`` reads -- that instance is the last write before ``r``, since every other
    instance of ``w`` ran in an earlier iteration of those loops or after ``r``. Failing
    that, the same with the innermost shared loop's iterations up to ``r``'s (a value written
    in the first iteration, read in every one). ``w -> r``, or None when neither holds (then
    isl decides)."""
    if not w.path < r.path:
        return None
    m = _shared_loops(w, r)
    wdims = [f"{d}_w" for d in w.dims]
    candidates = model.access(r, "elem").apply_range(model.access(w, "elem").reverse())
    for relaxed in ((False, True) if m else (False,)):
        same = [f"{r.dims[L]} = {wdims[L]}" for L in range(m - 1 if relaxed else m)]
        if relaxed:
            same.append(f"{wdims[m - 1]} <= {r.dims[m - 1]}")
        pair = model.union_map([f"{r.head()} -> {w.stmt}[{', '.join(wdims)}]" +
                                (f" : {' and '.join(same)}" if same else "")])
        found = candidates.intersect(pair)
        if found.is_single_valued() and model.instances(r).is_subset(found.domain()):
            if m and not relaxed:
                model.cache.setdefault("in_iteration", set()).add(r.stmt)
            # in explicit form (each writer coordinate a quasi-affine function of the read's),
            # as isl's own analysis returns it: the relations built on it stay small. isl's
            # lexmax of the composition as built can drop part of its domain (islpy 2026.2.2:
            # a 24-core uneven split, the second run's cores lost, so their reads found no
            # graph value); with its equalities detected first it does not, and the result is
            # checked total anyway: ``found`` is already the function, only in a costlier form
            explicit = found.detect_equalities().lexmax()
            return (explicit if model.instances(r).is_subset(explicit.domain()) else found).reverse()
    return None


def flows(model: Model) -> tuple[isl.UnionMap, isl.UnionSet]:
    """(last writer -> read, reads with no writer) over tensor elements (per core in LX),
    tensor by tensor: an element is written and read only through its own tensor's accesses.
    The usual case (one write, each read finding its writer in its own iteration) is shown by
    one relation composition per read; the others get isl's last-writer analysis."""
    groups: dict[str, list[Access]] = {}
    for acc in model.accesses:
        groups.setdefault(acc.tensor, []).append(acc)
    deps, none = model.empty_map(), model.empty_map().domain()
    for accs in groups.values():
        writes = [a for a in accs if a.is_write]
        reads = [a for a in accs if not a.is_write]
        if not reads:
            continue
        found = [_same_iteration(model, writes[0], r) for r in reads] if len(writes) == 1 else [None]
        if all(d is not None for d in found):
            for d in found:
                assert d is not None
                deps = deps.union(d)
            continue
        d, n = _compute_flow(model, accs, "elem", False)
        deps, none = deps.union(d), none.union(n)
    return deps, none


def _alias_classes(model: Model) -> list[list[Access]]:
    """The accesses of tensors that may share memory cells while both are live: tensors whose
    bytes overlap (in one memory) and whose accesses overlap in program order (top-level
    positions). A tensor whose accesses disagree on its address, memory or element size is
    checked even alone. Tensors apart in memory or in time cannot disturb each other's flow."""
    groups: dict[str, list[Access]] = {}
    for acc in model.accesses:
        groups.setdefault(acc.tensor, []).append(acc)
    info: list[tuple[str, str, tuple[int, int] | None, tuple[int, int], bool, tuple[int, int, int] | None]] = []
    for name, accs in groups.items():
        mems = {a.memory for a in accs}
        addresses = {str(a.arg.address) for a in accs}
        sizes = {a.nbytes for a in accs}
        spans = [a.span for a in accs]
        lone = len(mems) > 1 or len(addresses) > 1 or len(sizes) > 1
        known_spans = [s for s in spans if s is not None]
        span = (min(s[0] for s in known_spans), max(s[1] for s in known_spans)) \
            if len(known_spans) == len(spans) else None
        when = (min(a.path[0] for a in accs), max(a.path[0] for a in accs))
        # a tensor whose every read finds its writer in its own iteration of the top-level
        # loop holding all its accesses lives in a window of that loop's body each iteration
        inner = model.cache.get("in_iteration", set())
        local = when[0] == when[1] and all(a.loops >= 1 for a in accs) and all(
            a.stmt in inner for a in accs if not a.is_write)
        window = (when[0], min(a.path[1] for a in accs), max(a.path[1] for a in accs)) if local else None
        info.append((name, next(iter(mems)), span, when, lone, window))
    parent = {name: name for name, *_ in info}

    def root(x: str) -> str:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for memory in ("hbm", "lx"):
        mine = [i for i in info if i[1] == memory]
        unknown = [i for i in mine if i[2] is None]
        known = sorted(((i[2], i) for i in mine if i[2] is not None), key=lambda x: x[0][0])
        active: list = []
        for (low, _), one in known:
            active = [o for o in active if o[2][1] > low]  # still overlapping in bytes
            for other in active + unknown:
                if other[3][0] <= one[3][1] and one[3][0] <= other[3][1] and not _apart(one[5], other[5]):
                    parent[root(one[0])] = root(other[0])
            active.append(one)
        for j, one in enumerate(unknown):
            for other in unknown[:j]:
                parent[root(one[0])] = root(other[0])
    classes: dict[str, list[str]] = {}
    for name, *_ in info:
        classes.setdefault(root(name), []).append(name)
    alone = {name for name, _, _, _, lone, _ in info if lone}
    return [[a for n in names for a in groups[n]] for names in classes.values() if len(names) > 1 or alone & set(names)]


def _apart(one, other) -> bool:
    """Two tensors live in windows of one loop's body that do not overlap (one's last access
    no later than the other's first: an op reads before it writes), each finding its values
    within the iteration: in every iteration one is dead before the other is written."""
    if one is None or other is None or one[0] != other[0]:
        return False
    return one[2] <= other[1] or other[2] <= one[1]


def dataflow(model: Model, tensor_flow) -> PropertyResult:
    """Every read (and every copy-out) obtains the value last written to the same tensor
    element -- on the same core, in LX -- and bytes someone wrote: memory and tensors flow alike."""
    ten, ten_none = tensor_flow
    if not ten_none.is_empty():
        ce = counterexample(model, ten_none)
        return PropertyResult(name="dataflow", verdict="refuted", counterexample=ce,
                              reason=f"op {ce.op} reads an element of {ce.tensor} no op wrote before as {ce.tensor}")
    classes = _alias_classes(model)
    for accs in classes:
        mem, mem_none = _compute_flow(model, accs, "cell", True)
        if not mem_none.is_empty():
            ce = counterexample(model, mem_none)
            return PropertyResult(name="dataflow", verdict="refuted", counterexample=ce,
                                  reason=f"op {ce.op} reads {ce.tensor} bytes nothing wrote before")
        ten, _ = _compute_flow(model, accs, "elem", True)
        wrong = mem.subtract(ten).union(ten.subtract(mem))
        if not wrong.is_empty():
            ce = counterexample(model, wrong.range())
            return PropertyResult(name="dataflow", verdict="refuted", counterexample=ce,
                                  reason=f"op {ce.op} reads {ce.tensor} bytes last written by another write than the "
                                         f"one that last wrote that element of {ce.tensor} (an overwritten live "
                                         f"buffer, a stale slot or another core's copy)")
    return PropertyResult(name="dataflow", verdict="proved",
                          reason=f"every read obtains the last write of the same tensor element (per core in LX), "
                                 f"every byte read was written, over every iteration and core ({len(classes)} groups "
                                 f"of tensors that share memory while live checked byte by byte)")


def coverage(model: Model, graph: Graph | None, tensor_flow) -> PropertyResult:
    """No op instance writes one element from two points of its output (two values for one
    element), and every element of every graph output is written, last by an op of the graph
    op that produces it."""
    for acc in model.accesses:
        if not acc.is_write or acc.spec is None:
            continue
        m = access_map(model, [acc], "cell")
        same = m.apply_range(m.reverse())
        used = [j for j, s in enumerate(acc.syms) if any(s.name in c for c in _coord_names(acc))]
        if not used:
            continue
        n = len(acc.dims)
        x = [f"x{j}" for j in range(n)]
        y = [f"y{j}" for j in range(n)]
        eq = [f"x{L} = y{L}" for L in range(acc.loops)]
        at = acc.loops + 1 + len(acc.syms)
        differ = " or ".join(f"x{at + j} != y{at + j}" for j in used)
        pairs = isl.UnionMap.read_from_str(CTX, model.space(
            f"{acc.stmt}[{', '.join(x)}] -> {acc.stmt}[{', '.join(y)}] : {' and '.join(eq + [f'({differ})'])}"))
        clash = same.intersect(pairs)
        if not clash.is_empty():
            ce = counterexample(model, clash.domain())
            return PropertyResult(name="coverage", verdict="refuted", counterexample=ce,
                                  reason=f"op {ce.op} writes one element of {ce.tensor} from two points of one "
                                         f"iteration (a cross-core race or a coordinate that is not one-to-one)")
    if graph is not None:  # the runtime copies in exactly the graph's inputs, and out its outputs
        for acc in model.accesses:
            if acc.spec is None and acc.is_write != (acc.arg.buffer in graph.inputs):
                ce = counterexample(model, access_map(model, [acc], "cell").domain())
                return PropertyResult(name="coverage", verdict="refuted", counterexample=ce,
                                      reason=f"kernel argument {acc.arg.name}: is_input is {acc.arg.is_input}, "
                                             f"but buffer {acc.arg.buffer} is "
                                             f"{'not ' if acc.is_write else ''}a graph input")
    outs = [a for a in model.accesses if a.stmt.startswith("OUT")]
    deps, none = tensor_flow
    for acc in outs:
        mine = none.intersect(access_map(model, [acc], "cell").domain())
        if not mine.is_empty():
            ce = counterexample(model, mine)
            return PropertyResult(name="coverage", verdict="refuted", counterexample=ce,
                                  reason=f"output {acc.arg.name}: an element is never written")
    if graph is not None:
        producer = {op.store.buffer: op.name for op in graph.ops}
        ops = {f"W{a.t}": a.spec for a in model.accesses if a.is_write and a.spec is not None}
        for acc in outs:
            owner = producer.get(acc.arg.buffer)
            if owner is None:
                continue  # an output that is an input: the copy-in wrote it
            for one in _maps(deps):
                src = one.get_space().get_tuple_name(isl.dim_type.in_)
                dst = one.get_space().get_tuple_name(isl.dim_type.out)
                if dst != acc.stmt or src not in ops:
                    continue
                name = ops[src].name
                if name != owner and not name.startswith(owner + "_"):
                    ce = counterexample(model, isl.UnionSet.from_set(one.range()))
                    return PropertyResult(name="coverage", verdict="refuted", counterexample=ce,
                                          reason=f"output {acc.arg.name}: elements last written by op {name}, not by "
                                                 f"graph op {owner} that produces buffer {acc.arg.buffer}")
    return PropertyResult(name="coverage", verdict="proved",
                          reason="every output element is written, last by its graph producer's ops; no op instance "
                                 "writes an element twice")


def _maps(u: isl.UnionMap) -> list[isl.Map]:
    out: list[isl.Map] = []
    u.foreach_map(out.append)
    return out


def _coord_names(acc: Access) -> list[str]:
    return [str(c) for c in acc.arg.device_coordinates]
