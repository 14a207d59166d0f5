"""The three properties of a program's model (``fspyre.proof.sets``), each proved over all
instances with isl or refuted with a sampled counterexample (docs/proof.md)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import islpy as isl

from fspyre.ir.graph import POINTWISE_FNS, Graph
from fspyre.ir.program import op_fn
from fspyre.machine import formats
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
    cells = access_map(model, [acc], "cell").intersect_domain(isl.UnionSet.from_set(fixed))
    address, memory = -1, acc.memory
    if not cells.is_empty():
        cell = cells.range().sample_point()
        n = cell.get_space().dim(isl.dim_type.set)
        address = _values(cell, isl.dim_type.set, n)[-1]
    loops = tuple(vals[:acc.loops])
    if acc.spec is None:  # copy-in / copy-out: host index, no core
        core, point = -1, tuple(vals[:-1])
        op = f"copy-{'in' if acc.is_write else 'out'}"
    else:
        n = len(acc.syms)
        core, point = vals[acc.loops], tuple(vals[acc.loops + 1 + n:-1])
        op = acc.spec.name or acc.spec.op
    dims = [d.name for d in model.program.symbolic.dims] if model.program.symbolic is not None else []
    sizes = tuple((d, v) for d, v in zip(dims, params))
    return Counterexample(op=op, tensor=acc.arg.name, iteration=loops, core=core, point=point, memory=memory,
                          address=address, sizes=sizes)


def access_map(model: Model, accesses: Iterable[Access], target: str) -> isl.UnionMap:
    """Instances -> memory cells (``target="cell"``) or tensor elements (``"elem"``)."""
    parts = []
    for acc in accesses:
        for cond, _, cell, elem in acc.pieces:
            parts.append(f"{acc.stmt}[{', '.join(acc.dims)}] -> {cell if target == 'cell' else elem} : {cond}")
    return model.union_map(parts)


def _violations(model: Model, acc: Access, why: str, where) -> isl.UnionSet | None:
    """The instances of ``acc`` where ``where(piece_index, address)`` (an isl condition) holds."""
    parts = []
    for j, (cond, _, cell, _) in enumerate(acc.pieces):
        address = cell[cell.index("[") + 1:-1].split(", ", 1)[-1] if acc.memory == "lx" else cell[4:-1]
        bad = where(j, address)
        if bad:
            parts.append(f"{acc.stmt}[{', '.join(acc.dims)}] : {cond} and ({bad})")
    if not parts:
        return None
    out = isl.UnionSet.read_from_str(CTX, model.space(parts[0]))
    for p in parts[1:]:
        out = out.union(isl.UnionSet.read_from_str(CTX, model.space(p)))
    return None if out.is_empty() else out


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
            return _refuted("memory_safety", model, acc, broken, lambda j, a: "b = 0")
        checks: list[tuple[str, Callable[..., str]]] = []
        for d, size in enumerate(arg.device_size):
            checks.append((f"device coordinate {d} leaves its device size {size}",
                           lambda j, a, d=d, size=size: f"{acc.coords[j][d]} < 0 or {acc.coords[j][d]} >= {_t(size)}"))
        checks.append((f"an element address is not aligned to {acc.nbytes} bytes",
                       lambda j, a: f"b = 0 and ({a}) mod {acc.nbytes} > 0"))
        if acc.memory == "hbm":
            own = f"{_t(arg.address)} + {_bytes(arg)}"
            checks.append((f"leaves its allocation [{arg.address}, {own})",
                           lambda j, a: f"{a} < {_t(arg.address)} or {a} >= {own}"))
            checks.append((f"leaves HBM ({program.hbm_bytes} bytes)",
                           lambda j, a: f"{a} < 0 or {a} >= {_t(program.hbm_bytes)}"))
            if arg.arg_index >= 0:
                lo, hi = regions.get(arg.arg_index, ("0", "0"))
                checks.append((f"leaves kernel argument {arg.arg_index}, which its arg_index names",
                               lambda j, a: f"{a} < {lo} or {a} >= {hi}"))
            else:
                for index, (lo, hi) in regions.items():
                    checks.append((f"an intermediate reaches into kernel argument {index}",
                                   lambda j, a, lo=lo, hi=hi: f"{a} >= {lo} and {a} < {hi}"))
        else:
            checks.append((f"leaves the core's LX ({program.lx_bytes} bytes)",
                           lambda j, a: f"{a} < 0 or {a} >= {_t(program.lx_bytes)}"))
        for why, where in checks:
            bad = _violations(model, acc, why, where)
            checked += 1
            if bad is not None:
                ce = counterexample(model, bad)
                return PropertyResult(name="memory_safety", verdict="refuted",
                                      reason=f"op {ce.op} tensor {arg.name}: {why}", counterexample=ce)
    return PropertyResult(name="memory_safety", verdict="proved",
                          reason=f"{len(model.accesses)} accesses ({checked} conditions) inside their device dims, "
                                 f"allocations and memories, aligned, over every iteration and core")


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


def _refuted(name: str, model: Model, acc: Access, why: str, where) -> PropertyResult:
    bad = _violations(model, acc, why, where)
    assert bad is not None
    return PropertyResult(name=name, verdict="refuted", reason=why, counterexample=counterexample(model, bad))


def _t(v) -> str:
    from fspyre.proof.sets import isl_text

    return isl_text(v, {})


def _bytes(arg) -> str:
    """A tensor's device bytes as isl text (at most one factor symbolic: else not affine)."""
    import sympy

    return _t(sympy.expand(sympy.Mul(formats.FORMATS[arg.device_dtype].nbytes, *arg.device_size)))


def schedule(model: Model) -> isl.UnionMap:
    return model.union_map([text for _, text in model.schedule])


def flows(model: Model, target: str) -> tuple[isl.UnionMap, isl.UnionSet]:
    """(last writer -> read, reads with no writer) over memory cells or tensor elements."""
    reads = access_map(model, [a for a in model.accesses if not a.is_write], target)
    writes = access_map(model, [a for a in model.accesses if a.is_write], target)
    info = isl.UnionAccessInfo.from_sink(reads).set_must_source(writes).set_schedule_map(schedule(model))
    flow = info.compute_flow()
    return flow.get_must_dependence(), flow.get_must_no_source().domain()


def dataflow(model: Model, memory_flow, tensor_flow) -> PropertyResult:
    """Every read (and every copy-out) obtains the value last written to the same tensor
    element -- on the same core, in LX -- and bytes someone wrote: memory and tensors flow alike."""
    mem, mem_none = memory_flow
    ten, ten_none = tensor_flow
    if not mem_none.is_empty():
        ce = counterexample(model, mem_none)
        return PropertyResult(name="dataflow", verdict="refuted", counterexample=ce,
                              reason=f"op {ce.op} reads {ce.tensor} bytes nothing wrote before")
    if not ten_none.is_empty():
        ce = counterexample(model, ten_none)
        return PropertyResult(name="dataflow", verdict="refuted", counterexample=ce,
                              reason=f"op {ce.op} reads an element of {ce.tensor} no op wrote before as {ce.tensor}")
    wrong = mem.subtract(ten).union(ten.subtract(mem))
    if not wrong.is_empty():
        ce = counterexample(model, wrong.range())
        return PropertyResult(name="dataflow", verdict="refuted", counterexample=ce,
                              reason=f"op {ce.op} reads {ce.tensor} bytes last written by another write than the one "
                                     f"that last wrote that element of {ce.tensor} (an overwritten live buffer, a "
                                     f"stale slot or another core's copy)")
    return PropertyResult(name="dataflow", verdict="proved",
                          reason="every read obtains the last write of the same tensor element (per core in LX), "
                                 "every byte read was written, over every iteration and core")


def coverage(model: Model, graph: Graph | None, memory_flow) -> PropertyResult:
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
    deps, none = memory_flow
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
