"""load_torch_file: what `fspyre compile/check FILE.py` get from a torch file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fspyre.errors import FrontendError
from fspyre.frontend.files import ROUNDING_EPS, load_torch_file, rounding_error
from fspyre.ir.builder import GraphBuilder

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_program_record() -> None:
    p = load_torch_file(EXAMPLES / "softmax.py", rows=8, cols=64)
    assert p.graph.name == "softmax" and set(p.inputs) == {"x"}
    assert p.inputs["x"].dtype == np.float16 and p.inputs["x"].shape == (8, 64)
    assert list(p.expected) == ["out"] and p.expected["out"].dtype == np.float16
    # the float16 input and result round once each; cast, amax, sub, exp, sum, div store float32
    assert p.rtol == pytest.approx(2 * ROUNDING_EPS["float16"] + 6 * ROUNDING_EPS["float32"])
    assert p.atol == pytest.approx(p.rtol)  # outputs are at most 1 in magnitude


def test_rounding_error_follows_the_longest_chain() -> None:
    g = GraphBuilder("chain")
    x = g.input("x", [g.dim("N", 64)], "float16")
    y = g.exp(g.exp(x))
    g.output("y", g.add(y, g.cast(x, "float32")))
    eps16, eps32 = ROUNDING_EPS["float16"], ROUNDING_EPS["float32"]
    # the input and both exps store float16; the add promotes to float32
    assert rounding_error(g.build()) == pytest.approx(3 * eps16 + eps32)


def test_tolerance_override(tmp_path: Path) -> None:
    f = tmp_path / "scaled.py"
    f.write_text(
        "import torch\n"
        "model = lambda x: x * 3\n"
        "tolerance = (0.5, 0.25)\n"
        "def example_inputs():\n"
        "    return torch.ones(4, 4)\n"
    )
    p = load_torch_file(f)
    assert (p.atol, p.rtol) == (0.5, 0.25)
    assert p.graph.name == "scaled"


@pytest.mark.parametrize(("text", "match"), [
    ("x = 1\n", "define `model`"),
    ("model = lambda x: x\n", "define `example_inputs"),
    ("model = lambda x: x\ndef example_inputs():\n    raise ValueError('nope')\n",
     r"example_inputs\(\) raised ValueError: nope"),
    ("import torch\nmodel = lambda x: torch.atan(x)\ndef example_inputs():\n    return (torch.ones(2),)\n",
     "aten.atan.default"),
    ("raise RuntimeError('broken')\n", "running the file raised RuntimeError: broken"),
])
def test_bad_files_are_frontend_errors(tmp_path: Path, text: str, match: str) -> None:
    f = tmp_path / "bad.py"
    f.write_text(text)
    with pytest.raises(FrontendError, match=match):
        load_torch_file(f)


def test_missing_file() -> None:
    with pytest.raises(FrontendError, match="no such file"):
        load_torch_file("no/such/file.py")
