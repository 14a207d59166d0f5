"""``spyre_hint(slices={"S": 4})`` around a whole transformers LlamaDecoderLayer (attention
and MLP; nn.Linear flattens [B, S, D] to [B*S, D]). The layer's own code holds ops that read
an S-tiled result through reshapes (the rotary embedding's halves, the mask); loop fission
runs each in a later S loop of its own. An op no S loop can hold at all (a gather over S) is
moved out of the hint's loop by the front end, with a warning naming the torch op, its source
line and the tiling stage's reason."""

from __future__ import annotations

import copy
import re
import warnings

import numpy as np
import pytest
import torch

import fspyre
from fspyre.errors import FspyreWarning
from fspyre.frontend import capture, name_tensor_dims, spyre_hint
from fspyre.ir.graph import iteration_dims
from fspyre.testing.zoo import CASES

pytest.importorskip("transformers")

MACHINE = fspyre.machine.spyre(cores=8)


class Hinted(torch.nn.Module):
    def __init__(self, layer: torch.nn.Module) -> None:
        super().__init__()
        self.layer = layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with spyre_hint(slices={"S": 4}):
            return self.layer(x)


def test_a_whole_llama_decoder_layer_tiles_every_s_op_by_s() -> None:
    model = Hinted(CASES["llama_decoder_layer"].build())
    x = name_tensor_dims(CASES["llama_decoder_layer"].inputs()[0], ["B", "S", "D"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cap = capture(model, (x,))
    moved = [str(w.message) for w in caught if issubclass(w.category, FspyreWarning)
             and "cannot run in the hint's loop" in str(w.message)]
    assert not moved, moved  # the reshape readers now run in later S loops (loop fission)
    comp = fspyre.compile(cap.graph, machine=MACHINE, tiling="hints")
    groups = comp.stages["tiling_plan"].groups
    tiled = sum(len(g.ops) for g in groups if any(lv.dims == ("S",) and lv.count == 4 for lv in g.levels))
    # every op that iterates S runs in an S loop; the reshape readers in later nests, which the plan notes
    iterating_s = [op.name for op in cap.graph.ops if any(d.name == "S" and d.size > 1 for d in iteration_dims(op))]
    in_s_loops = {name for g in groups if any(lv.dims == ("S",) and lv.count == 4 for lv in g.levels) for name in g.ops}
    assert set(iterating_s) <= in_s_loops and tiled >= len(cap.graph.ops) // 2, (tiled, len(cap.graph.ops))
    assert any(n.startswith("loop fission of group") and "which that loop does not walk in step" in n
               for n in comp.stages["tiling_plan"].notes)
    matmuls = [op.name for op in cap.graph.ops if op.fn == "matmul"]
    in_loops = {name for g in groups for name in g.ops}
    assert sum(m in in_loops for m in matmuls) >= 5  # q, k, v projections and the MLP's three linears
    print(f"{tiled} of {len(cap.graph.ops)} ops in {len(groups)} S loops")
    inputs = cap.inputs(x)
    with torch.no_grad():  # the model zoo's derived tolerance: within 2x torch's own float32 error
        exact = copy.deepcopy(model).double()(x.double()).numpy()
        theirs = float(np.abs(model(x).double().numpy() - exact).max())
    got = fspyre.run(comp, inputs)[cap.output_names[0]]
    ours = float(np.abs(got.astype(np.float64) - exact).max())
    assert ours <= 2 * theirs, (ours, theirs)
    assert fspyre.check(cap.graph, inputs, machine=MACHINE, tiling="hints").equal


class GatherInScope(torch.nn.Module):
    def forward(self, x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        with spyre_hint(slices={"S": 4}):
            y = torch.exp(x)
            # a gather over S: no S loop can hold it
            z = torch.gather(y, 0, idx)
            return torch.neg(z) * 2


def test_an_op_no_loop_can_hold_is_moved_out_of_the_hint_with_a_warning() -> None:
    x = name_tensor_dims(torch.randn(256, 64, generator=torch.Generator().manual_seed(0), dtype=torch.float16),
                         ["S", "D"])
    idx = name_tensor_dims(torch.randint(0, 256, (256, 64), generator=torch.Generator().manual_seed(1)), ["S", "D"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cap = capture(GatherInScope(), (x, idx))
    moved = [str(w.message) for w in caught if issubclass(w.category, FspyreWarning)
             and "cannot run in the hint's loop" in str(w.message)]
    assert len(moved) == 1, moved  # the torch op, where the code makes it, and the stage's reason
    assert re.search(r"slices=\{'S': 4\}: gather = aten\.gather\.default\(.*\) -> .* at .*test_hints\.py:\d+: "
                     r"`z = torch\.gather\(y, 0, idx\)` cannot run in the hint's loop \(op \w+ \(gather over \['S'\]\)"
                     r".*no tile-by-tile combine.*\); it runs outside it", moved[0]), moved[0]
    gather = next(op for op in cap.graph.ops if op.fn == "gather")
    assert not gather.hints
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FspyreWarning)
        report = fspyre.check(cap.graph, cap.inputs(x, idx), machine=MACHINE, tiling="hints")
    assert report.equal, str(report)
    want = -2 * np.take_along_axis(np.exp(x.numpy().astype(np.float32)), idx.numpy(), axis=0)
    got = fspyre.run(fspyre.compile(cap.graph, machine=MACHINE, tiling="hints"), cap.inputs(x, idx))
    assert np.allclose(got[cap.output_names[0]].astype(np.float32), want, rtol=2e-2, atol=1e-2)
