"""Model-zoo tests: each test starts with no declared dims and no named tensors, and with
Dynamo's caches empty (every case is its own torch.compile)."""

from __future__ import annotations

import warnings

import pytest
import torch

from fspyre.frontend import clear_dim_names


@pytest.fixture(autouse=True)
def _fresh_frontend():
    clear_dim_names()
    torch._dynamo.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch.export's own pytree deprecation noise
        yield
    clear_dim_names()
    torch._dynamo.reset()
