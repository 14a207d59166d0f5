"""Front-end tests: each test starts with no declared dims and no named tensors."""

from __future__ import annotations

import warnings

import pytest

from fspyre.frontend import clear_dim_names


@pytest.fixture(autouse=True)
def _fresh_dim_names():
    clear_dim_names()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch.export's own pytree deprecation noise
        yield
    clear_dim_names()
