"""The ``fspyre`` command (also ``python -m fspyre``): demo, compile, check, coverage.

Anything a user can fix -- every FspyreError, a missing FILE.py, one that does not parse or
defines neither ``build()`` nor a torch ``model`` -- prints one line on stderr and exits 2.
Anything else is a bug in fspyre: a short "internal error" line, and the traceback only
under ``--debug``. ``check`` exits 0 when the compiled program agrees with the reference
and 1 when it does not, so scripts and CI can branch on the verdict.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import functools
import importlib.util
import itertools
import json
import os
import shutil
import sys
import time
import traceback
import warnings
import zipfile
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from importlib.machinery import SourceFileLoader
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NoReturn

import fspyre
from fspyre.errors import FspyreError, FspyreWarning
from fspyre.ir.kinds import FUSE_MODES, LX_SOLVERS, TILINGS
from fspyre.machine.spyre import MAX_CORES, Machine

# Parsing the command line needs none of these: `fspyre --help` and usage errors import no
# sympy, numpy or torch, and each command imports what it uses (the front end, torch, only for
# torch files).
if TYPE_CHECKING:
    import numpy as np

    from fspyre.frontend.files import TorchProgram
    from fspyre.ir.graph import Graph
    from fspyre.ir.program import Program
    from fspyre.pipeline import Compilation, StageCallback
    from fspyre.stages.allocation import AllocationOptions

EMITS = ("stages", "tree", "dot", "svg", "program", "mlir", "mlir-generic", "json", "unrolled", "report", "memmap",
         "sdsc", "all")
# What ``--emit all`` writes: every kind (svg only where graphviz's dot is installed).
ALL = tuple(k for k in EMITS if k != "all")
DEMO_OUT = "fspyre-out"


class UsageError(FspyreError):
    """A command-line input fspyre cannot use: a missing or broken FILE.py, a bad option."""


# -- the canonical example ---------------------------------------------------------------------


def canonical_example(rows: int = 1024, cols: int = 4096, dtype: str = "float16") -> Graph:
    """The seed's example: y = a + b; z = y * c, tiled A:2 outside, B:4 inside."""
    g = fspyre.GraphBuilder("add_mul")
    A, B = g.dim("A", rows), g.dim("B", cols)
    a, b, c = (g.input(n, (A, B), dtype) for n in "abc")
    with g.hint(slices={"A": 2}):
        with g.hint(slices={"B": 4}):
            y = g.add(a, b)
            z = g.mul(y, c)
    g.output("z", z)
    return g.build()


# -- loading FILE.py ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Workload:
    """What a FILE.py gives: a graph, and for a torch file its example inputs and eager oracle."""

    path: Path
    graph: Graph
    inputs: Mapping[str, np.ndarray] | None = None
    torch: TorchProgram | None = None  # set when FILE.py defines a torch model: eager outputs, tolerance


def _top_level_names(module: ast.Module) -> set[str]:
    """Names a file binds at module level, including inside top-level if/try/with blocks,
    so the right loader is chosen without running the file twice."""
    names: set[str] = set()
    todo: list[ast.AST] = list(module.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        else:
            for field in ("body", "orelse", "finalbody", "handlers"):
                todo.extend(s for s in getattr(node, field, ()) if isinstance(s, ast.AST))
    return names


def _parse(path: Path) -> ast.Module:
    if not path.is_file():
        raise UsageError(f"{path}: no such file; pass a Python file defining build() -> Graph, "
                         f"or a torch `model` and `example_inputs()`")
    try:
        # utf-8-sig: a file saved with a byte-order mark is read as Python reads it
        return ast.parse(path.read_text(encoding="utf-8-sig"), filename=str(path))
    except SyntaxError as err:
        raise UsageError(f"{path}:{err.lineno}: syntax error: {err.msg}") from err
    except (UnicodeDecodeError, ValueError) as err:
        raise UsageError(f"{path}: not a readable Python source file ({err})") from err


def _run_file(path: Path) -> Any:
    """Execute FILE.py as a module; its own directory is importable while it runs."""
    name = f"fspyre_user_{path.stem}"
    # an explicit source loader: FILE.py is Python whatever its suffix (good.txt too)
    spec = importlib.util.spec_from_file_location(name, path, loader=SourceFileLoader(name, str(path)))
    if spec is None or spec.loader is None:
        raise UsageError(f"{path}: cannot be loaded as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(path.parent.resolve()))
    try:
        spec.loader.exec_module(module)
    except FspyreError:
        raise
    except SystemExit as stop:
        raise UsageError(_exit_message(path, "running the file", stop)) from None
    except KeyboardInterrupt:
        raise
    except BaseException as err:  # an Exception, or the file's own BaseException subclass
        raise UsageError(f"{path}: running the file raised {type(err).__name__}: {err}") from err
    finally:
        sys.path.remove(str(path.parent.resolve()))
    return module


def _exit_message(path: Path, what: str, stop: SystemExit) -> str:
    """A FILE.py that exits would otherwise end fspyre with its code: ``sys.exit(0)`` in a file
    under ``fspyre check`` would read as a pass."""
    return (f"{path}: {what} called sys.exit({stop.code!r}); fspyre loads the file as a module, so guard "
            f"script code with `if __name__ == \"__main__\":`")


def load_workload(file: str) -> Workload:
    from fspyre.ir.graph import Graph

    path = Path(file)
    names = _top_level_names(_parse(path))
    if "build" in names:
        build = getattr(_run_file(path), "build", None)
        if not callable(build):
            raise UsageError(f"{path}: `build` must be a function returning an fspyre Graph")
        try:
            graph = build()
        except FspyreError:
            raise
        except SystemExit as stop:
            raise UsageError(_exit_message(path, "build()", stop)) from None
        except KeyboardInterrupt:
            raise
        except BaseException as err:  # an Exception, or the file's own BaseException subclass
            raise UsageError(f"{path}: build() raised {type(err).__name__}: {err}") from err
        if not isinstance(graph, Graph):
            raise UsageError(
                f"{path}: build() returned {type(graph).__name__}, not a Graph; end it with `return g.build()`"
            )
        return Workload(path=path, graph=graph)
    if "model" in names:
        from fspyre.frontend.files import load_torch_file

        try:
            loaded = load_torch_file(path)
        except SystemExit as stop:  # from the model while the front end traces it
            raise UsageError(_exit_message(path, "capturing `model`", stop)) from None
        except (Exception, KeyboardInterrupt):
            raise
        except BaseException as err:  # the file's own BaseException subclass
            raise UsageError(f"{path}: capturing `model` raised {type(err).__name__}: {err}") from err
        return Workload(path=path, graph=loaded.graph, inputs=loaded.inputs, torch=loaded)
    raise UsageError(
        f"{path}: defines neither build() -> Graph nor a torch `model` with `example_inputs()`; add one of them"
    )


# -- compiling ---------------------------------------------------------------------------------


def _machine(cores: int) -> Machine:
    return fspyre.machine.spyre(cores=cores)


def _allocation_options(args: argparse.Namespace) -> AllocationOptions:
    """Only the flags the user gave: everything else keeps the allocation stage's defaults."""
    from fspyre.stages.allocation import AllocationOptions

    given: dict[str, Any] = {}
    if args.lx_solver is not None:
        given["lx_solver"] = args.lx_solver
    if args.no_lx:
        given["lx_planning"] = False
    return AllocationOptions(**given)


def _compile(graph: Graph, args: argparse.Namespace, callback: StageCallback | None = None) -> Compilation:
    return fspyre.compile(
        graph, _machine(args.cores), tiling=args.tiling, fuse=args.fuse, residency=not args.no_residency,
        online=not args.no_online, allocation_options=_allocation_options(args),
        callback=_stage_callback(args, callback),
    )


def _pretty(artifact: Any, detailed: bool = False) -> str:
    from fspyre.pretty import pretty

    return pretty(artifact, detailed=detailed).rstrip("\n")


def stage_files(printer: Callable[[Any], str], suffix: str) -> tuple[StageCallback, dict[str, str]]:
    """A pipeline callback collecting ``NN_<stage><suffix>`` texts in stage order."""
    files: dict[str, str] = {}
    counter = itertools.count()

    def collect(name: str, artifact: Any) -> None:
        files[f"{next(counter):02d}_{name}{suffix}"] = printer(artifact)

    return collect, files


def _dot_available() -> bool:
    return shutil.which("dot") is not None


def _require_dot(what: str) -> None:
    if not _dot_available():
        raise UsageError(f"{what} needs graphviz's `dot`, which is not on PATH; install Debian's graphviz package")


def _stage(comp: Compilation, stage: str) -> Any:
    """A stage's artifact; of a symbolic program, its first
    witness's (``loop_tree@S=192``)."""
    if stage in comp.stages:
        return comp.stages[stage]
    return next(a for n, a in comp.stages.items() if n.startswith(f"{stage}@"))


def _concrete(comp: Compilation) -> tuple[Program, str]:
    """The program, or a symbolic program at its first witness size and a line saying so:
    traffic, unrolled code and LX maps are of a program at one size."""
    from fspyre.stages.symbolic import instantiate

    record = comp.program.symbolic
    if record is None:
        return comp.program, ""
    sizes = {d.name: n for d, n in zip(record.dims, record.witnesses[0])}
    at = ", ".join(f"{k}={v}" for k, v in sizes.items())
    return instantiate(comp.program, sizes), f"# the symbolic program at {at}\n"


def _dot_text(comp: Compilation) -> str:
    from fspyre.pretty import to_dot

    # the tree the program runs (LX copies included), its ops' cores and its tensors' memories
    return to_dot(_stage(comp, "resident_tree"), split=_stage(comp, "split_plan"),
                  allocation=_stage(comp, "allocation"))


def _draw_svg(comp: Compilation, path: Path) -> None:
    from fspyre.pretty import render

    _require_dot("the loop-tree picture")
    render(_dot_text(comp), str(path), "svg")


def _memmap_svg(comp: Compilation) -> str:
    from fspyre.pretty.memmap import lx_memmap_svg

    return lx_memmap_svg(_concrete(comp)[0])


def _hbm_memmap_svg(comp: Compilation) -> str:
    from fspyre.pretty.memmap import hbm_memmap_svg

    return hbm_memmap_svg(_concrete(comp)[0])


def _report_text(comp: Compilation) -> str:
    from fspyre.machine.report import traffic_report

    program, note = _concrete(comp)
    return note + str(traffic_report(program)).rstrip("\n")


def _sdsc_files(comp: Compilation) -> dict[str, str]:
    """``sdsc_N.json`` per OpSpec, the names bundle.mlir refers to (never a path elsewhere)."""
    return {Path(name).name: json.dumps(doc, indent=1) for name, doc in comp.sdsc.items()}


Writer = Callable[[Path], None]  # draws a picture into the given file


@dataclass(frozen=True, slots=True, kw_only=True)
class Emitted:
    files: Mapping[str, str | Writer]  # file name -> text or picture, written under --out
    stdout: str | None = None  # what is printed without --out; None: files are always written


def emit(kind: str, comp: Compilation, stage_texts: Mapping[str, str], printer: Callable[[Any], str]) -> Emitted:
    from fspyre.ir.serialize import dumps
    from fspyre.lower.unroll import unroll
    from fspyre.machine.report import traffic_report

    if kind == "stages":
        return Emitted(files=stage_texts, stdout="\n\n".join(f"== {n[:-4]} ==\n{t}" for n, t in stage_texts.items()))
    if kind == "json":
        docs = {name: dumps(a) for name, a in comp.stages.items()}
        files = {f"{i:02d}_{name}.json": doc for i, (name, doc) in enumerate(docs.items())}
        combined = "{\n" + ",\n".join(f'"{name}": {doc}' for name, doc in docs.items()) + "\n}"
        return Emitted(files=files, stdout=combined)
    if kind == "svg":
        return Emitted(files={"loop_tree.svg": lambda path: _draw_svg(comp, path)})
    if kind == "memmap":
        return Emitted(files={"lx_memmap.svg": _memmap_svg(comp), "hbm_memmap.svg": _hbm_memmap_svg(comp)})
    if kind == "sdsc":  # the per-op documents bundle.mlir names
        return Emitted(files=_sdsc_files(comp))
    if kind == "report":
        program, note = _concrete(comp)
        report = traffic_report(program)
        text = note + str(report).rstrip("\n")
        return Emitted(files={"report.txt": text, "report.json": dumps(report)}, stdout=text)
    one: dict[str, tuple[str, Callable[[Compilation], str]]] = {
        "tree": ("loop_tree.txt", lambda c: printer(_stage(c, "loop_tree"))),
        "dot": ("loop_tree.dot", _dot_text),
        "program": ("program.txt", lambda c: printer(c.program)),
        "mlir": ("bundle.mlir", lambda c: c.bundle_mlir),
        "mlir-generic": ("bundle.generic.mlir", lambda c: c.mlir_generic),
        "unrolled": ("unrolled.txt", lambda c: _concrete(c)[1] + printer(unroll(_concrete(c)[0]))),
    }
    file, make = one[kind]
    text = make(comp)
    return Emitted(files={file: text}, stdout=text)


def _write(out: Path, files: Mapping[str, str | Writer]) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, content in files.items():
        p = out / name
        if callable(content):
            content(p)
        else:
            p.write_text(content if content.endswith("\n") else content + "\n")
        written.append(p)
    return written


# -- commands ----------------------------------------------------------------------------------


def cmd_demo(args: argparse.Namespace) -> int:
    out = Path(args.out)
    graph = canonical_example()
    print(f"fspyre demo: {graph.name}, y = a + b; z = y * c over [1024, 4096] float16, "
          f"hints A:2 (outer) and B:4 (inner), {args.cores} cores; artifacts in {out}/")
    written: list[Path] = []
    counter = itertools.count()

    def show(name: str, artifact: Any) -> None:
        text = _pretty(artifact)
        file = f"{next(counter):02d}_{name}.txt"
        written.extend(_write(out, {file: text}))
        print(f"\n== {file[:-4]} ==\n{text}")

    machine = _machine(args.cores)
    start = time.perf_counter()
    comp = fspyre.compile(graph, machine, callback=_stage_callback(args, show))
    compile_s = time.perf_counter() - start

    files: dict[str, str | Writer] = {
        "bundle.mlir": comp.bundle_mlir, "bundle.generic.mlir": comp.mlir_generic, **_sdsc_files(comp),
        "loop_tree.dot": _dot_text(comp),
    }
    if _dot_available():
        files["loop_tree.svg"] = lambda path: _draw_svg(comp, path)
    else:
        print("\nnote: graphviz `dot` not found: loop_tree.svg not drawn (install Debian's graphviz package)")
    files["lx_memmap.svg"] = _memmap_svg(comp)
    files["hbm_memmap.svg"] = _hbm_memmap_svg(comp)
    files["report.txt"] = _report_text(comp)
    written.extend(_write(out, files))

    from fspyre.machine.hostio import random_inputs

    inputs = random_inputs({n: graph.buffer_table()[n].type for n in graph.inputs}, seed=0)
    start = time.perf_counter()
    check = fspyre.check(graph, inputs, machine=machine, comp=comp)
    check_s = time.perf_counter() - start
    print(f"\ncompiled (and printed) in {compile_s:.2f} s; interpreter + reference in {check_s:.2f} s")
    print(f"wrote {len(written)} files to {out}/: {', '.join(p.name for p in written)}")
    print(f"\n{check}")  # the verdict, the memory check and the traffic report
    return 0 if check.equal and check.safe else 1


def cmd_compile(args: argparse.Namespace) -> int:
    kinds = _emit_kinds(args.emit)
    printer = functools.partial(_pretty, detailed=args.detailed)
    stage_cb, stage_texts = stage_files(printer, ".txt") if "stages" in kinds else (None, {})
    if args.from_dir is not None:
        comp = _resume(Path(args.from_dir), args, stage_cb)
    else:
        comp = _compile(load_workload(args.file).graph, args, stage_cb)
    out = Path(args.out) if args.out else (Path(DEMO_OUT) if "all" in args.emit else None)
    shown, written = [], []
    for kind in kinds:
        result = emit(kind, comp, stage_texts, printer)
        if out is None and result.stdout is not None:
            shown.append(result.stdout)
        else:
            written += _write(out or Path(DEMO_OUT), result.files)
    print("\n\n".join(shown + ["\n".join(f"wrote {p}" for p in written)] if written else shown))
    return 0


def _emit_kinds(asked: Sequence[str]) -> list[str]:
    """The kinds asked for, ``all`` expanded, each once in the order given."""
    kinds: list[str] = []
    for kind in asked:
        if kind == "all":
            every = [k for k in ALL if k != "svg" or _dot_available()]
            if not _dot_available():
                print("note: graphviz `dot` not found: --emit all skips loop_tree.svg (install Debian's graphviz)",
                      file=sys.stderr)
            kinds += every
        else:
            kinds.append(kind)
    return list(dict.fromkeys(kinds))


def load_stages(directory: Path) -> dict[str, Any]:
    """The stage artifacts ``--emit json`` wrote into ``directory`` (``NN_<stage>.json``), by stage
    name in file order."""
    from fspyre.ir.serialize import loads

    if not directory.is_dir():
        raise UsageError(f"--from {directory}: not a directory; pass the --out DIR of `fspyre compile --emit json`")
    files = sorted(p for p in directory.glob("[0-9][0-9]_*.json"))
    if not files:
        raise UsageError(f"--from {directory}: no NN_<stage>.json files; write them with "
                         f"`fspyre compile FILE.py --emit json --out {directory}`")
    from fspyre.pipeline import STAGE_TYPES

    stages: dict[str, Any] = {}
    for path in files:
        name = path.stem[3:]
        if name in stages:
            raise UsageError(f"--from {directory}: two files hold the stage {name!r}; keep one")
        try:
            stages[name] = loads(path.read_text(encoding="utf-8-sig"))  # a byte-order mark is no content
        except FspyreError as err:
            raise type(err)(f"{path}: {_one_line(str(err))}") from None
        except (OSError, UnicodeDecodeError) as err:
            raise UsageError(f"{path}: cannot be read as text ({_one_line(str(err))[:200]})") from None
        want = STAGE_TYPES.get(name)
        if want is not None and not isinstance(stages[name], want):
            raise UsageError(f"{path}: holds a {type(stages[name]).__name__}, but the stage {name!r} is a "
                             f"{want.__name__}; the file was renamed or overwritten")
    return stages


def _resume(directory: Path, args: argparse.Namespace, callback: StageCallback | None) -> Compilation:
    from fspyre.pipeline import resume

    return resume(load_stages(directory), _machine(args.cores), args.tiling, fuse=args.fuse,
                  residency=not args.no_residency, online=not args.no_online,
                  allocation_options=_allocation_options(args), callback=_stage_callback(args, callback))


def _eager_lines(t: TorchProgram, got: Mapping[str, np.ndarray]) -> tuple[bool, list[str]]:
    """Machine-model outputs against PyTorch eager, within the tolerance the front end states
    for the file: ``|fspyre - eager| <= atol + rtol * |eager|``."""
    import numpy as np

    ok, lines = True, []
    for name, expected in t.expected.items():
        a = np.asarray(got[name], dtype=np.float64)
        b = np.asarray(expected, dtype=np.float64)
        close = np.isclose(a, b, atol=t.atol, rtol=t.rtol, equal_nan=True)
        # Equal infinities and NaN pairs are agreement (isclose says so); inf - inf would be NaN.
        with np.errstate(invalid="ignore"):
            diff = float(np.where(close & ~np.isfinite(b), 0.0, np.abs(a - b)).max(initial=0.0))
        diff = float("inf") if np.isnan(diff) else diff
        ok &= bool(close.all())
        verdict = "ok" if close.all() else f"MISMATCH at {int((~close).sum())} of {close.size}"
        lines.append(f"  {name}: max|diff|={diff:.3g} {verdict}")
    head = f"eager {t.path.name}: {'EQUAL' if ok else 'NOT EQUAL'} (atol={t.atol:.3g}, rtol={t.rtol:.3g})"
    return ok, [head, *lines]


def cmd_prove(args: argparse.Namespace) -> int:
    from fspyre.pretty import pretty
    from fspyre.proof import prove

    proof = prove(_compile(load_workload(args.file).graph, args))
    print(pretty(proof))
    return 0 if proof.proved else 1 if proof.refuted else 3


def cmd_check(args: argparse.Namespace) -> int:
    work = load_workload(args.file)
    machine = _machine(args.cores)
    comp = _compile(work.graph, args)
    report = fspyre.check(work.graph, work.inputs, seed=args.seed, machine=machine, comp=comp)
    print(report)
    equal = report.equal and report.safe  # a memory-unsafe program is not a pass
    if work.torch is not None:
        eager_ok, lines = _eager_lines(work.torch, fspyre.run(comp, work.torch.inputs))
        print("\n".join(lines))
        equal = equal and eager_ok
    if args.prove:  # beside the sampled run, the static proof for every input (docs/proof.md)
        from fspyre.pretty import pretty
        from fspyre.proof import prove

        proof = prove(comp)
        print(pretty(proof))
        equal = equal and not proof.refuted
    return 0 if equal else 1


def load_arrays(path: Path) -> dict[str, np.ndarray]:
    """The arrays of an ``.npz`` file, by name."""
    import numpy as np

    if not path.is_file():
        raise UsageError(f"--inputs {path}: no such file; save the inputs with numpy.savez({path.name!r}, x=..., ...)")
    try:
        loaded = np.load(path, allow_pickle=False)  # never unpickle: a pickled array is code
        if not isinstance(loaded, np.lib.npyio.NpzFile):
            raise UsageError(f"--inputs {path}: a single {type(loaded).__name__}, not an .npz archive of named "
                             f"arrays; save the inputs with numpy.savez({path.name!r}, x=..., ...)")
        with loaded as data:
            arrays = {name: data[name] for name in data.files}
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile, zlib.error) as err:
        raise UsageError(f"--inputs {path}: not a numpy .npz archive ({type(err).__name__}: "
                         f"{_one_line(str(err))[:200]})") from None
    for name, arr in arrays.items():
        if not isinstance(arr, np.ndarray):  # a member that is not a .npy file reads as its bytes
            raise UsageError(f"--inputs {path}: member {name!r} is not a numpy array (.npy) but "
                             f"{len(arr)} bytes of something else")
    return arrays


def cmd_run(args: argparse.Namespace) -> int:
    """Compile FILE.py and run the program on the machine model with the user's arrays."""
    import numpy as np

    from fspyre.machine.hostio import random_inputs

    work = load_workload(args.file)
    graph = work.graph
    if args.inputs is not None:
        inputs = load_arrays(Path(args.inputs))
        missing = [n for n in graph.inputs if n not in inputs]
        extra = [n for n in inputs if n not in graph.inputs]
        if missing or extra:
            raise UsageError(f"--inputs {args.inputs}: the graph {graph.name} takes {', '.join(graph.inputs)}; "
                             + (f"missing {', '.join(missing)}" if missing else f"no input named {', '.join(extra)}"))
    elif work.inputs is not None:
        inputs = dict(work.inputs)
    else:
        inputs = random_inputs({n: graph.buffer_table()[n].type for n in graph.inputs}, seed=args.seed)
    outputs = fspyre.run(_compile(graph, args), inputs)
    for name, arr in outputs.items():
        print(f"{name}: {arr.dtype}{list(arr.shape)}")
    if args.out_npz is not None:
        out = Path(args.out_npz)
        out.parent.mkdir(parents=True, exist_ok=True)
        np.savez(out, **outputs)  # type: ignore[arg-type]
        print(f"wrote {out}")
    return 0


def cmd_campaign(args: argparse.Namespace) -> int:
    from fspyre.testing.campaign.report import campaign

    return campaign(args)


def cmd_zoo(args: argparse.Namespace) -> int:
    from fspyre.testing.zoo.report import zoo

    return zoo(args)


def cmd_coverage(args: argparse.Namespace) -> int:
    from fspyre.frontend import coverage

    try:
        return int(coverage.main(list(args.rest)) or 0)
    except SystemExit as stop:  # its own argparse: --help, or a usage error already printed
        return stop.code if isinstance(stop.code, int) else 2


# -- argument parsing --------------------------------------------------------------------------


def _emit_list(text: str) -> list[str]:
    kinds = [k.strip() for k in text.split(",") if k.strip()]
    bad = [k for k in kinds if k not in EMITS]
    if bad or not kinds:
        what = ",".join(bad) or repr(text)
        raise argparse.ArgumentTypeError(f"unknown --emit {what}; choose from {', '.join(EMITS)}")
    return kinds


def _cores(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--cores {text!r}: give a whole number of cores, 1..{MAX_CORES}") from None


def _count(flag: str) -> Callable[[str], int]:
    def count(text: str) -> int:
        n = int(text) if text.strip().isdigit() else 0
        if n < 1:
            raise argparse.ArgumentTypeError(f"{flag} {text!r}: give a whole number >= 1")
        return n
    return count


def _shard(text: str) -> Any:
    from fspyre.testing.engines import Shard

    try:
        return Shard.parse(text)
    except FspyreError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _seed(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = -1
    if n < 0:
        raise argparse.ArgumentTypeError(f"--seed {text!r}: give a whole number >= 0")
    return n


def check_flags(args: argparse.Namespace) -> None:
    """Everything the flags alone decide, before FILE.py is loaded (loading a torch file takes
    seconds and runs the user's code)."""
    if hasattr(args, "cores"):
        _machine(args.cores)
    out = getattr(args, "out", None)
    if out and Path(out).exists() and not Path(out).is_dir():
        raise UsageError(f"--out {out}: an existing file, not a directory; choose a directory (or a new name)")
    if "svg" in (getattr(args, "emit", None) or ()):
        _require_dot("--emit svg")
    if args.run is cmd_compile and (args.file is None) == (args.from_dir is None):
        raise UsageError("compile: give FILE.py or --from DIR (the stage artifacts of `--emit json`), not "
                         + ("both" if args.file else "neither"))


def build_parser() -> argparse.ArgumentParser:
    debug = _Parser(add_help=False)
    debug.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                       help="print the traceback of any error")
    debug.add_argument("-v", "--verbose", action="count", default=argparse.SUPPRESS,
                       help="log each stage on stderr: its time and what it decided (-vv: its printed text too)")
    machine = _Parser(add_help=False)
    machine.add_argument("--cores", type=_cores, default=32, help="cores of the Spyre card, 1..32 (default 32)")
    pipeline = _Parser(add_help=False, parents=[machine])
    pipeline.add_argument("--tiling", choices=TILINGS, default="auto",
                          help="auto: honour the hints and search a tiling for every other op (default); "
                               "hints: tile only as the graph's hint scopes say; none: no loops")
    pipeline.add_argument("--fuse", choices=FUSE_MODES, default="max-producers",
                          help="with --tiling auto: which producers join a consumer's loop (default max-producers)")
    pipeline.add_argument("--no-residency", action="store_true",
                          help="do not copy re-read HBM regions into LX or hoist loop-invariant ops")
    pipeline.add_argument("--no-online", action="store_true",
                          help="do not rewrite a softmax or attention tiled over its reduction dim into an online "
                               "softmax (loop fission splits it into passes instead)")
    pipeline.add_argument("--lx-solver", choices=LX_SOLVERS, default=None,
                          help="LX scratchpad packing (default: the allocation stage's, greedy)")
    pipeline.add_argument("--no-lx", action="store_true", help="keep every tensor in HBM (no LX planning)")

    engine = _Parser(add_help=False)  # where a batch of checks runs (fspyre.testing.engines)
    engine.add_argument("--workers", type=_count("--workers"), default=None, metavar="W",
                        help="processes on this host (default 1), or with --ray at most W tasks at a time (default: "
                             "every CPU of the cluster)")
    engine.add_argument("--ray", action="store_true",
                        help="run on Ray (pip install 'fspyre[ray]'): a local cluster of W CPUs, or --address's")
    engine.add_argument("--address", metavar="HOST:PORT",
                        help="join the Ray cluster there (`ray start --head` on its head node) instead of starting a "
                             "local one; implies --ray")
    engine.add_argument("--shard", type=_shard, default=None, metavar="i/N",
                        help="run only share i of N (contiguous blocks, i from 0): one job each in a batch scheduler, "
                             "no Ray needed")

    parser = _Parser(
        prog="fspyre", parents=[debug],
        description="fspyre: a pure-functional staged compiler for IBM Spyre-style accelerators, "
                    "checked by a machine-model interpreter.",
        epilog="FILE.py defines build() -> fspyre Graph, or a torch `model` and `example_inputs()`. "
               "Errors print one line and exit 2; `check` exits 1 when the results differ.",
    )
    parser.add_argument("--version", action="version", version=f"fspyre {fspyre.__version__}")
    parser.set_defaults(debug=False, verbose=0)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def command(name: str, run: Callable[[argparse.Namespace], int], parents: list[_Parser],
                help: str, description: str,
                file: Literal["required", "optional", "none"] = "required") -> argparse.ArgumentParser:
        """A sub-command: the --debug/-v flags and its option groups, its help, its FILE.py argument."""
        groups: list[_Parser] = [debug, *parents]
        cmd = sub.add_parser(name, parents=groups, help=help, description=description)
        if file != "none":
            cmd.add_argument("file", metavar="FILE.py", nargs="?" if file == "optional" else None)
        cmd.set_defaults(run=run)
        return cmd

    demo = command("demo", cmd_demo, [machine], file="none",
                   help="compile, print, run and check the canonical example",
                   description="The seed's canonical example (y = a + b; z = y * c over [1024, 4096] float16, "
                               "A:2 outer, B:4 inner): prints every stage, writes the artifacts (NN_<stage>.txt, "
                               "bundle.mlir, SDSC JSON, loop-tree and LX pictures, traffic report), runs the "
                               "interpreter and prints the equivalence verdict.")
    demo.add_argument("--out", default=DEMO_OUT, metavar="DIR", help=f"artifact directory (default ./{DEMO_OUT})")

    comp = command("compile", cmd_compile, [pipeline], file="optional", help="compile FILE.py and emit artifacts",
                   description="Compile the graph FILE.py defines. Text artifacts print to stdout, or are written "
                               f"under --out; svg and memmap are always files (default ./{DEMO_OUT}).")
    comp.add_argument("--from", dest="from_dir", metavar="DIR",
                      help="instead of FILE.py, continue from the stage artifacts `--emit json` wrote into DIR "
                           "(NN_<stage>.json): the pipeline runs on from the latest stage there")
    comp.add_argument("--emit", type=_emit_list, action="extend", default=None, metavar="KIND[,KIND]",
                      help=f"what to produce, repeatable (default stages): {', '.join(EMITS)}; all: every file "
                           f"(always written, default ./{DEMO_OUT})")
    comp.add_argument("--out", metavar="DIR", help="write the artifacts into DIR instead of printing them")
    comp.add_argument("--detailed", action="store_true",
                      help="print stages, tree, program and unrolled in the detailed view (default compact)")

    chk = command("check", cmd_check, [pipeline],
                  help="compile FILE.py, run it on the machine model, compare with the reference",
                  description="Exit 0 when the interpreter's results equal the untiled reference (and, for a torch "
                              "file, PyTorch eager within the file's tolerance; with --prove, no property of the "
                              "static proof refuted), 1 when not, 2 on an error.")
    chk.add_argument("--seed", type=_seed, default=0, help="seed of the random inputs (default 0)")
    chk.add_argument("--prove", action="store_true",
                     help="also prove the program statically (docs/proof.md): a refuted property fails the check, "
                          "an undecided one is printed")

    command("prove", cmd_prove, [pipeline], help="compile FILE.py and prove its program statically (docs/proof.md)",
            description="Exit 0 when every property is proved, 1 when one is refuted (with a counterexample), 3 "
                        "when one is undecided, 2 on an error.")

    run = command("run", cmd_run, [pipeline],
                  help="compile FILE.py and run it on the machine model with your arrays (.npz)",
                  description="Compile FILE.py, run the program on the machine-model interpreter and save its "
                              "outputs. Inputs come from --inputs (an .npz with one array per graph input, by "
                              "name), else a torch file's example inputs, else random (--seed).")
    run.add_argument("--inputs", metavar="IN.npz", help="the graph inputs, one array per input name")
    run.add_argument("--out", dest="out_npz", metavar="OUT.npz",
                     help="save the outputs here (numpy.savez, one array per output)")
    run.add_argument("--seed", type=_seed, default=0, help="seed of the random inputs without --inputs (default 0)")

    add_batch_parsers(command, engine)

    # Every argument after `coverage` (--help included) belongs to the coverage tool itself.
    cov = sub.add_parser("coverage", add_help=False, parents=[debug], help="the front end's OpInfo coverage table",
                         description="Forwards its arguments to fspyre.frontend.coverage (try --help).")
    cov.set_defaults(run=cmd_coverage, rest=())
    return parser


def add_batch_parsers(command: Callable[..., argparse.ArgumentParser], engine: _Parser) -> None:
    """The commands that run many independent checks, anywhere ``engine``'s flags say."""
    camp = command("campaign", cmd_campaign, [engine], file="none",
                   help="random programs, each compiled, run and checked three ways (needs fspyre[testing])",
                   description="The random-program campaign (fspyre.testing.campaign): programs of seeds "
                               "SEED..SEED+N-1, each compiled twice, memory-checked, run, and compared with the "
                               "untiled evaluator and a numpy reference. Exit 1 on any failure.")
    camp.add_argument("--count", type=_count("--count"), default=1000, metavar="N", help="programs (default 1000)")
    camp.add_argument("--seed", type=_seed, default=0, help="the first program's seed (default 0)")
    camp.add_argument("--time-limit", type=float, default=None, metavar="SEC", help="stop after SEC seconds")
    camp.add_argument("--json", metavar="PATH", help="also write each outcome as a JSON line to PATH")
    camp.add_argument("--merge", nargs="+", metavar="FILE",
                      help="instead of running: the report of the shards' --json files, checked to cover the "
                           "--seed/--count they ran with, each seed once")
    camp.add_argument("--replay", type=_seed, default=None, metavar="SEED", help="run one program, verbosely")
    camp.add_argument("--show", type=int, default=3, help="failures printed per class (default 3)")

    zoo = command("zoo", cmd_zoo, [engine], file="none",
                  help="whole tiny models through both front ends, against eager (needs fspyre[dev])",
                  description="The model zoo (fspyre.testing.zoo): each family's one-layer model with random "
                              "weights, captured and compiled, and through torch.compile(backend='fspyre'), each "
                              "model in a fresh process; its error against float64 eager must stay within twice "
                              "torch's own float32 error. Exit 1 when a family fails.")
    zoo.add_argument("families", nargs="*", metavar="FAMILY", help="the families to verify (default: all)")
    zoo.add_argument("--tiling", choices=("none", "auto"), default="auto",
                     help="tiling of both paths (default auto: compile as users call it)")
    zoo.add_argument("--json", metavar="PATH", help="also write each family's verdict as a JSON line to PATH")


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """One line per warning on stderr: the user's hint problems, without a source location."""
    print(f"warning: {_one_line(str(message))}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # --debug works wherever it is written (argparse would see it only before or only after
    # the command, and coverage forwards everything after its name).
    debug = "--debug" in argv
    argv = [a for a in argv if a != "--debug"]
    parser = build_parser()
    try:
        args, rest = parser.parse_known_args(argv)
        if rest and args.run is not cmd_coverage:
            parser.error(f"unrecognized arguments: {' '.join(rest)}")
    except SystemExit as stop:  # --help and usage errors: argparse already printed
        return stop.code if isinstance(stop.code, int) else 2
    args.rest = tuple(rest)
    args.debug = debug
    if getattr(args, "emit", "stages") is None:
        args.emit = ["stages"]
    with warnings.catch_warnings(), _log_to_stderr(args.verbose):
        warnings.simplefilter("always", FspyreWarning)
        warnings.showwarning = _show_warning
        return _run(args)


class _Parser(argparse.ArgumentParser):
    """argparse with one-line usage errors: the message and where to read the usage."""

    def error(self, message: str) -> NoReturn:
        print(f"fspyre: error: {_one_line(message)} (see `{self.prog} --help`)", file=sys.stderr)
        raise SystemExit(2)


@contextlib.contextmanager
def _exits_refused(file: str) -> Iterator[None]:
    """``os._exit`` raises instead of ending the process while a command runs. FILE.py (or code
    it imports) runs inside fspyre's process, and ``os._exit(0)`` there would end ``fspyre
    check`` with status 0 and no verdict: a silent pass. ``sys.exit`` raises SystemExit, which
    the loaders turn into an error; ``os._exit`` skips every handler, so it is replaced for the
    command's duration (in this process only: a child the file forks exits as it asked)."""
    real, pid = os._exit, os.getpid()

    def refuse(code: int) -> NoReturn:
        if os.getpid() != pid:
            real(code)
        raise UsageError(f"{file}: os._exit({code!r}) was called while fspyre ran the file's code; a file that "
                         f"ends the process cannot be compiled or checked: remove the call, or guard script code "
                         f"with `if __name__ == \"__main__\":`")

    os._exit = refuse  # type: ignore[assignment]  # restored below
    try:
        yield
    finally:
        os._exit = real


def _internal(err: BaseException) -> str:
    """An unexpected exception as one line that always says something: its text, or where it
    was raised when it has none (a bare ``assert``)."""
    text = _one_line(str(err))
    if not text:
        frame = traceback.extract_tb(err.__traceback__)[-1] if err.__traceback__ else None
        text = f"raised at {Path(frame.filename).name}:{frame.lineno} ({frame.line})" if frame else "no message"
    return f"{type(err).__name__}: {text[:200]}"


@contextlib.contextmanager
def _log_to_stderr(verbosity: int) -> Iterator[None]:
    """``-v``: the ``fspyre`` logger's INFO lines on stderr while the command runs; ``-vv``: DEBUG too."""
    if not verbosity:
        yield
        return
    import logging

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("fspyre: %(message)s"))
    log = logging.getLogger("fspyre")
    level, propagate = log.level, log.propagate
    log.addHandler(handler)
    log.setLevel(logging.INFO if verbosity == 1 else logging.DEBUG)
    log.propagate = False
    try:
        yield
    finally:
        log.removeHandler(handler)
        log.setLevel(level)
        log.propagate = propagate


def _stage_callback(args: argparse.Namespace, callback: StageCallback | None) -> StageCallback | None:
    """The pipeline's stage callback: ``callback``, logged first under ``-v``."""
    if not getattr(args, "verbose", 0):
        return callback
    from fspyre.pipeline import log_stages

    return log_stages(callback)


def _run(args: argparse.Namespace) -> int:
    try:
        check_flags(args)
        with _exits_refused(getattr(args, "file", "FILE.py")):
            return args.run(args)
    except FspyreError as err:
        if args.debug:
            traceback.print_exc()
        print(f"fspyre: error: {_one_line(str(err))}", file=sys.stderr)
        return 2
    except NotImplementedError as err:
        if args.debug:
            traceback.print_exc()
        print(f"fspyre: not supported yet: {_one_line(str(err))}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # The reader (``| head``) went away: not an error of ours.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as err:  # an --out path that is a file, a read-only directory, a full disk
        if args.debug:
            traceback.print_exc()
        print(f"fspyre: error: {_one_line(str(err))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("fspyre: interrupted", file=sys.stderr)
        return 130
    except Exception as err:
        if args.debug:
            traceback.print_exc()
        print(f"fspyre: internal error: {_internal(err)} "
              f"(rerun with --debug for the traceback, and please report it)", file=sys.stderr)
        return 2
