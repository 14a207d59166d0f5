"""Ops real model code needs (issue 11): each is captured with ``from_torch`` and checked
against torch eager and against a numpy reference written from the op's definition; view and
selection graphs also run on the machine model (``fspyre.check``: interpreter vs reference).

Tolerances: data movement (slices, selects, splits, cat) is exact. float32 arithmetic uses
``torch.testing.assert_close``'s float32 tolerances; float16 inputs are drawn as DLFloat16
values (so copy-in does not round them) and results are held to one DLFloat16 rounding
(rtol 2^-9) of the float32 computation, as in ``fspyre.frontend.coverage``."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import fspyre
from fspyre.frontend import capture, name_tensor_dims, spyre_hint
from fspyre.frontend.coverage import DLF16_TOL, FP32_TOL
from fspyre.machine import formats

DL16 = formats.FORMATS["SEN169_FP16"]
MACHINE = fspyre.machine.spyre(cores=4)


def dl16(a: np.ndarray) -> np.ndarray:
    """``a`` rounded to DLFloat16, as float32."""
    return np.asarray(formats.round_to(np.asarray(a, np.float32), DL16), np.float32).reshape(np.shape(a))


def stored16(a: np.ndarray) -> np.ndarray:
    """A float16 result as fspyre returns it: stored as DLFloat16, copied out to float16."""
    return dl16(a).astype(np.float16).astype(np.float32)


def randn(*shape: int, dtype: torch.dtype = torch.float32, seed: int = 0) -> torch.Tensor:
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(seed))
    return torch.from_numpy(dl16(x.numpy())).to(dtype) if dtype == torch.float16 else x


def run(fn, *args: torch.Tensor, machine: bool = True) -> list[np.ndarray]:
    """fspyre's results for ``fn(*args)`` (reference evaluator); with ``machine`` the compiled
    program must also agree with the reference within check's bound."""
    cap = capture(fn, args)
    inputs = cap.inputs(*args)
    out = fspyre.evaluate(cap.graph, inputs)
    if machine:
        report = fspyre.check(cap.graph, inputs, machine=MACHINE)
        assert report.equal, str(report)
    return [out[n] for n in cap.output_names]


def close(got: np.ndarray, want: np.ndarray, dtype: torch.dtype) -> None:
    rtol, atol = DLF16_TOL if dtype == torch.float16 else FP32_TOL
    np.testing.assert_allclose(np.asarray(got, np.float64), np.asarray(want, np.float64), rtol=rtol, atol=atol)


def eager(fn, *args: torch.Tensor) -> list[np.ndarray]:
    with torch.no_grad():
        out = fn(*args)
    return [o.numpy() for o in (out if isinstance(out, (tuple, list)) else (out,))]


# -- .to(dtype): torch.export's metadata assertion is dropped ---------------------------------
class RMSNorm(torch.nn.Module):
    """LlamaRMSNorm's forward, as transformers writes it."""

    def __init__(self, hidden: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(hidden, generator=torch.Generator().manual_seed(7)))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        input_dtype = x.dtype
        h = x.to(torch.float32)
        variance = h.pow(2).mean(-1, keepdim=True)
        h = h * torch.rsqrt(variance + self.eps)
        return self.weight * h.to(input_dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_rmsnorm_with_dtype_casts(dtype) -> None:
    m = RMSNorm(64).to(dtype)
    x = randn(2, 8, 64, dtype=dtype)
    (got,) = run(m, x)
    # numpy, from the definition: float32 compute, the cast back rounds, the weight product rounds
    xf = x.float().numpy().astype(np.float64)
    h = (xf / np.sqrt((xf**2).mean(-1, keepdims=True) + 1e-6)).astype(np.float32)
    w = m.weight.detach().float().numpy()
    want = stored16(w * dl16(h)) if dtype == torch.float16 else w * h
    close(got, want, dtype)
    if dtype == torch.float32:
        close(got, eager(m, x)[0], dtype)
    else:
        # Both round twice (the cast back, the weight product): DLFloat16 by at most 2^-10
        # relative each, eager's IEEE float16 by 2^-11 each: 2 * 2^-10 + 2 * 2^-11 apart.
        np.testing.assert_allclose(got.astype(np.float64), eager(m, x)[0].astype(np.float64),
                                   rtol=2 * 2**-10 + 2 * 2**-11, atol=1e-5)


def test_float_and_type_casts_capture() -> None:
    def f(x):
        return x.float().exp().type(torch.float16)

    x = randn(4, 64, dtype=torch.float16)
    (got,) = run(f, x)
    close(got, stored16(np.exp(x.float().numpy())), torch.float16)


# -- slices, selects, splits: views with an offset --------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_slices_selects_and_splits_are_exact(dtype) -> None:
    def f(x):
        q, k, v, w = x.split(16, dim=-1)
        a, b, c = x.split_with_sizes([3, 1, 4], dim=1)
        return (x[..., :32] * x[..., 32:], x.narrow(1, 1, 2), x[:, 1], q - v, x[:, :, 3:50:3], x[:, -1],
                torch.unbind(x, 1)[2], a.sum(1), c[:, 1:, 5:37], x[1, 2:4, -7])

    x = randn(2, 8, 64, dtype=dtype)
    got = run(f, x)
    n = x.float().numpy()
    d16 = stored16 if dtype == torch.float16 else (lambda a: a)
    want = [d16(n[..., :32] * n[..., 32:]), n[:, 1:3], n[:, 1], d16(n[..., :16] - n[..., 32:48]), n[:, :, 3:50:3],
            n[:, -1], n[:, 2], None, n[:, 4:8][:, 1:, 5:37], n[1, 2:4, -7]]
    for i, (g, w, e) in enumerate(zip(got, want, eager(f, x))):
        if w is None:  # a reduction: float32 order differs
            close(g, d16(n[:, :3].sum(1)), dtype)
            continue
        assert g.shape == w.shape, i
        np.testing.assert_array_equal(g.astype(np.float32), w, err_msg=f"output {i}")
        if dtype == torch.float32:
            np.testing.assert_array_equal(g, e, err_msg=f"output {i} vs eager")


@pytest.mark.parametrize("start", [0, 1, 31, 32, 33])
def test_slice_starting_mid_stick_runs_on_the_machine(start) -> None:
    """A float16 stick holds 64 elements; any start (mid-stick included) addresses correctly."""
    x = randn(4, 128, dtype=torch.float16)
    (got,) = run(lambda x: x[:, start:start + 40] + 1, x)
    np.testing.assert_array_equal(got.astype(np.float32), stored16(x.float().numpy()[:, start:start + 40] + 1))


class GPT2Attention(torch.nn.Module):
    """GPT-2's fused qkv projection split three ways, then one head of eager attention."""

    def __init__(self, d: int) -> None:
        super().__init__()
        torch.manual_seed(3)
        self.c_attn = torch.nn.Linear(d, 3 * d)
        self.d = d

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.c_attn(x).split(self.d, dim=2)
        s = torch.softmax(q @ k.transpose(-1, -2) / self.d**0.5, dim=-1)
        return s @ v


def test_gpt2_qkv_split() -> None:
    m = GPT2Attention(32)
    x = randn(2, 8, 32)
    (got,) = run(m, x)
    close(got, eager(m, x)[0], torch.float32)
    with torch.no_grad():
        qkv = (x.numpy().astype(np.float64) @ m.c_attn.weight.numpy().T.astype(np.float64)
               + m.c_attn.bias.numpy())
    q, k, v = qkv[..., :32], qkv[..., 32:64], qkv[..., 64:]
    s = q @ k.transpose(0, 2, 1) / 32**0.5
    p = np.exp(s - s.max(-1, keepdims=True))
    close(got, (p / p.sum(-1, keepdims=True)) @ v, torch.float32)


# -- bool reductions and logical ops (SDPA's decomposition, mask building) --------------------
def test_any_all_and_logical_ops_are_exact() -> None:
    def f(x, m):
        return (x.any(-1), (x > 0).all(1), m.any(), torch.logical_and(m, x > 0.5), torch.logical_or(x > 1, m),
                torch.logical_xor(m, x < 0), torch.any(m, dim=(0, 2)), x.all(), torch.logical_and(x, x - 1))

    x = randn(2, 4, 64)
    x[0, 1] = 0  # a row with no nonzero element
    x[1, 2, 5] = float("nan")  # NaN is true, as bool(nan)
    m = torch.rand(2, 4, 64, generator=torch.Generator().manual_seed(1)) > 0.7
    got = run(f, x, m)
    n, b = x.numpy(), m.numpy()
    want = [(n != 0).any(-1), (n > 0).all(1), b.any(), b & (n > 0.5), (n > 1) | b, b ^ (n < 0), b.any((0, 2)),
            (n != 0).all(), (n != 0) & (n - 1 != 0)]
    for i, (g, w, e) in enumerate(zip(got, want, eager(f, x, m))):
        assert g.dtype == np.bool_, i
        np.testing.assert_array_equal(g, w, err_msg=f"output {i}")
        np.testing.assert_array_equal(g, e, err_msg=f"output {i} vs eager")


def test_sdpa_mask_reduction() -> None:
    """What SDPA's decomposition does with a boolean mask: rows with no kept key."""
    def f(s, mask):
        keep = mask.any(dim=-1, keepdim=True)
        return torch.where(keep, torch.softmax(s.masked_fill(~mask, float("-inf")), -1), 0.0)

    s = randn(2, 8, 16)
    mask = torch.rand(2, 8, 16, generator=torch.Generator().manual_seed(2)) > 0.5
    run(f, s, mask)  # on the machine model too
    mask[0, 3] = False  # a row with every key masked: -inf - -inf is NaN, which `keep` removes
    (got,) = run(f, s, mask)  # check's bound is infinite there (an undefined error), not NaN
    close(got, np.nan_to_num(eager(f, s, mask)[0]), torch.float32)
    n = np.where(mask.numpy(), s.numpy().astype(np.float64), -np.inf)
    with np.errstate(invalid="ignore"):
        p = np.exp(n - n.max(-1, keepdims=True))
        want = np.where(mask.numpy().any(-1, keepdims=True), p / p.sum(-1, keepdims=True), 0.0)
    close(got, want, torch.float32)


# -- sin / cos --------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_sin_cos(dtype) -> None:
    def f(x):
        return torch.sin(x * 4), torch.cos(x * 4)

    x = randn(4, 64, dtype=dtype)
    got = run(f, x)
    xf = x.float().numpy()
    x4 = stored16(xf * 4) if dtype == torch.float16 else xf * 4
    for g, w, e in zip(got, (np.sin(x4.astype(np.float64)), np.cos(x4.astype(np.float64))), eager(f, x)):
        close(g, stored16(w) if dtype == torch.float16 else w, dtype)
        if dtype == torch.float32:
            close(g, e, dtype)


# -- cat / stack: equal pieces, a where over an iota of the piece index -----------------------
def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(q, k, inv_freq_t):
    """Llama's rotary embedding: cos/sin of cat(freqs, freqs), rotate_half, on q and k."""
    emb = torch.cat((inv_freq_t, inv_freq_t), dim=-1)
    cos, sin = emb.cos(), emb.sin()
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_rotary_embedding(dtype) -> None:
    q, k = randn(2, 4, 8, 32, dtype=dtype, seed=1), randn(2, 4, 8, 32, dtype=dtype, seed=2)
    t = torch.arange(8, dtype=torch.float32)[:, None] * (1e4 ** (-torch.arange(0, 32, 2) / 32))[None]
    t = t.to(dtype)
    got = run(apply_rotary, q, k, t)
    f16 = dtype == torch.float16
    r = dl16 if f16 else (lambda a: a)  # intermediates are stored as DLFloat16
    tf = r(t.float().numpy()).astype(np.float64)  # copy-in rounds the float16 input
    emb = np.concatenate([tf, tf], -1)
    cos, sin = r(np.cos(emb)), r(np.sin(emb))
    for g, x, e in zip(got, (q, k), eager(apply_rotary, q, k, t)):
        n = x.float().numpy()
        rot = np.concatenate([-n[..., 16:], n[..., :16]], -1)
        want = r(n * cos) + r(rot * sin)
        close(g, stored16(want) if f16 else want, dtype)
        if not f16:
            close(g, e, dtype)


def test_cat_and_stack_are_exact() -> None:
    def f(x):
        return (rotate_half(x), torch.stack([x, x * 2, -x], 1), torch.cat([x, x], 0),
                torch.stack([x[:, 0], x[:, 1]], -1), torch.cat([x], 1))

    x = randn(2, 4, 32)
    got = run(f, x)
    n = x.numpy()
    want = [np.concatenate([-n[..., 16:], n[..., :16]], -1), np.stack([n, n * 2, -n], 1), np.concatenate([n, n], 0),
            np.stack([n[:, 0], n[:, 1]], -1), n]
    for i, (g, w, e) in enumerate(zip(got, want, eager(f, x))):
        np.testing.assert_array_equal(g, w, err_msg=f"output {i}")
        np.testing.assert_array_equal(g, e, err_msg=f"output {i} vs eager")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_cat_of_unequal_pieces_is_exact(dtype) -> None:
    def f(x, cache, new):
        return torch.cat([x[:, :3], x[:, 3:]], 1) * 2, torch.cat([x[:, 2:4], x[:, :6], x[:, 4:]], 1), \
            torch.cat([cache, new], 1)

    x, cache, new = randn(2, 8, dtype=dtype), randn(2, 5, 4, dtype=dtype, seed=1), randn(2, 1, 4, dtype=dtype, seed=2)
    for g, w in zip(run(f, x, cache, new), eager(f, x, cache, new)):
        np.testing.assert_array_equal(g, w)


def test_cat_of_unequal_pieces_is_one_copy_per_piece() -> None:
    """Pieces of 64 and 1 rows (a KV-cache append; once 65 gcd chunks, refused past 64): one
    copy into its region each, exact."""
    def f(x, y):
        return torch.cat([x, y], 0) * 2

    x, y = randn(64, 4), randn(1, 4)
    graph = capture(f, (x, y)).graph
    assert sum(op.fn == "copy" for op in graph.ops) == 2 and len(graph.ops) == 3
    (got,) = run(f, x, y)
    np.testing.assert_array_equal(got, eager(f, x, y)[0])


# -- int64 (narrowed to int32) and arange -------------------------------------------------------
def positions(ids, x):
    pos = torch.arange(ids.shape[1])
    scale = torch.arange(1, 2 * ids.shape[1] + 1, 2, dtype=torch.float32)
    return ids + pos, x * scale, (ids * 3).sum(-1), torch.arange(0.5, 3.0, 0.25)


def test_int64_and_arange_are_exact() -> None:
    """int64 is held as int32 on the device; token ids, positions and their sums fit, so every
    result equals eager exactly (returned as int32 arrays); float aranges are torch's values."""
    ids = torch.randint(0, 50_000, (2, 6), generator=torch.Generator().manual_seed(0))
    x = randn(2, 6)
    got = run(positions, ids, x)
    want = eager(positions, ids, x)
    assert [g.dtype for g in got] == [np.int32, np.float32, np.int32, np.float32]
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


def test_an_int64_value_outside_int32_is_refused_when_passed_in() -> None:
    ids = torch.zeros(2, 6, dtype=torch.int64)
    ids[1, 2] = 2**40
    cap = capture(positions, (ids, randn(2, 6)))
    with pytest.raises(fspyre.FspyreError, match=r"input ids: value 1099511627776 does not fit int32"):
        fspyre.evaluate(cap.graph, cap.inputs(ids, randn(2, 6)))


# -- embedding, index_select, gather ------------------------------------------------------------
class TinyLM(torch.nn.Module):
    """Token and position embeddings, an RMSNorm, a Llama MLP, and logits through the tied
    embedding: the shape of a causal LM's ends, with no attention."""

    def __init__(self, vocab: int = 48, hidden: int = 32, inner: int = 64) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(3)
        self.tok = torch.nn.Embedding(vocab, hidden)
        self.pos = torch.nn.Embedding(16, hidden)
        self.norm = RMSNorm(hidden)
        self.gate = torch.nn.Linear(hidden, inner, bias=False)
        self.up = torch.nn.Linear(hidden, inner, bias=False)
        self.down = torch.nn.Linear(inner, hidden, bias=False)
        for p in self.parameters():
            p.data = torch.randn(p.shape, generator=gen) * 0.3

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.tok(ids) + self.pos(torch.arange(ids.shape[-1]))
        x = self.norm(h)
        h = h + self.down(torch.nn.functional.silu(self.gate(x)) * self.up(x))
        return h @ self.tok.weight.T


def test_tiny_lm_from_input_ids_to_logits() -> None:
    """The embedding rows are exact selections; the rest is float32 arithmetic, held to the
    float32 tolerances of the coverage table."""
    model = TinyLM().eval()
    ids = torch.randint(0, 48, (2, 8), generator=torch.Generator().manual_seed(0))
    (got,) = run(model, ids)
    (want,) = eager(model, ids)
    close(got, want, torch.float32)


def test_embedding_index_select_gather_are_exact() -> None:
    def f(table, ids, x, idx, rows, cols):
        return (torch.nn.functional.embedding(ids, table), torch.index_select(x, 1, idx),
                torch.gather(x, 1, cols), x[:, rows], x[idx[:2]])

    table, x = randn(10, 16), randn(4, 8, seed=1)
    ids = torch.tensor([[1, 9, 0, 4], [3, 3, 7, 2]])
    idx, rows = torch.tensor([3, 0, 2]), torch.tensor([[7, 1], [1, 6]])
    cols = torch.tensor([[0, 7, 7], [2, 2, 5]])  # 2 rows of x's 4: torch.gather reads the first two
    for g, w in zip(run(f, table, ids, x, idx, rows, cols), eager(f, table, ids, x, idx, rows, cols)):
        np.testing.assert_array_equal(g, w)


def test_an_embedding_id_out_of_range_is_refused_when_it_runs() -> None:
    table = randn(10, 16)
    cap = capture(torch.nn.functional.embedding, (torch.tensor([1, 2]), table))
    with pytest.raises(fspyre.FspyreError, match=r"gather\): index 10 at \[1, 0\] matches 0 of the positions 0..9"):
        fspyre.evaluate(cap.graph, cap.inputs(torch.tensor([1, 10]), table))



# -- x[i, j]: several index tensors broadcast together ----------------------------------------
INDEXINGS = {  # name: (function, numpy's advanced indexing of the same: the op's definition)
    "adjacent": (lambda x, i, j: x[i, j], lambda x, i, j: x[i, j]),
    "adjacent_after_a_slice": (lambda x, i, j: x[:, i, j], lambda x, i, j: x[:, i, j]),
    "apart_so_index_dims_first": (lambda x, i, j: x[i, :, j], lambda x, i, j: x[i, :, j]),
    "with_a_sliced_dim": (lambda x, i, j: x[i[:, :1], 2:4], lambda x, i, j: x[i[:, :1], 2:4]),
    "three_indices": (lambda x, i, j: x[i, i.T, j[:1]], lambda x, i, j: x[i, i.T, j[:1]]),
    "negative_from_the_end": (lambda x, i, j: x[-1 - i, j - 6], lambda x, i, j: x[-1 - i, j - 6]),
}


@pytest.mark.parametrize("case", sorted(INDEXINGS))
def test_several_index_tensors_gather_exactly(case) -> None:
    """Each index tensor is expanded to the broadcast shape and gathered in turn; the values
    are selected, so the result equals eager and numpy bit for bit (on the machine too)."""
    f, ref = INDEXINGS[case]
    x = randn(5, 6, 7)
    i, j = torch.tensor([[0, 4], [2, 1]]), torch.tensor([5, 3])
    (got,) = run(f, x, i, j)
    np.testing.assert_array_equal(got, eager(f, x, i, j)[0])
    np.testing.assert_array_equal(got, ref(x.numpy(), i.numpy(), j.numpy()))


def padding_mask(m: torch.Tensor) -> torch.Tensor:
    """transformers' ``padding_mask_function`` on the expanded index grids of ``sdpa_mask``:
    ``m[batch_arange[:, None, None, None], kv_arange[None, None, None, :]]``."""
    b = torch.arange(m.shape[0])[:, None, None, None]
    k = torch.arange(m.shape[1])[None, None, None, :].expand(1, 1, 3, -1)
    return m[b, k]


def strided_rows(m: torch.Tensor) -> torch.Tensor:
    return m[torch.arange(m.shape[0])[:, None], torch.arange(1, 9, 2)[None, :]]


@pytest.mark.parametrize("f", [padding_mask, strided_rows])
def test_index_tensors_that_are_aranges_are_views(f) -> None:
    """An index that is an arange (through unsqueeze and expand) along its own broadcast dim
    reads a slice of the values: no gather, and the only op is the output's copy."""
    m = randn(2, 16) > 0
    cap = capture(f, (m,))
    assert [op.fn for op in cap.graph.ops] == ["copy"]
    (got,) = run(f, m)
    np.testing.assert_array_equal(got, eager(f, m)[0])


def test_the_same_arange_twice_is_a_diagonal_gathered() -> None:
    def diagonal(m):
        r = torch.arange(m.shape[0])
        return m[r, r]

    m = randn(6, 6)
    assert [op.fn for op in capture(diagonal, (m,)).graph.ops] == ["gather", "gather"]
    np.testing.assert_array_equal(run(diagonal, m)[0], np.diagonal(m.numpy()))


def test_a_bool_mask_index_is_refused_naming_static_shapes() -> None:
    with pytest.raises(fspyre.FspyreError, match=r"static shapes"):
        capture(lambda x, m: x[m], (randn(5, 3), torch.tensor([True, False, True, True, False])))


def test_an_index_out_of_range_in_the_second_index_is_refused_when_it_runs() -> None:
    f = INDEXINGS["adjacent"][0]
    x, i = randn(5, 6, 7), torch.tensor([[0, 4], [2, 1]])
    cap = capture(f, (x, i, torch.tensor([5, 3])))
    with pytest.raises(fspyre.FspyreError, match=r"gather\): index 6 at \[0, 1, \d\] matches 0 of the positions 0..5"):
        fspyre.evaluate(cap.graph, cap.inputs(x, i, torch.tensor([5, 6])))


# -- hints through nn.Linear on [B, S, D] -------------------------------------------------------
class LlamaMLP(torch.nn.Module):
    def __init__(self, hidden: int = 32, inner: int = 64) -> None:
        super().__init__()
        self.gate = torch.nn.Linear(hidden, inner, bias=False)
        self.up = torch.nn.Linear(hidden, inner, bias=False)
        self.down = torch.nn.Linear(inner, hidden, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with spyre_hint(slices={"S": 4}):
            return self.down(torch.nn.functional.silu(self.gate(x)) * self.up(x))


def test_a_hint_on_s_tiles_every_linear_of_an_mlp_on_b_s_d() -> None:
    """nn.Linear flattens [B, S, D] to [B*S, D] around its mm; capture undoes the flattening,
    so S keeps its name and the hint makes one S loop around the whole MLP."""
    torch.manual_seed(0)
    model = LlamaMLP().eval()
    x = name_tensor_dims(randn(2, 16, 32), ["B", "S", "D"])
    cap = capture(model, (x,))
    assert all("S" in [d.name for d in op.ranges] for op in cap.graph.ops)
    comp = fspyre.compile(cap.graph, machine=MACHINE, tiling="hints")
    (loop,) = comp.stages["loop_tree"].body
    assert loop.count == 4 and len(loop.body) == len(cap.graph.ops)
    inputs = cap.inputs(x)
    close(fspyre.run(comp, inputs)["out"], eager(model, x)[0], torch.float32)
    assert fspyre.check(cap.graph, inputs, machine=MACHINE, tiling="hints").equal


def test_a_hint_on_a_dim_a_reshape_merged_warns() -> None:
    def f(x, w):
        with spyre_hint(slices={"S": 4}):
            return torch.relu(x.reshape(-1, 32)) @ w

    x = name_tensor_dims(randn(2, 16, 32), ["B", "S", "D"])
    cap = capture(f, (x, randn(32, 8)))
    with pytest.warns(fspyre.FspyreWarning, match=r"slices=\{'S': 4\}: no op of .* iterates dim S; hint ignored"):
        fspyre.compile(cap.graph, machine=MACHINE, tiling="hints")


class LlamaDecoderLayer(torch.nn.Module):
    """A Llama-style decoder layer from torch.nn parts: RMSNorm, q/k/v/o projections with the
    rotary embedding of the positions (``arange`` inside the graph), causal SDPA, and the
    gated MLP."""

    def __init__(self, hidden: int = 32, heads: int = 2, inner: int = 64) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, hidden // heads
        self.q, self.k, self.v, self.o = (torch.nn.Linear(hidden, hidden, bias=False) for _ in range(4))
        self.norm1, self.norm2 = RMSNorm(hidden), RMSNorm(hidden)
        self.mlp = LlamaMLP(hidden, inner)
        self.register_buffer("inv_freq", 1.0 / 10000 ** (torch.arange(0, self.head_dim, 2).float() / self.head_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        h = self.norm1(x)
        q, k, v = (p(h).view(b, s, self.heads, self.head_dim).transpose(1, 2) for p in (self.q, self.k, self.v))
        q, k = apply_rotary(q, k, torch.arange(s).float()[:, None] * self.inv_freq[None, :])
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(a.transpose(1, 2).reshape(b, s, d))
        return x + self.mlp(self.norm2(x))


def test_llama_decoder_layer() -> None:
    """float32 throughout; the reductions' order differs, so the coverage table's float32
    tolerances. The MLP's own hint tiles it by S inside the layer."""
    torch.manual_seed(0)
    layer = LlamaDecoderLayer().eval()
    x = name_tensor_dims(randn(2, 8, 32), ["B", "S", "D"])
    (got,) = run(layer, x)
    close(got, eager(layer, x)[0], torch.float32)


def test_a_hint_no_op_can_honour_is_left_for_the_compile_to_warn() -> None:
    """Tiles of 4 float16 elements cut 64-element sticks: capture leaves the hint as written
    (no warning, no error: tiling="none" ignores hints), and the compile with hints rounds the
    tile up to whole sticks -- the whole 16-element dim, so the level makes no loop -- and
    warns, naming the op (docs/tiling.md, "Tails")."""

    def f(x, y):
        with spyre_hint(slices={"C": 4}):
            return torch.relu(x + y)

    args = [name_tensor_dims(randn(8, 16, dtype=torch.float16, seed=i), ["R", "C"]) for i in range(2)]
    with warnings.catch_warnings():
        warnings.simplefilter("error", fspyre.FspyreWarning)
        cap = capture(f, args)
    assert all(op.hints for op in cap.graph.ops)
    with pytest.warns(fspyre.FspyreWarning, match=r"op buf\d.*so the level makes no loop"):
        fspyre.compile(cap.graph, machine=MACHINE, tiling="hints")
    got = fspyre.run(fspyre.compile(cap.graph, machine=MACHINE, tiling="none"), cap.inputs(*args))["out"]
    close(got, eager(f, *args)[0], torch.float16)
