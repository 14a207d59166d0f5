"""Loading a JSON artifact is safe: hostile documents give a one-line FspyreError quickly, and
nothing in a document is ever executed, at load time or when the loaded artifact is used.

The documents are real stage artifacts of a compiled graph with one leaf or subtree replaced
at a time (by code, wrong types, huge numbers, deep nesting); positions are sampled with a
fixed seed so the module stays fast."""

from __future__ import annotations

import contextlib
import copy
import gc
import json
import random
import time
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import fspyre
from fspyre.errors import FspyreError, LoweringError, SerializationError
from fspyre.ir.graph import Graph
from fspyre.ir.program import Program
from fspyre.ir.serialize import FORMAT, dumps, loads
from fspyre.machine.indexing import compile_index
from fspyre.machine.spyre import spyre

TIME_LIMIT = 1.0  # CPU seconds per load; a sound loader takes milliseconds on these documents


@contextlib.contextmanager
def cpu_seconds():
    """The CPU time of the block, without the garbage collector: a hostile document must not
    make the loader itself work for long, which wall time on a loaded machine (or a full
    collection of the test session's heap landing inside the block) does not measure."""
    elapsed = [0.0]
    enabled = gc.isenabled()
    gc.disable()
    start = time.process_time()
    try:
        yield elapsed
    finally:
        elapsed[0] = time.process_time() - start
        if enabled:
            gc.enable()


def code(marker) -> list[str]:
    """Texts that create ``marker`` if anything evaluates them as Python or as sympy input."""
    return [
        f"__import__('os').system('touch {marker}')",
        f"__import__('pathlib').Path('{marker}').touch()",
        f"exec(\"open('{marker}', 'w').close()\")",
    ]


@pytest.fixture(scope="module")
def compiled() -> fspyre.Compilation:
    g = fspyre.GraphBuilder("hostile")
    m, k, n = g.dim("M", 8), g.dim("K", 64), g.dim("N", 64)
    x = g.input("x", (m, k), "float32")
    w = g.input("w", (k, n), "float32")
    with g.hint(slices={"M": 2}):
        y = g.matmul(x, w, contract="K")
        g.output("y", g.add(g.relu(y), 1.5))
        g.output("s", g.sum(x, ["K"], keepdim=True))
    return fspyre.compile(g.build(), machine=spyre(cores=4), tiling="hints")


def positions(doc: Any, path: tuple = ()) -> Iterator[tuple[tuple, Any]]:
    """Every (path, value) in a JSON document, containers before their contents."""
    yield path, doc
    if isinstance(doc, dict):
        for key, value in doc.items():
            yield from positions(value, path + (key,))
    elif isinstance(doc, list):
        for i, value in enumerate(doc):
            yield from positions(value, path + (i,))


def replaced(doc: Any, path: tuple, value: Any) -> Any:
    out = copy.deepcopy(doc)
    if not path:
        return value
    parent = out
    for step in path[:-1]:
        parent = parent[step]
    parent[path[-1]] = value
    return out


def current(doc: dict) -> str:
    """A hand-written document's text, in the artifact format ``loads`` reads."""
    return json.dumps({"_format": FORMAT, **doc})


def load_or_error(text: str) -> Any:
    """The loaded artifact, or None after checking the refusal is a one-line FspyreError; either
    way within the time limit."""
    with cpu_seconds() as took:
        try:
            value = loads(text)
        except FspyreError as err:
            value = None
            assert "\n" not in str(err), str(err)
            assert str(err), "an error with no message"
    elapsed = took[0]
    assert elapsed < TIME_LIMIT, f"load took {elapsed:.2f} s: {text[:200]}"
    return value


def use(value: Any) -> None:
    """Work a loaded artifact as a user would; any error is fine, running code is not."""
    try:
        if isinstance(value, Graph):
            fspyre.evaluate(value, {b: np.ones(t.type.shape, np.float32) for b in value.inputs
                                    for t in value.buffers if t.name == b})
            fspyre.compile(value, machine=spyre(cores=4), tiling="hints")
        elif isinstance(value, Program):
            fspyre.run(value, {a.name: np.ones(a.host_shape, np.float32) for a in value.kernel_args if a.is_input})
        else:
            str(value)
    except Exception:  # noqa: BLE001 - a mangled artifact may fail in many ways; only execution matters here
        pass


def test_code_in_every_string_field_is_never_run(compiled, tmp_path):
    marker = tmp_path / "ran"
    texts = code(marker)
    tried = loaded = 0
    for stage, art in compiled.stages.items():
        doc = json.loads(dumps(art))
        for i, (path, value) in enumerate(p for p in positions(doc) if isinstance(p[1], str)):
            tried += 1
            value = load_or_error(json.dumps(replaced(doc, path, texts[i % len(texts)])))
            if value is not None:
                loaded += 1
                use(value)
            assert not marker.exists(), f"{stage} at {path}: the document's text was executed"
    # Names are free text, so some documents load; field kinds that are not free text refuse it.
    assert tried > 100 and 0 < loaded < tried


def test_code_where_an_expression_belongs_names_the_field(compiled, tmp_path):
    marker = tmp_path / "ran"
    doc = json.loads(dumps(compiled.graph))
    doc["ops"][1]["store"]["index"] = code(marker)[0]
    with pytest.raises(SerializationError, match=r"^Graph\.ops\[1\]\.store\.index: expected an expression tree"):
        loads(json.dumps(doc))
    doc["ops"][1]["store"]["index"] = {"_expr": {"sym": code(marker)[0]}}
    with pytest.raises(SerializationError, match=r"^Graph\.ops\[1\]\.store\.index\._expr\.sym: a symbol name"):
        loads(json.dumps(doc))
    assert not marker.exists()


def wrong_values(marker) -> list[Any]:
    return [
        code(marker)[0], 10**30, -(2**63), True, None, 0.5, [], [1, "a"], {}, {"_type": "Dim"},
        {"_type": "Machine"}, {"_map": [[1]]}, {"_map": [[1, 2], [1, 3]]}, {"_float": "1e999"},
        {"_expr": {"op": "Pow", "args": [3, 10**7]}}, {"_expr": {"op": "Sin", "args": [1]}},
        {"_expr": {"op": "Mul", "args": [2**62] * 200}}, {"_expr": {"rat": [1, 0]}},
        {"_expr": {"op": "Add", "args": ["x", 1]}}, {"_type": "Scalar", "value": "1"},
    ]


@pytest.mark.parametrize("stage", ["graph", "tiling_plan", "loop_tree", "split_plan", "allocation", "program"])
def test_wrong_values_at_sampled_positions_are_refused_cleanly(compiled, tmp_path, stage):
    marker = tmp_path / "ran"
    doc = json.loads(dumps(compiled.stages[stage]))
    where = [path for path, _ in positions(doc) if path]
    rng = random.Random(8)
    values = wrong_values(marker)
    refused = 0
    for path in rng.sample(where, min(40, len(where))):
        for value in rng.sample(values, 3):
            loaded = load_or_error(json.dumps(replaced(doc, path, value)))
            refused += loaded is None
            if loaded is not None:
                use(loaded)
    assert not marker.exists()
    assert refused > 60  # most of 120 replacements are type errors


@pytest.mark.parametrize(
    "text, match",
    [
        ("[]", "expected an fspyre artifact"),
        ("42", "expected an fspyre artifact"),
        ('"text"', "expected an fspyre artifact"),
        ("null", "expected an fspyre artifact"),
        ('{"_expr": {"sym": "A"}}', "expected an fspyre artifact"),
        ('{"a": 1}', "must carry"),
        ("[" * 100_000 + "]" * 100_000, "deeper than"),
        ("[" * 500 + "]" * 500, "deeper than"),
        ('{"_type": "Dim", "name": "A", "size": ' + "9" * 5000 + "}", "not a usable JSON document"),
        ('{"_type": "Dim", "name": "A", "size": 99999999999999999999}', r"Dim\.size: integer .* beyond"),
        ('{"_type": "Dim", "name": "A", "size": true}', r"Dim\.size: expected an integer"),
        ('{"_type": "Scalar", "value": NaN}', "bare NaN"),
        ('{"_type": "Dim", "name": "A", "name": "B", "size": 2}', "appears twice"),
        ('{"_type": "Load", "buffer": "x", "index": {"_expr": {"op": "Pow", "args": [3, 10000000]}}}',
         r"Load\.index\._expr\.args\[1\]: a Pow exponent"),
        (json.dumps({"_type": "Load", "buffer": "x", "index": {"_expr": {"op": "Pow", "args": [
            {"op": "Pow", "args": [{"op": "Pow", "args": [3, 64]}, 64]}, 64]}}}), "more than 4096 bits"),
        (json.dumps({"_type": "OpNode", "op": {"_type": "Dim", "name": "A", "size": 2}}),
         r"OpNode\.op: expected Pointwise or Reduction, got a Dim"),
        (json.dumps({"_type": "Loop", "count": 2, "steps": []}), r"Loop: Loop misses the field 'body'"),
    ],
)
def test_malformed_documents_are_refused_quickly(text, match):
    if text.startswith("{"):  # an object in the current format: the refusal is about its contents
        text = '{"_format": %d, ' % FORMAT + text[1:]
    with cpu_seconds() as took, pytest.raises(SerializationError, match=match) as info:
        loads(text)
    assert took[0] < TIME_LIMIT
    assert "\n" not in str(info.value)


def test_crafted_sympy_work_is_bounded():
    """Node kinds whose simplification is slow on crafted input load in bounded time."""
    wide = {"op": "Add", "args": [{"op": "Mul", "args": [{"rat": [1, i + 2]}, {"sym": f"s{i}"}]} for i in range(300)]}
    for head, args in (("Mod", [wide, 64]), ("floor", [wide]), ("ceiling", [wide])):
        text = current({"_type": "Load", "buffer": "x", "index": {"_expr": {"op": head, "args": args}}})
        load_or_error(text)
    too_many = {"op": "Add", "args": [{"sym": f"s{i}"} for i in range(2000)]}
    with pytest.raises(SerializationError, match="more than 1024 nodes"):
        loads(current({"_type": "Load", "buffer": "x", "index": {"_expr": too_many}}))


def test_construction_errors_keep_their_class_and_gain_the_path():
    with pytest.raises(fspyre.errors.TilingError, match=r"^Loop\.body\[0\]: loop count 0"):
        loads(current({"_type": "Loop", "count": 3, "steps": [],
                       "body": [{"_type": "Loop", "count": 0, "steps": [], "body": []}]}))


def test_index_evaluation_never_parses_text(tmp_path):
    marker = tmp_path / "ran"
    with pytest.raises(LoweringError, match="expected an index expression"):
        compile_index(code(marker)[0], ())
    assert not marker.exists()


def test_loads_takes_text_only():
    with pytest.raises(SerializationError, match="takes the JSON text as a str"):
        loads(b'{"_type": "Dim", "name": "A", "size": 2}')


def test_documents_of_another_artifact_format_are_refused_whole(compiled):
    """A format-1 program (no "_format"; op_info and each tensor's allocation as maps) is
    refused as a whole, naming the format, not at its first changed field."""
    doc = json.loads(dumps(compiled.program))
    old = {k: copy.deepcopy(v) for k, v in doc.items() if k != "_format"}
    spec = old["body"][0]["body"][0]  # the copy of w, in the M loop's first iteration
    spec["op_info"] = {"_map": [["fn", spec["op"]], ["operands", [["arg", 0]]], ["compute", "float32"]]}
    for t in spec["args"]:
        t["allocation"] = {"_map": [[t.pop("memory"), t.pop("address")]]}
    with pytest.raises(SerializationError, match=rf'^document: no "_format"; it predates artifact format {FORMAT} '
                                                 r"\(written by an older fspyre, format 1\)"):
        loads(json.dumps(old))
    for version in (1, FORMAT + 1, "2", None):
        with pytest.raises(SerializationError, match=rf"^document: artifact format {version!r}, but this fspyre "
                                                     rf"reads only format {FORMAT}"):
            loads(json.dumps({**doc, "_format": version}))
    assert loads(json.dumps(doc)) == compiled.program


def test_a_device_format_the_machine_does_not_have_is_refused_naming_the_field(compiled):
    doc = json.loads(dumps(compiled.program))
    doc["body"][0]["body"][0]["args"][0]["device_dtype"] = "FP13"  # w, read by its copy in the loop
    with pytest.raises(SerializationError, match=r"^Program\.body\[0\]\.body\[0\]\.args\[0\]\.device_dtype: "
                                                 r"expected one of "
                                                 r"\['SEN169_FP16', .*got 'FP13'"):
        loads(json.dumps(doc))


# -- each stage artifact corrupted one field at a time, fed to the next stage alone ----------
@pytest.fixture(scope="module")
def doors():
    import stage_doors

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pipes = stage_doors.pipelines()
    return stage_doors, pipes


def test_a_corrupted_artifact_fed_to_the_next_stage_is_refused_or_runs_equal(doors):
    """A fixed sample spread over every (graph, artifact kind); the whole set (40,000+ cases)
    runs with ``python tests/unit/stage_doors.py``. No raw exception, no slow case, no wrong
    answer."""
    stage_doors, pipes = doors
    cases = stage_doors.sample(stage_doors.all_cases(pipes), 400)
    found: list[str] = []

    def note(case, got) -> None:
        if got.kind not in ("refused", "equal", "inert"):
            found.append(f"{got.kind}: {case.describe()}: {got.detail}")

    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        tally = stage_doors.run_cases(pipes, cases, note)
    assert not found, "\n".join(found)
    assert set(tally) == set(stage_doors.STAGES), tally  # every artifact kind is edited
    for stage, per in tally.items():  # and both outcomes are exercised
        assert per.get("refused", 0) > 0 and per.get("equal" if stage != "report" else "inert", 0) > 0, (stage, per)


def test_a_loop_tree_with_a_tile_step_halved_is_refused_by_every_later_stage(compiled):
    """The motivating case of issue #22: it ran, and gave 8,188 wrong outputs of 16,384."""
    from fspyre.errors import TilingError
    from fspyre.ir.serialize import from_json
    from fspyre.stages.allocation import allocate
    from fspyre.stages.program import emit_program
    from fspyre.stages.residency import keep_resident
    from fspyre.stages.split_plan import divide_work

    tree, split, alloc = (compiled.stages[k] for k in ("loop_tree", "split_plan", "allocation"))
    doc = json.loads(dumps(tree))
    doc.pop("_format")
    steps = [p for p, v in positions(doc) if isinstance(v, dict) and v.get("_type") == "TileStep"]
    assert steps
    for path in steps:
        step = json.loads(json.dumps(doc))
        for k in path:
            step = step[k]
        halved = replaced(doc, path + ("extent",), step["extent"] // 2)
        with pytest.raises(TilingError, match="records steps"):
            loads(json.dumps({"_format": FORMAT, **halved}))
        bad = from_json(halved)  # built without the loader's check, as an embedder's own code might
        m = spyre(cores=4)
        for call in (lambda: keep_resident(bad, m), lambda: divide_work(bad, m), lambda: allocate(bad, split, m),
                     lambda: emit_program(bad, split, alloc, m)):
            with pytest.raises(TilingError, match="records steps"):
                call()


def test_a_loop_tree_with_a_range_or_count_edited_is_refused_by_every_later_stage(compiled):
    """The classes the first stage-doors run found answered wrongly (36 of its 5,506 cases): an
    op's per-tile range or a loop's count edited, every step record still consistent. The tree
    verifier now checks that each op and its tails compute every point of the op's iteration
    space once."""
    from fspyre.errors import TilingError
    from fspyre.ir.serialize import from_json
    from fspyre.stages.allocation import allocate
    from fspyre.stages.program import emit_program
    from fspyre.stages.residency import keep_resident
    from fspyre.stages.split_plan import divide_work

    tree, split, alloc = (compiled.stages[k] for k in ("loop_tree", "split_plan", "allocation"))
    doc = json.loads(dumps(tree))
    doc.pop("_format")
    counts = [p + ("count",) for p, v in positions(doc) if isinstance(v, dict) and v.get("_type") == "Loop"]
    sizes = [p + ("size",) for p, v in positions(doc) if isinstance(v, dict) and v.get("_type") == "Dim"
             and "op" in p and v["size"] > 1]
    assert counts and len(sizes) > 4
    m = spyre(cores=4)
    for path in counts + sizes:
        value = doc
        for k in path:
            value = value[k]
        for edit in (value - 1, value // 2):
            if edit < 1:
                continue
            bad = replaced(doc, path, edit)
            with pytest.raises(TilingError, match="points of its iteration space|outside the dim"):
                loads(json.dumps({"_format": FORMAT, **bad}))
            built = from_json(bad)  # built without the loader's check
            for call in (lambda: keep_resident(built, m), lambda: divide_work(built, m),
                         lambda: allocate(built, split, m), lambda: emit_program(built, split, alloc, m)):
                with pytest.raises(TilingError):
                    call()
