"""Bad input through the command line, the API and JSON documents (issue #22).

Each case is refused with one line (an FspyreError; the command: exit 2 and one line on
stderr) or, where the input is valid after all (a float64 array for a float32 input, a NaN,
a stage file with a byte-order mark), gives the right answer: the run equals the untiled
reference on the same arrays. None raises anything else, takes more than ``LIMIT`` CPU
seconds, or passes silently (exit 0 or a result where the input is wrong). The cases:

- ``fspyre run --inputs`` with bad .npz files (dtypes, shapes, names, pickled object
  arrays, files that are not archives) and the same arrays through ``run``, ``evaluate``
  and ``check``; a pickled array is never unpickled;
- ``fspyre compile --from DIR`` with every saved stage file replaced by a broken one;
- FILE.py files that raise, recurse, exit or return the wrong thing, under compile, check
  and run;
- sizes, core counts and hint counts that are negative, zero, NaN, fractional, strings or
  past the device (2^40 and 2^70 elements: one line, quickly).
"""

from __future__ import annotations

import contextlib
import io
import json
import signal
import time
import warnings
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import fspyre
from fspyre import cli
from fspyre.errors import FspyreError
from fspyre.machine.spyre import spyre

LIMIT = 5.0  # CPU seconds a case may take

GRAPH_FILE = '''
import fspyre


def build():
    g = fspyre.GraphBuilder("bad_inputs")
    A, B = g.dim("A", 4), g.dim("B", 64)
    x = g.input("x", (A, B), "float32")
    n = g.input("n", (A, B), "int32")
    with g.hint(slices={"B": 2}):
        g.output("y", g.add(g.exp(x), g.cast(n, "float32")))
    return g.build()
'''


def graph() -> fspyre.Graph:
    scope: dict[str, Any] = {}
    exec(compile(GRAPH_FILE, "graph", "exec"), scope)
    return scope["build"]()


SHAPE = (4, 64)


def good_inputs() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {"x": rng.uniform(-2, 2, SHAPE).astype(np.float32), "n": rng.integers(-8, 8, SHAPE).astype(np.int32)}


@contextlib.contextmanager
def bounded() -> Iterator[list[float]]:
    """The block's CPU time; a block still running after ``4 * LIMIT`` CPU seconds is stopped
    (a hang fails the case instead of the test session)."""

    def stop(signum: int, frame: Any) -> None:
        raise TimeoutError(f"still running after {4 * LIMIT} CPU seconds")

    took = [0.0]
    old = signal.signal(signal.SIGVTALRM, stop)
    signal.setitimer(signal.ITIMER_VIRTUAL, 4 * LIMIT)
    start = time.process_time()
    try:
        yield took
    finally:
        signal.setitimer(signal.ITIMER_VIRTUAL, 0)
        signal.signal(signal.SIGVTALRM, old)
        took[0] = time.process_time() - start
    assert took[0] < LIMIT, f"took {took[0]:.1f} s CPU"


def refused_or(call: Callable[[], Any], warned: list[str] | None = None) -> tuple[str, Any]:
    """("refused", message) for a one-line FspyreError, else ("done", the result); anything
    else fails the case. ``warned`` collects the FspyreWarnings of the call."""
    with bounded(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            return "done", call()
        except FspyreError as err:
            message = str(err)
            assert message and "\n" not in message, repr(message)
            return "refused", message
        finally:
            if warned is not None:
                warned.extend(str(w.message) for w in caught if issubclass(w.category, fspyre.FspyreWarning))


def command(*args: str) -> tuple[int, str, str]:
    """``fspyre ARGS`` in this process: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with bounded(), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), warnings.catch_warnings():
        rc = cli.main(list(args))
    return rc, out.getvalue(), err.getvalue()


def one_line_refusal(rc: int, err: str) -> str:
    assert rc == 2, (rc, err)
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    errors = [line for line in lines if not line.startswith("warning: ")]
    assert len(errors) == 1 and errors[0].startswith("fspyre: "), err
    return errors[0]


# -- arrays: the npz files of `fspyre run --inputs`, and run / evaluate / check ---------------
def _arrays() -> list[tuple[str, Callable[[dict[str, np.ndarray]], dict[str, Any]]]]:
    """(name, edit of the good inputs) of every bad (or doubtful) array set."""
    out: list[tuple[str, Callable[[dict[str, np.ndarray]], dict[str, Any]]]] = []
    dtypes = ["float64", "float16", "int64", "int16", "uint8", "uint64", "bool", "complex64", "complex128",
              "U3", "S3", "datetime64[s]", "timedelta64[s]", "V4", "object"]
    for name in ("x", "n"):
        for dt in dtypes:
            def edit(a, name=name, dt=dt):
                if dt == "object":
                    arr = np.empty(SHAPE, dtype=object)
                    arr[...] = 1.5
                    return {**a, name: arr}
                with np.errstate(all="ignore"):
                    return {**a, name: a[name].astype(dt)}
            out.append((f"{name} as {dt}", edit))
        for shape in [(64, 4), (4,), (64,), (4, 64, 1), (1, 4, 64), (), (0, 64), (4, 65), (3, 64), (8, 64),
                      (4, 0), (256,)]:
            out.append((f"{name} of shape {shape}",
                        lambda a, name=name, shape=shape: {**a, name: np.resize(a[name], shape)}))
        out.append((f"{name} missing", lambda a, name=name: {k: v for k, v in a.items() if k != name}))
        out.append((f"{name} renamed", lambda a, name=name: {**{k: v for k, v in a.items() if k != name},
                                                             name.upper(): a[name]}))
        out.append((f"{name} non-contiguous", lambda a, name=name: {**a, name: np.asfortranarray(a[name])}))
        out.append((f"{name} big-endian",
                    lambda a, name=name: {**a, name: a[name].astype(a[name].dtype.newbyteorder())}))
    out.append(("an extra input", lambda a: {**a, "z": a["x"]}))
    out.append(("no inputs", lambda a: {}))
    out.append(("n past int32", lambda a: {**a, "n": a["n"].astype(np.int64) + 2**40}))
    out.append(("n below int32", lambda a: {**a, "n": a["n"].astype(np.int64) - 2**40}))
    for value in (np.nan, np.inf, -np.inf, -0.0, 3e38, 1e-45):
        out.append((f"x holding {value}", lambda a, value=value: {**a, "x": np.full(SHAPE, value, np.float32)}))
    out.append(("x as float64 past float32", lambda a: {**a, "x": np.full(SHAPE, 1e300)}))
    return out


ARRAYS = _arrays()


@pytest.fixture(scope="module")
def compiled() -> fspyre.Compilation:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fspyre.compile(graph(), spyre(cores=4), tiling="hints")


def _same_as_reference(comp: fspyre.Compilation, inputs: dict[str, Any], got: dict[str, np.ndarray]) -> None:
    """An accepted input set gives what the reference gives on the same arrays."""
    report = fspyre.check(comp.graph, inputs, machine=comp.machine, comp=comp)
    assert report.equal, str(report)
    for name, arr in fspyre.evaluate(comp.graph, inputs).items():
        assert got[name].dtype == arr.dtype and got[name].shape == arr.shape, name
        np.testing.assert_array_equal(np.isnan(got[name]), np.isnan(arr))


ENTRY_POINTS = {
    "run": lambda comp, inputs: fspyre.run(comp, inputs),
    "evaluate": lambda comp, inputs: fspyre.evaluate(comp.graph, inputs),
    "check": lambda comp, inputs: fspyre.check(comp.graph, inputs, machine=comp.machine, comp=comp),
}


@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
@pytest.mark.parametrize("name,edit", ARRAYS, ids=[n for n, _ in ARRAYS])
def test_bad_arrays_through_the_api(compiled, entry, name, edit):
    inputs = edit(good_inputs())
    kind, got = refused_or(lambda: ENTRY_POINTS[entry](compiled, inputs))
    if kind == "done" and entry == "run":
        _same_as_reference(compiled, inputs, got)
    if kind == "done" and entry == "check":
        assert got.equal, str(got)
    _no_silent_garbage(name, kind)


def _no_silent_garbage(name: str, kind: str) -> None:
    """Arrays whose values mean nothing as the input's dtype, of the wrong shape or under the
    wrong names are refused; only lossless or same-kind conversions run."""
    meaningless = any(w in name for w in ("complex", "U3", "S3", "datetime", "timedelta", "V4", "object", "shape",
                                          "missing", "renamed", "extra", "no inputs", "past int32",
                                          "below int32"))
    if meaningless:
        assert kind == "refused", f"{name}: accepted"


@pytest.fixture(scope="module")
def graph_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("bad_input") / "graph.py"
    path.write_text(GRAPH_FILE)
    return path


@pytest.mark.parametrize("name,edit", ARRAYS, ids=[n for n, _ in ARRAYS])
def test_bad_npz_through_fspyre_run(compiled, graph_file, tmp_path, name, edit):
    inputs = edit(good_inputs())
    path = tmp_path / "in.npz"
    np.savez(path, **inputs)  # an object array is pickled into the file
    out = tmp_path / "out.npz"
    rc, stdout, err = command("run", str(graph_file), "--tiling", "hints", "--cores", "4", "--inputs", str(path),
                              "--out", str(out))
    if rc == 0:
        with np.load(out) as data:
            _same_as_reference(compiled, inputs, {k: data[k] for k in data.files})
        _no_silent_garbage(name, "done")
    else:
        one_line_refusal(rc, err)


class _Marker:
    """Unpickling this creates the file ``path``: what a hostile .npz would do."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return (Path.touch, (self.path,))


def _npz_files(tmp: Path) -> list[tuple[str, Callable[[Path], None]]]:
    """(name, writer of a bad .npz at the path) for files that are not input archives."""
    good = good_inputs()

    def zipped(members: dict[str, bytes]) -> Callable[[Path], None]:
        def write(path: Path) -> None:
            with zipfile.ZipFile(path, "w") as z:
                for member, data in members.items():
                    z.writestr(member, data)
        return write

    def npy(arr: np.ndarray, allow_pickle: bool = False) -> bytes:
        buf = io.BytesIO()
        np.save(buf, arr, allow_pickle=allow_pickle)
        return buf.getvalue()

    hostile = np.empty((1,), dtype=object)
    hostile[0] = _Marker(tmp / "unpickled")
    header = npy(good["x"])
    big_header = np.lib.format.magic(1, 0) + _npy_header("<f4", (2**40, 2**40))
    return [
        ("a text file", lambda p: p.write_text("x = 1\n")),
        ("an empty file", lambda p: p.write_bytes(b"")),
        ("a truncated archive", lambda p: (np.savez(p, **good), p.write_bytes(p.read_bytes()[:200]))),
        ("a .npy, not a .npz", lambda p: p.write_bytes(npy(good["x"]))),
        ("binary noise", lambda p: p.write_bytes(bytes(range(256)) * 8)),
        ("a zip of text", zipped({"x.npy": b"hello", "n.npy": b"world"})),
        ("a zip with no arrays", zipped({"readme.txt": b"nothing"})),
        ("a pickled object array", zipped({"x.npy": npy(hostile, allow_pickle=True), "n.npy": npy(good["n"])})),
        ("an array claiming 2^80 elements", zipped({"x.npy": big_header, "n.npy": npy(good["n"])})),
        ("a directory", lambda p: p.mkdir()),
        ("no such file", lambda p: None),
        ("a half-written array", zipped({"x.npy": header[: len(header) // 2], "n.npy": npy(good["n"])})),
    ]


def _npy_header(descr: str, shape: tuple[int, ...]) -> bytes:
    text = repr({"descr": descr, "fortran_order": False, "shape": shape}).encode()
    pad = 64 - (10 + len(text) + 1) % 64
    text = text + b" " * pad + b"\n"
    return len(text).to_bytes(2, "little") + text


NPZ_FILES = [n for n, _ in _npz_files(Path("/nonexistent"))]


@pytest.mark.parametrize("which", NPZ_FILES)
def test_files_that_are_not_input_archives(graph_file, tmp_path, which):
    write = dict(_npz_files(tmp_path))[which]
    path = tmp_path / "in.npz"
    write(path)
    rc, _, err = command("run", str(graph_file), "--tiling", "none", "--cores", "4", "--inputs", str(path))
    line = one_line_refusal(rc, err)
    assert "--inputs" in line, line
    assert not (tmp_path / "unpickled").exists(), "the file's pickle was loaded"


# -- JSON: `fspyre compile --from DIR` with each saved stage file broken ----------------------
@pytest.fixture(scope="module")
def saved(graph_file, tmp_path_factory) -> tuple[Path, str]:
    """The stage files of a compile of the graph file, and the bundle it emitted."""
    out = tmp_path_factory.mktemp("saved")
    rc, _, err = command("compile", str(graph_file), "--cores", "4", "--tiling", "hints", "--emit", "json,mlir",
                         "--out", str(out))
    assert rc == 0, err
    return out, (out / "bundle.mlir").read_text()


BROKEN = {
    "empty": lambda text, others: "",
    "not JSON": lambda text, others: "{",
    "null": lambda text, others: "null",
    "a list": lambda text, others: "[]",
    "an empty object": lambda text, others: "{}",
    "another format": lambda text, others: json.dumps({**json.loads(text), "_format": 99}),
    "no format": lambda text, others: json.dumps({k: v for k, v in json.loads(text).items() if k != "_format"}),
    "cut in half": lambda text, others: text[: len(text) // 2],
    "another stage's file": lambda text, others: others,
    "a byte-order mark": lambda text, others: "\ufeff" + text,
    "deeply nested": lambda text, others: "[" * 100_000 + "]" * 100_000,
    "a huge number": lambda text, others: text.replace('"cores": 4', '"cores": 1e400') if '"cores": 4' in text
    else text.replace("[", "[1e400, ", 1),
    "NaN": lambda text, others: text.replace("4", "NaN", 1),
    "no _type": lambda text, others: json.dumps({k: v for k, v in json.loads(text).items() if k != "_type"}),
    "another _type": lambda text, others: json.dumps({**json.loads(text), "_type": "Program"}),
    "an unknown field": lambda text, others: json.dumps({**json.loads(text), "extra": 1}),
    "a duplicated key": lambda text, others: text.replace("{", '{"_format": 2, ', 1),
    "CRLF line ends": lambda text, others: text.replace("\n", "\r\n"),
}


def _stage_files(saved_dir: Path) -> list[str]:
    return sorted(p.name for p in saved_dir.glob("[0-9][0-9]_*.json"))


STAGE_FILES = ["00_graph.json", "01_tiling_plan.json", "02_loop_tree.json", "03_resident_tree.json",
               "04_split_plan.json", "05_allocation.json", "06_program.json"]


def test_the_stage_files_are_the_ones_broken_below(saved):
    assert _stage_files(saved[0]) == STAGE_FILES


@pytest.mark.parametrize("broken", list(BROKEN))
@pytest.mark.parametrize("stage_file", STAGE_FILES)
def test_a_broken_stage_file_through_compile_from(saved, graph_file, tmp_path, stage_file, broken):
    source, bundle = saved
    names = _stage_files(source)
    k = names.index(stage_file)
    d = tmp_path / "from"
    d.mkdir()
    for name in names[: k + 1]:
        (d / name).write_text((source / name).read_text(), newline="")
    other = (source / names[k - 1 if k else 1]).read_text()
    (d / stage_file).write_text(BROKEN[broken]((source / stage_file).read_text(), other), newline="")
    rc, _, err = command("compile", "--from", str(d), "--cores", "4", "--tiling", "hints", "--emit", "mlir",
                         "--out", str(d / "out"))
    if rc == 0:  # an edit that changes nothing the stages read: the same program
        assert broken in ("a byte-order mark", "CRLF line ends", "a huge number", "an unknown field") or \
            (d / "out" / "bundle.mlir").read_text() == bundle, err
        assert (d / "out" / "bundle.mlir").read_text() == bundle, f"{broken}: compiled another program"
    else:
        line = one_line_refusal(rc, err)
        assert stage_file in line or "--from" in line or str(d) in line, line


@pytest.mark.parametrize("what", ["an empty directory", "no such directory", "a file", "only a program",
                                  "a stray stage name", "two graphs"])
def test_a_broken_from_directory(saved, tmp_path, what):
    source, _ = saved
    d = tmp_path / "from"
    if what != "no such directory":
        d.mkdir() if what != "a file" else d.write_text("x")
    if what == "only a program":
        (d / "06_program.json").write_text((source / "06_program.json").read_text())
    if what == "a stray stage name":
        (d / "00_graph.json").write_text((source / "00_graph.json").read_text())
        (d / "01_bogus.json").write_text((source / "01_tiling_plan.json").read_text())
    if what == "two graphs":
        (d / "00_graph.json").write_text((source / "00_graph.json").read_text())
        (d / "01_graph.json").write_text((source / "00_graph.json").read_text())
    rc, _, err = command("compile", "--from", str(d), "--cores", "4")
    one_line_refusal(rc, err)


# -- FILE.py files that raise, recurse, exit or return the wrong thing -------------------------
GOOD_BUILD = GRAPH_FILE.split("def build():")[1]
FILES = {
    "raises at import": "raise ValueError('boom')\n",
    "raises in build": "def build():\n    raise ValueError('boom')\n",
    "raises a BaseException": "class Stop(BaseException):\n    pass\n\n\ndef build():\n    raise Stop('x')\n",
    "raises with a multi-line message": "def build():\n    raise RuntimeError('line one\\nline two')\n",
    "raises with no message": "def build():\n    assert False\n",
    "recurses at import": "def f():\n    return f()\n\n\nf()\n",
    "recurses in build": "def build():\n    return build()\n",
    "sys.exit(0) at import": "import sys\nsys.exit(0)\n",
    "sys.exit(1) in build": "import sys\n\n\ndef build():\n    sys.exit(1)\n",
    "sys.exit('text') in build": "import sys\n\n\ndef build():\n    sys.exit('bye')\n",
    "exit() in build": "def build():\n    exit()\n",
    "raise SystemExit in build": "def build():\n    raise SystemExit\n",
    "os._exit(0) at import": "import os\nos._exit(0)\n",
    "os._exit(0) in build": "import os\n\n\ndef build():\n    os._exit(0)\n",
    "imports a missing module": "import no_such_module_xyz\n\n\ndef build():\n    pass\n",
    "imports itself": "import graph_self\n\n\ndef build():\n    return graph_self.build()\n",
    "build returns None": "def build():\n    return None\n",
    "build returns a number": "def build():\n    return 5\n",
    "build returns a builder": "import fspyre\n\n\ndef build():\n    return fspyre.GraphBuilder('g')\n",
    "build returns a list": "def build():\n    return []\n",
    "build is not a function": "build = 5\n",
    "build takes an argument": "def build(x):\n    return x\n",
    "an empty file": "",
    "only comments": "# nothing\n",
    "a syntax error": "def build(:\n",
    "a tab and space mix": "def build():\n\tif True:\n        return 1\n",
    "null bytes": "def build():\n    return 1\x00\n",
    "neither build nor model": "x = 1\n",
    "a model but no example_inputs": "def model(x):\n    return x\n",
    "example_inputs raises": "def model(x):\n    return x\n\n\ndef example_inputs():\n    raise ValueError('no')\n",
    "example_inputs returns strings": "def model(x):\n    return x\n\n\ndef example_inputs():\n    return ('a',)\n",
    "example_inputs of the wrong count": "import torch\n\n\ndef model(x, y):\n    return x + y\n\n\n"
                                         "def example_inputs():\n    return (torch.ones(4, 64),)\n",
    "model raises": "import torch\n\n\ndef model(x):\n    raise ValueError('model')\n\n\n"
                    "def example_inputs():\n    return (torch.ones(4, 64),)\n",
    "model is not callable": "import torch\n\nmodel = 5\n\n\ndef example_inputs():\n    return (torch.ones(4, 64),)\n",
    "model returns a string": "import torch\n\n\ndef model(x):\n    return 'x'\n\n\n"
                              "def example_inputs():\n    return (torch.ones(4, 64),)\n",
    "model exits": "import sys\nimport torch\n\n\ndef model(x):\n    sys.exit(0)\n\n\n"
                   "def example_inputs():\n    return (torch.ones(4, 64),)\n",
    "example_inputs of 2^70 elements": "import torch\n\n\ndef model(x):\n    return x\n\n\ndef example_inputs():\n"
                                       "    return (torch.empty(2**35, 2**35, device='meta'),)\n",
    "a dim of 2^40": "import fspyre\n\n\ndef build():\n    g = fspyre.GraphBuilder('big')\n"
                     "    x = g.input('x', (g.dim('A', 2**40),), 'float16')\n    g.output('y', g.exp(x))\n"
                     "    return g.build()\n",
    "a dim of 2^70": "import fspyre\n\n\ndef build():\n    g = fspyre.GraphBuilder('big')\n"
                     "    x = g.input('x', (g.dim('A', 2**70),), 'float16')\n    g.output('y', g.exp(x))\n"
                     "    return g.build()\n",
}


@pytest.mark.parametrize("cmd", ["compile", "check", "run"])
@pytest.mark.parametrize("what", list(FILES))
def test_a_bad_file(tmp_path, cmd, what):
    name = "graph_self.py" if what == "imports itself" else "graph.py"
    path = tmp_path / name
    path.write_text(FILES[what])
    rc, out, err = command(cmd, str(path), "--cores", "4", "--tiling", "auto")
    one_line_refusal(rc, err)


@pytest.mark.parametrize("what", ["a byte-order mark", "CRLF line ends", "a path with spaces"])
def test_a_good_file_however_saved(tmp_path, what):
    d = tmp_path / ("with space" if what == "a path with spaces" else "plain")
    d.mkdir()
    path = d / "graph.py"
    text = {"a byte-order mark": "\ufeff" + GRAPH_FILE, "CRLF line ends": GRAPH_FILE.replace("\n", "\r\n")}
    path.write_bytes(text.get(what, GRAPH_FILE).encode())
    rc, out, err = command("check", str(path), "--cores", "4", "--tiling", "hints")
    assert rc == 0, err


# -- sizes, core counts and hint counts --------------------------------------------------------
# (None is a symbolic dim: valid)
BAD_SIZES = [-1, 0, -(2**40), 1.5, float("nan"), float("inf"), "64", True, [64], (64,), 2**70, -(2**70),
             np.float64(64.0), complex(64, 0)]


def _one_dim(size, dtype: str = "float16", slices: Any = None, work_div: Any = None) -> fspyre.Graph:
    g = fspyre.GraphBuilder("sizes")
    A = g.dim("A", size)
    x = g.input("x", (A,), dtype)
    with g.hint(**{k: v for k, v in (("slices", slices), ("work_div", work_div)) if v is not None}):
        g.output("y", g.exp(x))
    return g.build()


@pytest.mark.parametrize("tiling", ["none", "hints", "auto"])
@pytest.mark.parametrize("size", BAD_SIZES, ids=repr)
def test_a_bad_dim_size(size, tiling):
    kind, _ = refused_or(lambda: fspyre.compile(_one_dim(size), spyre(cores=4), tiling=tiling))
    assert kind == "refused"


@pytest.mark.parametrize("tiling", ["none", "hints", "auto"])
@pytest.mark.parametrize("dtype", ["float16", "float32", "bool"])
@pytest.mark.parametrize("exponent", [40, 47, 70, 200])
def test_sizes_past_the_device_are_refused_in_one_line_quickly(exponent, dtype, tiling):
    kind, message = refused_or(lambda: fspyre.compile(_one_dim(2**exponent, dtype), spyre(cores=4), tiling=tiling))
    assert kind == "refused" and "device memory" in message, message


@pytest.mark.parametrize("shape", [(2**20, 2**20, 2**20), (2**31, 2**31), (2**62, 2), (3, 2**45)])
def test_a_product_of_dims_past_the_device_is_refused(shape):
    def build():
        g = fspyre.GraphBuilder("wide")
        dims = [g.dim(f"D{i}", s) for i, s in enumerate(shape)]
        g.output("y", g.neg(g.input("x", dims, "float32")))
        return g.build()

    kind, message = refused_or(lambda: fspyre.compile(build(), spyre(cores=4), tiling="auto"))
    assert kind == "refused" and "device memory" in message, message


@pytest.mark.parametrize("cores", [0, -1, 33, 2**70, 1.5, "4", None, True, float("nan"), [4]], ids=repr)
def test_a_bad_core_count(cores):
    kind, _ = refused_or(lambda: spyre(cores=cores))
    assert kind == "refused"


@pytest.mark.parametrize("key", ["slices", "work_div"])
@pytest.mark.parametrize("count", [0, -1, 2**70, 1.5, float("nan"), "2", None, True, [2]], ids=repr)
def test_a_bad_hint_count(key, count):
    """A count that is no count is refused; a count past the dim or the cores is a hint not
    honoured: it warns, and the program is right."""
    warned: list[str] = []
    kind, comp = refused_or(lambda: fspyre.compile(_one_dim(256, **{key: {"A": count}}), spyre(cores=4),
                                                   tiling="hints"), warned)
    if kind == "done":
        assert type(count) is int and count > 256 and warned, (count, warned)
        assert fspyre.check(comp.graph, machine=comp.machine, comp=comp).equal


def test_a_2_to_the_24_element_1d_graph_compiles_with_auto_in_a_tenth_of_a_second():
    """In a fresh process (nothing cached), CPU time of compile alone, the pipeline imported."""
    import subprocess
    import sys

    code = (
        "import time, warnings\nwarnings.simplefilter('ignore')\nimport fspyre, fspyre.pipeline\n"
        "from fspyre.machine.spyre import spyre\n"
        "g = fspyre.GraphBuilder('big')\nx = g.input('x', (g.dim('A', 2**24),), 'float16')\n"
        "g.output('y', g.exp(x))\ngraph = g.build()\nm = spyre()\n"
        "t = time.process_time()\nfspyre.compile(graph, m, tiling='auto')\nprint(time.process_time() - t)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert float(done.stdout) <= 0.1, done.stdout
