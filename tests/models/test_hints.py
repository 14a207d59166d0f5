"""``spyre_hint(slices={"S": 4})`` around a whole transformers LlamaDecoderLayer (attention
and MLP; nn.Linear flattens [B, S, D] to [B*S, D]). The layer's own code holds ops no S loop
can hold; the front end moves each out of the hint's loop with a warning naming the torch op,
its source line and the tiling stage's reason, and tiles the rest by S."""

from __future__ import annotations

import copy
import re
import warnings

import numpy as np
import pytest
import torch
from zoo import CASES

import fspyre
from fspyre.errors import FspyreWarning
from fspyre.frontend import capture, name_tensor_dims, spyre_hint

pytest.importorskip("transformers")

MACHINE = fspyre.machine.spyre(cores=8)


class Hinted(torch.nn.Module):
    def __init__(self, layer: torch.nn.Module) -> None:
        super().__init__()
        self.layer = layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with spyre_hint(slices={"S": 4}):
            return self.layer(x)


def test_a_whole_llama_decoder_layer_tiles_by_s_and_warns_for_each_op_it_moves_out() -> None:
    model = Hinted(CASES["llama_decoder_layer"].build())
    x = name_tensor_dims(CASES["llama_decoder_layer"].inputs()[0], ["B", "S", "D"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cap = capture(model, (x,))
    moved = [str(w.message) for w in caught if issubclass(w.category, FspyreWarning)
             and "cannot run in the hint's loop" in str(w.message)]
    assert moved, "the layer's rotary and mask ops cannot all be tiled by S"
    for message in moved:  # the torch op, where the layer's code makes it, and the stage's reason
        assert re.search(r"slices=\{'S': 4\}: \w+ = aten\.\S+\(.*\) -> .* at .*\.py:\d+: `.*` cannot run in the "
                         r"hint's loop \(op \w+ .+\); it runs outside it", message), message
    comp = fspyre.compile(cap.graph, machine=MACHINE, tiling="hints")
    groups = comp.stages["tiling_plan"].groups
    tiled = sum(len(g.ops) for g in groups if any(lv.dims == ("S",) and lv.count == 4 for lv in g.levels))
    # every op either runs in an S loop or was moved out with a warning (or iterates no S)
    assert tiled + len(moved) <= len(cap.graph.ops) and tiled >= len(cap.graph.ops) // 2, (tiled, len(moved))
    matmuls = [op.name for op in cap.graph.ops if op.fn == "matmul"]
    in_loops = {name for g in groups for name in g.ops}
    assert sum(m in in_loops for m in matmuls) >= 5  # q, k, v projections and the MLP's three linears
    print(f"{tiled} of {len(cap.graph.ops)} ops in {len(groups)} S loops, {len(moved)} moved out")
    inputs = cap.inputs(x)
    with torch.no_grad():  # the model zoo's derived tolerance: within 2x torch's own float32 error
        exact = copy.deepcopy(model).double()(x.double()).numpy()
        theirs = float(np.abs(model(x).double().numpy() - exact).max())
    got = fspyre.run(comp, inputs)[cap.output_names[0]]
    ours = float(np.abs(got.astype(np.float64) - exact).max())
    assert ours <= 2 * theirs, (ours, theirs)
    assert fspyre.check(cap.graph, inputs, machine=MACHINE, tiling="hints").equal
