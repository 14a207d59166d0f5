"""The gallery (examples/*.py): each captures, evaluates within its stated tolerance of PyTorch
eager, runs on the machine model, tiles by its hints, and runs through torch.compile.

Sizes are shrunk through each file's ``example_inputs`` keywords (model widths stay as in the
file). The tolerance is the file's own (``TorchProgram.atol/rtol``, derived from the formats
in ``fspyre.frontend.files``); the measured errors are printed with ``-s``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import fspyre
from fspyre.check import compare
from fspyre.frontend.files import TorchProgram, load_torch_file
from fspyre.machine.reference import evaluate_with_bounds
from fspyre.pretty import pretty

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SMALL = {
    "add_mul": {"rows": 64, "cols": 256},  # B:4 tiles of 64: whole float16 sticks
    "softmax": {"rows": 32, "cols": 64},
    "softmax_row_tiled": {"rows": 8, "cols": 256},  # N:4 tiles of 64: whole float16 sticks
    "layernorm": {"tokens": 16},
    "rmsnorm": {"tokens": 16},
    "mlp": {"tokens": 8},
    "attention": {"queries": 32, "keys": 16, "head_dim": 8},
    "residual_layernorm": {"tokens": 16},
    "llama_decoder_layer": {"batch": 1, "seq": 16},
}
MACHINE = fspyre.machine.spyre(cores=8)


def test_every_example_is_in_the_gallery_test() -> None:
    assert sorted(p.stem for p in EXAMPLES.glob("*.py")) == sorted(SMALL)


def load(name: str) -> TorchProgram:
    return load_torch_file(EXAMPLES / f"{name}.py", **SMALL[name])


def within(program: TorchProgram, got: dict[str, np.ndarray]) -> float:
    """Assert every output is within the program's tolerance of eager; return max |error|."""
    worst = 0.0
    for name, want in program.expected.items():
        a, b = np.asarray(got[name], np.float64), want.astype(np.float64)
        close = np.isclose(a, b, atol=program.atol, rtol=program.rtol, equal_nan=True)
        assert close.all(), (
            f"{program.path.name} {name}: {int((~close).sum())} values beyond atol={program.atol:.3g} "
            f"rtol={program.rtol:.3g}; max |error| {np.nanmax(np.abs(a - b)):.3g}"
        )
        worst = max(worst, float(np.nanmax(np.abs(a - b))))
    return worst


@pytest.mark.parametrize("name", sorted(SMALL))
def test_matches_eager(name: str) -> None:
    program = load(name)
    worst = within(program, fspyre.evaluate(program.graph, program.inputs))
    print(f"{name}: max |fspyre - eager| = {worst:.3g} (atol {program.atol:.3g}, rtol {program.rtol:.3g})")


@pytest.mark.parametrize("name", sorted(SMALL))
def test_machine_model_agrees_untiled(name: str) -> None:
    program = load(name)
    comp = fspyre.compile(program.graph, machine=MACHINE, tiling="none")
    report = fspyre.check(program.graph, program.inputs, machine=MACHINE, comp=comp)
    assert report.equal, str(report)
    within(program, fspyre.run(comp, program.inputs))


@pytest.mark.parametrize("name", sorted(SMALL))
def test_tiled_equals_untiled(name: str) -> None:
    program = load(name)
    assert program.graph.hints, "every gallery example tiles by its hints"
    untiled = fspyre.run(fspyre.compile(program.graph, machine=MACHINE, tiling="none"), program.inputs)
    tiled = fspyre.run(fspyre.compile(program.graph, machine=MACHINE, tiling="hints"), program.inputs)
    # both runs are within the propagated bound of the reference, so of each other within 2x
    ref, bounds = evaluate_with_bounds(program.graph, program.inputs, MACHINE)
    report = compare(program.graph, tiled, untiled, {k: None if b is None else 2 * b for k, b in bounds.items()})
    assert report.equal, str(report)


@pytest.mark.parametrize("name", sorted(SMALL))
def test_captured_graph(name: str, golden) -> None:
    golden.check(name, pretty(load(name).graph))


def test_add_mul_at_the_seed_size() -> None:
    """The default example_inputs() is the seed's [1024, 4096] float16, A:2 outside B:4 inside."""
    program = load_torch_file(EXAMPLES / "add_mul.py")
    assert [(d.name, d.size) for d in program.graph.ops[0].ranges] == [("A", 1024), ("B", 4096)]
    assert [dict(h.slices) for h in program.graph.hints] == [{"A": 2}, {"B": 4}]
    assert [op.hints for op in program.graph.ops] == [(0, 1), (0, 1)]
    within(program, fspyre.evaluate(program.graph, program.inputs))


@pytest.mark.parametrize("name", sorted(SMALL))
def test_torch_compile(name: str) -> None:
    """torch.compile(model, backend="fspyre") runs on the machine model and returns torch
    tensors, capturing the same hint scopes as from_torch."""
    program = load(name)
    module_globals = _file_globals(name)
    args = module_globals["example_inputs"](**SMALL[name])
    graphs = []
    compiled = torch.compile(module_globals["model"], backend="fspyre",
                             options={"tiling": "none", "cores": 8, "on_graph": graphs.append})
    with torch.no_grad():
        out = compiled(*args)
    flat = torch.utils._pytree.tree_leaves(out)
    assert all(isinstance(t, torch.Tensor) for t in flat)
    within(program, {n: t.float().numpy() for n, t in zip(program.expected, flat)})
    (graph,) = graphs
    assert [dict(h.slices) for h in graph.hints] == [dict(h.slices) for h in program.graph.hints]


def _file_globals(name: str) -> dict:
    """Run an example file afresh (its declare/name calls included) and return its globals."""
    import runpy

    from fspyre.frontend import clear_dim_names

    clear_dim_names()
    return runpy.run_path(str(EXAMPLES / f"{name}.py"))
