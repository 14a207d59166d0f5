"""torch.compile(backend="fspyre"): registration, the entry point, options and refusals.
(The gallery test runs every example through it.)"""

from __future__ import annotations

from importlib.metadata import entry_points

import pytest
import torch

from fspyre.errors import FrontendError
from fspyre.frontend import name_tensor_dims, spyre_hint
from fspyre.frontend.dynamo import BACKEND_NAME, fspyre_backend, register_backend


def test_register_backend_is_idempotent() -> None:
    register_backend()
    register_backend()
    assert BACKEND_NAME in torch._dynamo.list_backends()
    from torch._dynamo.backends.registry import lookup_backend

    assert lookup_backend("fspyre") is fspyre_backend


def test_entry_point_names_the_backend() -> None:
    (ep,) = [e for e in entry_points(group="torch_dynamo_backends") if e.name == "fspyre"]
    assert ep.value == "fspyre.frontend.dynamo:fspyre_backend"
    assert ep.load() is fspyre_backend


def test_compiled_function_returns_torch_tensors_and_keeps_hints() -> None:
    register_backend()

    def f(x, y):
        with spyre_hint(slices={"R": 2}):
            return torch.softmax(x @ y, -1), x.sum(-1)

    x = name_tensor_dims(torch.randn(8, 16), ["R", "K"])
    y = torch.randn(16, 4)
    graphs = []
    compiled = torch.compile(f, backend="fspyre", options={"tiling": "none", "cores": 4, "on_graph": graphs.append})
    with torch.no_grad():
        got = compiled(x, y)
    want = f(x, y)
    assert isinstance(got, tuple) and all(isinstance(t, torch.Tensor) for t in got)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)
    (graph,) = graphs
    assert [dict(h.slices) for h in graph.hints] == [{"R": 2}]


def test_unknown_option_is_refused() -> None:
    compiled = torch.compile(lambda x: x * 2, backend=fspyre_backend, options={"tilling": "none"})
    with pytest.raises(Exception, match=r"unknown options \['tilling'\]"):
        compiled(torch.randn(4))


def test_gradients_are_refused() -> None:
    lin = torch.nn.Linear(4, 4)
    compiled = torch.compile(lin, backend=fspyre_backend, options={"tiling": "none"})
    with pytest.raises(Exception, match="inference only") as err:
        compiled(torch.randn(2, 4)).sum().backward()
    assert isinstance(err.value, FrontendError) or "FrontendError" in str(err.value)


# Each order of first use, in a fresh process: torch's entry-point loading imports fspyre,
# and fspyre's import registers the backend when torch is loaded; the two must not collide.
_FRESH_ORDERS = {
    "torch_only_entry_point": "import torch\n",
    "torch_then_fspyre": "import torch\nimport fspyre\n",
    "fspyre_then_torch": "import fspyre\nimport torch\n",
}
_FRESH_CALL = """
def f(x):
    return x * 2 + 1

compiled = torch.compile(f, backend="fspyre", options={"tiling": "none", "cores": 1})
with torch.no_grad():
    got = compiled(torch.arange(4, dtype=torch.float32))
assert got.tolist() == [1.0, 3.0, 5.0, 7.0], got
import fspyre
print(fspyre.__file__)
"""


@pytest.mark.parametrize("order", sorted(_FRESH_ORDERS))
def test_backend_name_works_in_a_fresh_process_in_every_import_order(order: str) -> None:
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root)}
    done = subprocess.run([sys.executable, "-c", _FRESH_ORDERS[order] + _FRESH_CALL], cwd=root, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    # The fspyre under test, not another installed copy, answered the call.
    assert Path(done.stdout.strip().splitlines()[-1]).resolve().is_relative_to(root)
