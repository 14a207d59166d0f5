"""Golden text of the tiling examples (loop tree, program, bundle.mlir) and their generic
MLIR parsed back by xdsl. Journal: tests/golden/test_tiling_golden.txt."""

from __future__ import annotations

import pytest
from tiling_examples import EXAMPLES

import fspyre
from fspyre.ir.program import LoopSpec, op_specs, walk_specs
from fspyre.pretty import pretty

MACHINE = fspyre.machine.spyre(cores=32)


@pytest.mark.parametrize("name", list(EXAMPLES))
def test_example_text(name, golden):
    comp = fspyre.compile(EXAMPLES[name](), MACHINE)
    golden.check(f"{name}.plan", pretty(comp.stages["tiling_plan"]))
    golden.check(f"{name}.tree", pretty(comp.stages["loop_tree"]))
    golden.check(f"{name}.tree.detailed", pretty(comp.stages["loop_tree"], detailed=True))
    golden.check(f"{name}.program", pretty(comp.program))
    golden.check(f"{name}.bundle", comp.bundle_mlir)


@pytest.mark.parametrize("name", list(EXAMPLES))
def test_generic_mlir_parses_with_xdsl(name):
    xdsl = pytest.importorskip("xdsl")  # noqa: F841
    from xdsl.context import Context
    from xdsl.dialects.affine import Affine
    from xdsl.dialects.arith import Arith
    from xdsl.dialects.builtin import Builtin, UnregisteredOp
    from xdsl.dialects.func import Func
    from xdsl.dialects.scf import Scf
    from xdsl.parser import Parser

    comp = fspyre.compile(EXAMPLES[name](), MACHINE)
    ctx = Context(allow_unregistered=True)
    for dialect in (Builtin, Func, Arith, Scf, Affine):
        ctx.load_dialect(dialect)
    module = Parser(ctx, comp.mlir_generic).parse_module()
    module.verify()
    names = [op.op_name.data if isinstance(op, UnregisteredOp) else op.name for op in module.walk()]
    loops = [s for s, _ in walk_specs(comp.program.body) if isinstance(s, LoopSpec)]
    assert names.count("scf.for") == len(loops) > 0
    assert names.count("sdscbundle.sdsc_execute") == len(op_specs(comp.program))
