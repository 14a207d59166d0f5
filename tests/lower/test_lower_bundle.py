"""bundle.mlir (fspyre.lower.bundle): format, structure, and addresses that agree with the
interpreter.

The strongest check here executes the bundle text itself (a tiny evaluator of its constants,
extracts, affine maps and loops) and compares every sdsc_execute's operand values with the
addresses the interpreter uses for that OpSpec at that iteration, and with the addresses of
the matching op of the unrolled program (which test_lower_unroll.py runs on the interpreter).
"""

from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from looped_programs import add_graph, add_mul_graph, all_programs, hand_tiled_programs, matmul_graph, untiled

from fspyre.errors import LoweringError
from fspyre.ir.program import LoopSpec, op_specs, walk_specs
from fspyre.lower.bundle import bundle_mlir, hbm_regions, plan_bundle
from fspyre.lower.unroll import unroll

MAP_RE = re.compile(r"^#map_(\d+) = affine_map<\(([d0-9, ]*)\)\[s0\] -> \(s0((?: [+-] \d+\*d\d+)*)\)>$")
APPLY_RE = re.compile(r"^%(addr_\d+) = affine\.apply #map_(\d+)\(([^)]*)\)\[%(\w+)\]$")
EXEC_RE = re.compile(r'^sdscbundle\.sdsc_execute \(([^)]*)\) \{sdsc_filename="(sdsc_\d+\.json)", '
                     r'"symbol_ids"=\[([-0-9, ]*)\](?:, "core_spaces"=(\[[\[\]0-9, ]*\]))?\} // .+$')

PROGRAMS = all_programs()


def parse_maps(text: str) -> dict[int, list[tuple[int, int]]]:
    maps = {}
    for line in text.splitlines():
        if line.startswith("#map_"):
            m = MAP_RE.match(line)
            assert m, line
            terms = re.findall(r"([+-]) (\d+)\*d(\d+)", m.group(3))
            maps[int(m.group(1))] = [(int(d), int(s) if sign == "+" else -int(s)) for sign, s, d in terms]
            assert [d for d, _ in maps[int(m.group(1))]] == list(range(len(m.group(2).split(","))))
    return maps


def evaluate_bundle(text: str, kernel_bases: dict[int, int], pool_base: int) -> list[tuple[str, list[int]]]:
    """Run the bundle's address arithmetic: every sdsc_execute in execution order with its
    operand values, kernel arg ``ai`` based at ``kernel_bases[ai]`` and the pool at ``pool_base``."""
    maps = parse_maps(text)
    lines = [ln.strip() for ln in text.splitlines()]
    start = next(i for i, ln in enumerate(lines) if ln.startswith("func.func")) + 1
    env: dict[str, int] = {}
    trace: list[tuple[str, list[int]]] = []

    def block(i: int) -> int:
        """Execute from line i to the matching close brace; return the index after it."""
        while i < len(lines):
            ln = lines[i]
            if ln in ("}", "return"):
                return i + 1 if ln == "}" else i
            if m := re.match(r"^%(\w+) = arith\.constant (-?\d+) : index$", ln):
                env[m.group(1)] = int(m.group(2))
            elif m := re.match(r"^%(\w+) = arith\.addi %(\w+), %(\w+) : index$", ln):
                env[m.group(1)] = env[m.group(2)] + env[m.group(3)]
            elif m := re.match(r"^%arg_(\d+) = sdscbundle\.input_arg_extract value from %arg_(\d+)_base_addr : "
                               r"!sdscbundle\.input_arg<index> -> index$", ln):
                assert m.group(1) == m.group(2)
                env[f"arg_{m.group(1)}"] = kernel_bases[int(m.group(1))]
            elif m := re.match(r"^%pool = sdscbundle\.device_mem_allocate (\d+) bytes : index$", ln):
                env["pool"] = pool_base
            elif m := APPLY_RE.match(ln):
                ivs = [v.strip().lstrip("%") for v in m.group(3).split(",")]
                terms = maps[int(m.group(2))]
                assert len(terms) == len(ivs)
                env[m.group(1)] = env[m.group(4)] + sum(s * env[iv] for (_, s), iv in zip(terms, ivs))
            elif m := EXEC_RE.match(ln):
                operands = [o.strip().lstrip("%") for o in m.group(1).split(",") if o.strip()]
                trace.append((m.group(2), [env[o] for o in operands]))
            elif m := re.match(r"^%(\w+) = arith\.cmpi eq, %(\w+), %(\w+) : index$", ln):
                env[m.group(1)] = int(env[m.group(2)] == env[m.group(3)])
            elif m := re.match(r"^scf\.if %(\w+) \{$", ln):
                if env[m.group(1)]:
                    i = block(i + 1)
                else:  # skip to the matching close brace
                    depth = 1
                    while depth:
                        i += 1
                        depth += lines[i].endswith("{") - (lines[i] == "}")
                    i += 1
                continue
            elif m := re.match(r"^scf\.for %(i_\d+) = %c0 to %(loop_bound_\d+) step %c1 \{$", ln):
                end = i + 1
                for k in range(env[m.group(2)]):
                    env[m.group(1)] = k
                    end = block(i + 1)
                if env[m.group(2)] == 0:
                    raise AssertionError("zero-trip loops are not exercised here")
                i = end
                continue
            else:
                raise AssertionError(f"unexpected bundle line: {ln!r}")
            i += 1
        raise AssertionError("unterminated block")

    block(start)
    return trace


def run_bundle(program) -> list[tuple[str, list[int]]]:
    """The bundle's executes with the runtime bases fspyre's absolute addresses stand for."""
    regions = hbm_regions(program)
    bases = {ai: addr for ai, (addr, _) in regions.args.items()}
    return evaluate_bundle(bundle_mlir(program), bases, regions.pool_base)


def expected_trace(program) -> list[tuple[str, list[int]]]:
    """Each OpSpec execution in program order with the addresses the interpreter uses: the
    allocation plus iteration times tile_advance per enclosing loop."""
    index = {id(s): i for i, s in enumerate(op_specs(program))}
    out = []

    def walk(body, iters, counts=()):
        for spec in body:
            if isinstance(spec, LoopSpec):
                for i in range(spec.count):
                    walk(spec.body, iters + (i,), counts + (spec.count,))
            elif spec.runs == "every" or iters[-1] == (0 if spec.runs == "first" else counts[-1] - 1):
                out.append((f"sdsc_{index[id(spec)]}.json",
                            [t.address + sum(i * a for i, a in zip(iters, t.tile_advance)) for t in spec.args]))

    walk(program.body, ())
    return out


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_bundle_addresses_match_the_interpreter_and_unroll(name):
    program = PROGRAMS[name]
    trace = run_bundle(program)
    expected = expected_trace(program)
    assert trace == expected
    assert [[t.address for t in op.args] for op in unroll(program).body] == [v for _, v in expected]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=hand_tiled_programs())
def test_property_bundle_addresses(case):
    program, _ = case
    trace = run_bundle(program)
    assert trace == expected_trace(program)


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_bundle_structure(name):
    program = PROGRAMS[name]
    text = bundle_mlir(program)
    lines = text.splitlines()
    loops = [s for s, _ in walk_specs(program.body) if isinstance(s, LoopSpec)]
    ops = op_specs(program)
    assert text.endswith("\n") and lines[-3:] == ["\t\treturn", "\t}", "}"]
    assert lines[len(parse_maps(text))] == "module {"
    # One parameter and one extract per distinct kernel arg, sorted.
    indices = sorted({k.arg_index for k in program.kernel_args})
    params = ", ".join(f"%arg_{ai}_base_addr: !sdscbundle.input_arg<index>" for ai in indices)
    assert f"\tfunc.func @sdsc_bundle({params}) {{" in lines
    for ai in indices:
        assert (f"\t\t%arg_{ai} = sdscbundle.input_arg_extract value from %arg_{ai}_base_addr : "
                f"!sdscbundle.input_arg<index> -> index") in lines
    # Loop bounds in preorder, induction variables numbered the same way.
    for k, loop in enumerate(loops):
        assert f"\t\t%loop_bound_{k} = arith.constant {loop.count} : index" in lines
    assert ("\t\t%c0 = arith.constant 0 : index" in lines) == bool(loops)
    fors = [ln for ln in lines if "scf.for" in ln]
    assert [re.search(r"%i_(\d+)", ln).group(1) for ln in fors] == [str(k) for k in range(len(loops))]
    # One execute per OpSpec, in depth-first order, with one operand and one id per tensor.
    execs = [EXEC_RE.match(ln.strip()) for ln in lines if "sdsc_execute" in ln]
    assert [m.group(2) for m in execs] == [f"sdsc_{i}.json" for i in range(len(ops))]
    for m, op in zip(execs, ops):
        operands = [o for o in m.group(1).split(", ") if o]
        ids = [int(v) for v in m.group(3).split(", ") if v]
        assert len(operands) == len(ids) == len(op.args)
        assert all(i < 0 for i in ids)
        # an uneven split writes every core's (start, extent) per symbol; an even one leaves it to the split
        spaces = [[x for se in space for x in se] for space in op.core_spaces]
        assert (json.loads(m.group(4)) == spaces) if m.group(4) else op.even


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_indentation_is_tabs_by_nesting(name):
    text = bundle_mlir(PROGRAMS[name])
    depth = 0
    in_body = False
    for line in text.splitlines():
        tabs = len(line) - len(line.lstrip("\t"))
        assert not line.lstrip("\t").startswith(" "), line
        if line.startswith("#map_") or line in ("module {", "}"):
            assert tabs == 0, line
        elif "func.func" in line:
            assert tabs == 1
            in_body = True
        elif line == "\t}":
            in_body = False
        elif in_body:
            if line.strip() == "}":
                depth -= 1
            assert tabs == 2 + depth, line
            if line.rstrip().endswith("{"):
                depth += 1
    assert depth == 0


@pytest.mark.parametrize("name", sorted(n for n, p in PROGRAMS.items() if any(isinstance(s, LoopSpec) for s in p.body)))
def test_strides_are_the_tile_advances(name):
    """Each affine.apply's map has one dim per level at which its tensor advances, bound to
    that level's induction variable, with that level's tile_advance as coefficient."""
    program = PROGRAMS[name]
    text = bundle_mlir(program)
    maps = parse_maps(text)
    plan = plan_bundle(program)
    assert len(set(plan.maps)) == len(plan.maps)
    seen_lx = False
    for ex, op in zip(plan.executes(), op_specs(program)):
        for operand, t in zip(ex.operands, op.args):
            levels = [lvl for lvl, a in enumerate(t.tile_advance) if a]
            if t.memory == "lx":
                seen_lx = True
                assert operand == f"lx_addr_{t.address}"
                continue
            if not levels:
                assert not operand.startswith("addr_")
                continue
            line = next(ln.strip() for ln in text.splitlines() if ln.strip().startswith(f"%{operand} = "))
            m = APPLY_RE.match(line)
            ivs = [v.strip() for v in m.group(3).split(",")]
            assert ivs == [f"%i_{ex.loops[lvl]}" for lvl in levels]
            assert [s for _, s in maps[int(m.group(2))]] == [t.tile_advance[lvl] for lvl in levels]
    assert seen_lx == any(t.memory == "lx" for op in op_specs(program) for t in op.args)


def test_maps_are_deduplicated_in_first_seen_order():
    text = bundle_mlir(PROGRAMS["matmul_m_n"])
    applies = [APPLY_RE.match(ln.strip()) for ln in text.splitlines() if "affine.apply" in ln]
    first_seen = list(dict.fromkeys(int(m.group(2)) for m in applies))
    assert first_seen == sorted(first_seen) == list(range(len(parse_maps(text))))


def test_untiled_add_mul_text():
    """The untiled bundle in full: pool for the intermediate, kernel args by base, no loops."""
    text = bundle_mlir(untiled(add_mul_graph()))
    arg = "!sdscbundle.input_arg<index>"
    expected = [
        "module {",
        "\tfunc.func @sdsc_bundle(" + ", ".join(f"%arg_{i}_base_addr: {arg}" for i in range(4)) + ") {",
        "\t\t%pool = sdscbundle.device_mem_allocate 1024 bytes : index",
        *(f"\t\t%arg_{i} = sdscbundle.input_arg_extract value from %arg_{i}_base_addr : {arg} -> index"
          for i in range(4)),
        "\t\t%pool_offset_0 = arith.constant 0 : index",
        "\t\t%pool_addr_0 = arith.addi %pool, %pool_offset_0 : index",
        '\t\tsdscbundle.sdsc_execute (%arg_0, %arg_1, %pool_addr_0) {sdsc_filename="sdsc_0.json", '
        '"symbol_ids"=[-1, -2, -3]} // add: a, b -> buf0',
        '\t\tsdscbundle.sdsc_execute (%pool_addr_0, %arg_2, %arg_3) {sdsc_filename="sdsc_1.json", '
        '"symbol_ids"=[-3, -4, -5]} // mul: buf0, c -> buf1',
        "\t\treturn",
        "\t}",
        "}",
    ]
    assert text.splitlines() == expected


def test_add_rows_text():
    """The brief's example: [4,128] fp16 add in LoopSpec(2) over rows advances one row block
    (2 rows x 64 elements x 2 bytes = 256 bytes) per iteration."""
    text = bundle_mlir(PROGRAMS["add_rows"])
    lines = text.splitlines()
    assert lines[0] == "#map_0 = affine_map<(d0)[s0] -> (s0 + 256*d0)>"
    assert "\t\tscf.for %i_0 = %c0 to %loop_bound_0 step %c1 {" in lines
    assert "\t\t\t%addr_0 = affine.apply #map_0(%i_0)[%arg_0]" in lines
    assert ('\t\t\tsdscbundle.sdsc_execute (%addr_0, %addr_1, %addr_2) {sdsc_filename="sdsc_0.json", '
            '"symbol_ids"=[-1, -2, -3]} // add: a, b -> buf0') in lines


def _with_arg(program, op_index: int, position: int, **changes):
    """``program`` with one TensorArg of one top-level OpSpec changed."""
    op = program.body[op_index]
    args = tuple(replace(t, **changes) if i == position else t for i, t in enumerate(op.args))
    body = tuple(replace(s, args=args) if i == op_index else s for i, s in enumerate(program.body))
    return replace(program, body=body)


def test_kernel_arg_slices_and_pool_offsets():
    """A tensor at an offset inside its kernel arg reads %arg_{ai}_slice_{off}; intermediates
    are addressed from the pool."""
    program = _with_arg(untiled(add_mul_graph()), 0, 0, memory="hbm", address=128)
    lines = bundle_mlir(program).splitlines()
    assert "\t\t%arg_0_slice_offset_128 = arith.constant 128 : index" in lines
    assert "\t\t%arg_0_slice_128 = arith.addi %arg_0, %arg_0_slice_offset_128 : index" in lines
    assert any(ln.strip().startswith("sdscbundle.sdsc_execute (%arg_0_slice_128,") for ln in lines)
    plan = plan_bundle(untiled(matmul_graph()))
    assert plan.regions.pool_bytes > 0
    assert [b.name for b in plan.symbols if b.kind == "pool"] == ["pool_addr_0"]


def test_errors_name_the_culprit():
    program = untiled(add_graph())
    with pytest.raises(LoweringError, match=r"op add buf0: tensor a at HBM 0x1388 lies outside kernel arg 0"):
        bundle_mlir(_with_arg(program, 0, 0, memory="hbm", address=5000))
    with pytest.raises(LoweringError, match=r"intermediate buf0 at HBM \[0x0, 0x400\) overlaps kernel arg 0"):
        bundle_mlir(_with_arg(program, 0, 2, arg_index=-1, memory="hbm", address=0))
    with pytest.raises(LoweringError, match=r"tensor a has arg_index 7, but the program's kernel args are \[0, 1, 2\]"):
        bundle_mlir(_with_arg(program, 0, 0, arg_index=7))
    wrong_levels = _with_arg(program, 0, 0, tile_advance=(256, 0))
    looped = replace(wrong_levels, body=(LoopSpec(count=2, body=wrong_levels.body),))
    with pytest.raises(LoweringError, match=r"tensor a has tile_advance \[256, 0\] \(2 levels\) inside 1 loops"):
        bundle_mlir(looped)


