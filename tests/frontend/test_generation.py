"""Generation under ``torch.compile(backend="fspyre")`` (issue 23): ``LlamaForCausalLM.generate``
gives eager's tokens with at most 3 fspyre compiles -- the prefill, the first decode step at
its shape, and one symbolic decode program for every later cache length -- under Dynamo's
default automatic dynamic shapes and under ``dynamic=True``. Compiles are counted by the
backend's ``on_graph`` hook, which it calls before every ``fspyre.compile``.

The decode graph is one program because the KV cache's ``cat`` is one copy per piece into its
region (``GraphBuilder.concat``), the causal mask's ``arange`` over the cache is a host input
of size ``|L| + 1`` made for each call, and the new token's position ``|L|``, a number in the
trace, is a one-element host input."""

from __future__ import annotations

import warnings

import pytest
import torch

from fspyre.errors import FspyreWarning
from fspyre.testing.transformer import tiny_llama_lm


@pytest.mark.parametrize("dynamic", [None, True])
def test_generate_gives_eager_tokens_with_at_most_three_compiles(dynamic):
    lm = tiny_llama_lm()
    ids = torch.randint(0, 64, (1, 5), generator=torch.Generator().manual_seed(1))
    kw = dict(max_new_tokens=8, min_new_tokens=8, do_sample=False)
    with torch.no_grad():
        want = lm.generate(ids, **kw)
    graphs: list = []
    torch._dynamo.reset()
    lm.forward = torch.compile(lm.forward, backend="fspyre", dynamic=dynamic,
                               options={"tiling": "none", "cores": 8, "on_graph": graphs.append})
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", FspyreWarning)  # nothing falls back, nothing compiles per shape
        got = lm.generate(ids, **kw)
    assert torch.equal(got, want)
    assert len(graphs) <= 3
    assert [g.symbolic for g in graphs] == [False, False, True]


def test_a_cache_append_with_positions_over_it_is_one_program():
    """A cat of a cache and one row, an arange over the grown length, a one-element arange at
    the row's position and the position as a number (an int Dynamo passes): one symbolic
    compile serves every later length."""
    def step(cache, new):
        k = torch.cat([cache, new], 0)
        positions = torch.arange(k.shape[0], dtype=torch.float32)
        last = torch.full((1,), cache.shape[0], dtype=torch.float32)
        here = torch.arange(cache.shape[0], cache.shape[0] + 1, dtype=torch.float32)
        return torch.softmax(k.sum(-1), 0) * (positions - last) + here

    graphs: list = []
    torch._dynamo.reset()
    fn = torch.compile(step, backend="fspyre", dynamic=True,
                       options={"tiling": "none", "cores": 8, "on_graph": graphs.append})
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", FspyreWarning)
        for n in (5, 9, 37, 70, 2):
            cache, new = torch.randn(n, 32), torch.randn(1, 32)
            torch.testing.assert_close(fn(cache, new), step(cache, new), rtol=1e-5, atol=1e-6)
    assert [g.symbolic for g in graphs] == [False, True]


@pytest.mark.parametrize("dynamic", [None, True])
def test_a_cache_that_starts_empty_runs_every_step_on_fspyre(dynamic):
    """The prefill's cat with an empty cache (a zero-size piece: dropped), then one row per
    step: nothing in eager, nothing compiled per shape after the symbolic program."""
    def step(cache, new):
        k = torch.cat([cache, new], 0)
        return torch.softmax(k.sum(-1), 0), k

    graphs: list = []
    reports: list = []
    torch._dynamo.reset()
    fn = torch.compile(step, backend="fspyre", dynamic=dynamic,
                       options={"tiling": "none", "cores": 8, "on_graph": graphs.append, "on_report": reports.append})
    cache = torch.zeros(0, 32)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", FspyreWarning)
        for n in range(5):
            new = torch.randn(5 if n == 0 else 1, 32, generator=torch.Generator().manual_seed(n))
            got, want = fn(cache, new), step(cache, new)
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
            cache = want[1]
    assert all(not r.eager for r in reports)
    assert len(graphs) <= 3 and graphs[-1].symbolic
