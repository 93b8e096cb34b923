"""Scaled dot-product attention (ft.ops.sdpa_forward / sdpa_backward, F.scaled_dot_product_attention): forward
and log-sum-exp against NumPy float64, causal or not, Tq != Tk, strided and transposed inputs, backward against
the analytic gradients (checked by central differences), the gradient rule, bitwise equality across thread
counts, bad input, and PyTorch when it imports."""
import numpy as np
import pytest

import fasttrain as ft
from _opref import bits, fd_grad, n, t
from fasttrain.testing import gradcheck

F = ft.nn.functional
rng = np.random.default_rng(0)


def ref_probs(q, k, scale, causal):
    s = q @ np.swapaxes(k, -1, -2) * scale
    if causal:  # query i sees keys j <= i (top-left aligned)
        s = np.where(np.tril(np.ones(s.shape[-2:], bool)), s, -np.inf)
    m = s.max(-1, keepdims=True)
    e = np.exp(s - m)
    return e / e.sum(-1, keepdims=True), (m + np.log(e.sum(-1, keepdims=True)))[..., 0]


def ref_forward(q, k, v, scale, causal):
    p, lse = ref_probs(q, k, scale, causal)
    return p @ v, lse


def ref_backward(q, k, v, dout, scale, causal):
    p, _ = ref_probs(q, k, scale, causal)
    dp = dout @ np.swapaxes(v, -1, -2)
    ds = p * (dp - (dp * p).sum(-1, keepdims=True))
    return ds @ k * scale, np.swapaxes(ds, -1, -2) @ q * scale, np.swapaxes(p, -1, -2) @ dout


def inputs(N, H, Tq, Tk, D, seed=1):
    r = np.random.default_rng(seed)
    return (r.normal(size=(N, H, Tq, D)), r.normal(size=(N, H, Tk, D)), r.normal(size=(N, H, Tk, D)),
            r.normal(size=(N, H, Tq, D)))


# (N, H, Tq, Tk, D, causal): sizes that are and are not whole blocks (64) and whole vectors (16)
CASES = [(2, 3, 70, 70, 20, False), (2, 3, 70, 70, 20, True), (1, 2, 5, 130, 64, False), (2, 2, 130, 200, 33, True),
         (1, 1, 200, 65, 16, True), (1, 2, 64, 64, 64, True), (3, 1, 1, 7, 1, False), (1, 1, 9, 3, 8, True)]


@pytest.mark.parametrize("N,H,Tq,Tk,D,causal", CASES, ids=str)
def test_forward(N, H, Tq, Tk, D, causal):
    q, k, v, _ = inputs(N, H, Tq, Tk, D)
    want, want_lse = ref_forward(q, k, v, 1 / np.sqrt(D), causal)
    out, lse = ft.ops.sdpa_forward(None, None, t(q), t(k), t(v), causal=causal)
    assert out.shape == (N, H, Tq, D) and lse.shape == (N, H, Tq)
    np.testing.assert_allclose(n(out), want, rtol=1e-5, atol=2e-6)
    np.testing.assert_allclose(n(lse), want_lse, rtol=1e-5, atol=2e-6)
    y = F.scaled_dot_product_attention(t(q), t(k), t(v), is_causal=causal)
    assert bits(y) == bits(out)


@pytest.mark.parametrize("N,H,Tq,Tk,D,causal", CASES, ids=str)
def test_backward(N, H, Tq, Tk, D, causal):
    q, k, v, dout = inputs(N, H, Tq, Tk, D, seed=2)
    scale = 0.3
    out, lse = ft.ops.sdpa_forward(None, None, t(q), t(k), t(v), scale, causal)
    got = ft.ops.sdpa_backward(None, None, None, t(dout), t(q), t(k), t(v), out, lse, scale, causal)
    for g, w in zip(got, ref_backward(q, k, v, dout, scale, causal)):
        np.testing.assert_allclose(n(g), w, rtol=1e-4, atol=2e-5)


@pytest.mark.parametrize("causal", [False, True])
def test_analytic_gradients_match_finite_differences(causal):
    q, k, v, dout = inputs(1, 2, 4, 4 if causal else 5, 3, seed=3)
    scale = 0.7
    dq, dk, dv = ref_backward(q, k, v, dout, scale, causal)
    np.testing.assert_allclose(dq, fd_grad(lambda x: ref_forward(x, k, v, scale, causal)[0], q, dout), atol=1e-6)
    np.testing.assert_allclose(dk, fd_grad(lambda x: ref_forward(q, x, v, scale, causal)[0], k, dout), atol=1e-6)
    np.testing.assert_allclose(dv, fd_grad(lambda x: ref_forward(q, k, x, scale, causal)[0], v, dout), atol=1e-6)
    out, lse = ft.ops.sdpa_forward(None, None, t(q), t(k), t(v), scale, causal)
    got = ft.ops.sdpa_backward(None, None, None, t(dout), t(q), t(k), t(v), out, lse, scale, causal)
    for g, w in zip(got, (dq, dk, dv)):
        np.testing.assert_allclose(n(g), w, rtol=1e-5, atol=1e-6)


def heads_view(a, dtype="float32"):
    """(N, H, T, D) values as the transpose of a (N, T, H, D) tensor: how attention layers feed the op."""
    return ft.from_numpy(np.ascontiguousarray(np.asarray(a, np.float32).transpose(0, 2, 1, 3))).to(dtype) \
        .transpose(1, 2)


def every_other_row(a, dtype="float32"):
    """(N, H, T, D) values at every other T row of a wider tensor, with a negative-free but odd stride."""
    a = np.asarray(a, np.float32)
    wide = np.zeros(a.shape[:2] + (2 * a.shape[2],) + a.shape[3:], np.float32)
    wide[:, :, ::2] = a
    return ft.from_numpy(wide).to(dtype)[:, :, ::2]


def one_element_in(a, dtype="float32"):
    """Contiguous (N, H, T, D) values starting one element into their memory (bfloat16: not 4-byte aligned)."""
    flat = np.zeros(a.size + 1, np.float32)
    flat[1:] = np.ravel(a)
    return ft.from_numpy(flat).to(dtype)[1:].reshape(a.shape)


@pytest.mark.parametrize("make", [heads_view, every_other_row, one_element_in])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("D,dtype", [(24, "float32"), (32, "float32"), (32, "bfloat16")])
def test_strided_inputs_and_outputs_are_bitwise_equal(make, causal, D, dtype):
    """Views give the bits of contiguous tensors, whether the blocks are read in place (whole vectors of
    float32, whole aligned pairs of bfloat16) or copied."""
    q, k, v, dout = inputs(2, 3, 67, 80, D, seed=4)
    c = lambda a: t(a).to(dtype)  # noqa: E731
    assert make(q, dtype).stride()[-1] == 1
    out, lse = ft.ops.sdpa_forward(None, None, c(q), c(k), c(v), causal=causal)
    grads = ft.ops.sdpa_backward(None, None, None, c(dout), c(q), c(k), c(v), out, lse, causal=causal)
    so, slse = ft.ops.sdpa_forward(make(np.zeros(q.shape), dtype), None, make(q, dtype), make(k, dtype),
                                   make(v, dtype), causal=causal)
    assert bits(so.contiguous()) == bits(out) and bits(slse) == bits(lse)
    outs = [make(np.zeros(x.shape), dtype) for x in (q, k, v)]
    sg = ft.ops.sdpa_backward(*outs, make(dout, dtype), make(q, dtype), make(k, dtype), make(v, dtype),
                              make(n(out.to("float32")), dtype), lse, causal=causal)
    for a, b in zip(sg, grads):
        assert bits(a.contiguous()) == bits(b)
    # outputs allocated for a transposed input follow its memory order
    assert ft.ops.sdpa_forward(None, False, heads_view(q), t(k), t(v))[0].stride() == heads_view(q).stride()


def test_functional_three_dims_scale_and_skipped_outputs():
    q, k, v, dout = inputs(3, 1, 11, 13, 8, seed=5)
    y = F.scaled_dot_product_attention(t(q[:, 0]), t(k[:, 0]), t(v[:, 0]), scale=0.5)
    assert y.shape == (3, 11, 8)
    np.testing.assert_allclose(n(y), ref_forward(q, k, v, 0.5, False)[0][:, 0], rtol=1e-5, atol=2e-6)
    out, lse = ft.ops.sdpa_forward(None, False, t(q), t(k), t(v))
    assert lse is None
    out, lse = ft.ops.sdpa_forward(None, None, t(q), t(k), t(v))
    full = ft.ops.sdpa_backward(None, None, None, t(dout), t(q), t(k), t(v), out, lse)
    for keep in range(3):  # each gradient alone gives the same bits
        outs = [None if i == keep else False for i in range(3)]
        got = ft.ops.sdpa_backward(*outs, t(dout), t(q), t(k), t(v), out, lse)
        assert [g is None for g in got] == [i != keep for i in range(3)]
        assert bits(got[keep]) == bits(full[keep])


def test_gradient_rule_writes_then_adds():
    q, k, v, dout = inputs(2, 2, 30, 40, 16, seed=6)
    out, lse = ft.ops.sdpa_forward(None, None, t(q), t(k), t(v), causal=True)
    want = ref_backward(q, k, v, dout, 0.25, True)
    garbage = [t(rng.normal(size=x.shape)) for x in (q, k, v)]
    ft.ops.sdpa_backward(*garbage, t(dout), t(q), t(k), t(v), out, lse, causal=True)  # written, not added
    for g, w in zip(garbage, want):
        np.testing.assert_allclose(n(g), w, rtol=1e-4, atol=2e-5)
    start = [rng.normal(size=x.shape).astype(np.float32) for x in (q, k, v)]
    acc = [t(s) for s in start]
    assert ft.ops.sdpa_backward(*acc, t(dout), t(q), t(k), t(v), out, lse, causal=True, accumulate=True)[0] is acc[0]
    for g, s, w in zip(acc, start, want):
        np.testing.assert_allclose(n(g), s + w, rtol=1e-4, atol=2e-5)
    with pytest.raises(ValueError, match="accumulate=True adds into the gradient tensors given"):
        ft.ops.sdpa_backward(None, acc[1], acc[2], t(dout), t(q), t(k), t(v), out, lse, accumulate=True)


@pytest.mark.parametrize("extra", ["", "dropout", "key_mask"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("Tq,Tk,D", [(150, 130, 40), (151, 129, 17)])  # odd sizes: padded pairs and rows
@pytest.mark.parametrize("N,H,causal", [(1, 2, False), (2, 1, True), (4, 4, True), (3, 5, False)])
def test_deterministic_across_thread_counts(threads, N, H, causal, Tq, Tk, D, dtype, extra):
    # few heads: dq in a pass of its own at 2 threads, within the key pass at 1; both must give the same bits
    q, k, v, dout = (t(a).to(dtype) for a in inputs(N, H, Tq, Tk, D, seed=7))
    kw = dict(causal=causal, dropout_p=0.2 if extra == "dropout" else 0.0, seed=5, offset=11,
              key_mask=ft.tensor(np.random.default_rng(24).random((N, Tk)) < 0.5) if extra == "key_mask" else None)
    res = []
    for nt in (1, 2):
        threads(nt)
        out, lse = ft.ops.sdpa_forward(None, None, q, k, v, **kw)
        grads = ft.ops.sdpa_backward(None, None, None, dout, q, k, v, out, lse, **kw)
        dq_alone = ft.ops.sdpa_backward(None, False, False, dout, q, k, v, out, lse, **kw)[0]
        res.append([bits(x) for x in (out, lse, *grads, dq_alone)])
    assert res[0] == res[1]
    assert res[0][2] == res[0][5]


def test_empty_and_keyless():
    out, lse = ft.ops.sdpa_forward(None, None, ft.zeros(2, 3, 0, 8), ft.zeros(2, 3, 5, 8), ft.zeros(2, 3, 5, 8))
    assert out.shape == (2, 3, 0, 8) and lse.shape == (2, 3, 0)
    out, lse = ft.ops.sdpa_forward(None, None, ft.ones(1, 2, 3, 4), ft.zeros(1, 2, 0, 4), ft.zeros(1, 2, 0, 4))
    assert (n(out) == 0).all() and (n(lse) == -np.inf).all()  # no key to attend to: out 0, lse -inf
    dq, dk, dv = ft.ops.sdpa_backward(None, None, None, ft.ones(1, 2, 3, 4), ft.ones(1, 2, 3, 4), ft.zeros(1, 2, 0, 4),
                                      ft.zeros(1, 2, 0, 4), out, lse)
    assert (n(dq) == 0).all() and dk.shape == (1, 2, 0, 4)


def test_bad_input():
    q, k = ft.zeros(2, 3, 5, 8), ft.zeros(2, 3, 6, 8)
    with pytest.raises(ValueError, match=r"sdpa: v should have shape \(2, 3, 6, 8\), got \(2, 3, 7, 8\)"):
        ft.ops.sdpa_forward(None, None, q, k, ft.zeros(2, 3, 7, 8))
    with pytest.raises(ValueError, match=r"sdpa: k should have shape \(2, 3, 6, 8\), got \(2, 3, 6, 4\)"):
        ft.ops.sdpa_forward(None, None, q, ft.zeros(2, 3, 6, 4), k)
    with pytest.raises(ValueError, match=r"sdpa: q should have 4 dimensions \(N, H, T, D\)"):
        ft.ops.sdpa_forward(None, None, ft.zeros(3, 5, 8), k, k)
    with pytest.raises(TypeError, match="sdpa: q must be float32 or bfloat16 \\(or float16 on CUDA\\), got float64"):
        ft.ops.sdpa_forward(None, None, ft.zeros(2, 3, 5, 8, dtype=ft.float64), k, k)
    with pytest.raises(TypeError, match="sdpa: v must be float32 or bfloat16 \\(or float16 on CUDA\\), got int64"):
        ft.ops.sdpa_forward(None, None, q, k, ft.zeros(2, 3, 6, 8, dtype=ft.int64))
    with pytest.raises(ValueError, match="sdpa: k must have unit stride along D .*got stride 2"):
        ft.ops.sdpa_forward(None, None, q, ft.zeros(2, 3, 6, 16)[..., ::2], k)
    with pytest.raises(ValueError, match=r"sdpa: lse should have shape \(2, 3, 5\), got \(2, 3, 6\)"):
        ft.ops.sdpa_forward(None, ft.zeros(2, 3, 6), q, k, k)
    with pytest.raises(ValueError, match="sdpa: out cannot be q itself"):
        ft.ops.sdpa_forward(q, None, q, k, k)
    with pytest.raises(ValueError, match="sdpa: scale must be positive"):
        ft.ops.sdpa_forward(None, None, q, k, k, -1.0)
    out, lse = ft.ops.sdpa_forward(None, None, q, k, k)
    with pytest.raises(ValueError, match=r"sdpa_backward: dout should have shape \(2, 3, 5, 8\)"):
        ft.ops.sdpa_backward(None, None, None, k, q, k, k, out, lse)
    with pytest.raises(ValueError, match=r"sdpa_backward: lse should have shape \(2, 3, 5\)"):
        ft.ops.sdpa_backward(None, None, None, out, q, k, k, out, ft.zeros(2, 3))
    with pytest.raises(ValueError, match="sdpa_backward: dk cannot be k itself"):
        ft.ops.sdpa_backward(False, k, False, out, q, k, ft.zeros(2, 3, 6, 8), out, lse)
    for p in (1.5, -0.1, float("nan")):
        with pytest.raises(ValueError, match=r"dropout_p must be in \[0, 1\]"):
            F.scaled_dot_product_attention(q, k, k, dropout_p=p)
        with pytest.raises(ValueError, match=r"dropout_p must be in \[0, 1\]"):
            F.scaled_dot_product_attention(q, k, k, attn_mask=ft.zeros(5, 6), dropout_p=p)
        with pytest.raises(ValueError, match=r"sdpa: dropout_p must be in \[0, 1\], got"):
            ft.ops.sdpa_forward(None, None, q, k, k, dropout_p=p)
        with pytest.raises(ValueError, match=r"sdpa: dropout_p must be in \[0, 1\], got"):
            ft.ops.sdpa_backward(None, None, None, out, q, k, k, out, lse, dropout_p=p)
    with pytest.raises(ValueError, match=r"all be \(N, H, T, D\) or all \(N, T, D\)"):
        F.scaled_dot_product_attention(q, ft.zeros(2, 6, 8), k)


def torch_sdpa(torch):
    """PyTorch's SDPA: the public function (2.0 and later) or 1.13's private one."""
    if hasattr(torch.nn.functional, "scaled_dot_product_attention"):
        return lambda q, k, v, causal: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    private = torch.nn.functional._scaled_dot_product_attention
    return lambda q, k, v, causal: private(q, k, v, None, 0.0, False, causal)[0]


@pytest.mark.parametrize("N,H,Tq,Tk,D,causal", CASES, ids=str)
def test_against_torch(N, H, Tq, Tk, D, causal):
    torch = pytest.importorskip("torch")
    sdpa = torch_sdpa(torch)
    q, k, v, dout = (x.astype(np.float32) for x in inputs(N, H, Tq, Tk, D, seed=8))
    tq, tk, tv = (torch.tensor(x, requires_grad=True) for x in (q, k, v))
    y = sdpa(tq, tk, tv, causal)
    y.backward(torch.tensor(dout))
    out, lse = ft.ops.sdpa_forward(None, None, t(q), t(k), t(v), causal=causal)
    np.testing.assert_allclose(n(out), y.detach().numpy(), rtol=1e-5, atol=2e-6)
    grads = ft.ops.sdpa_backward(None, None, None, t(dout), t(q), t(k), t(v), out, lse, causal=causal)
    for g, w in zip(grads, (tq.grad, tk.grad, tv.grad)):
        np.testing.assert_allclose(n(g), w.numpy(), rtol=1e-4, atol=2e-5)


@pytest.mark.parametrize("mask", [lambda T: ft.ones(T, T, dtype=ft.bool).tril(),
                                  lambda T: ft.ones(1, 1, T, T, dtype=ft.bool).tril(),
                                  lambda T: ft.triu(ft.ones(T, T) * float("-inf"), diagonal=1)],
                         ids=["bool", "bool-broadcast", "additive"])
def test_a_causal_attn_mask_is_is_causal(mask):
    """The causal masks code passes as attn_mask (a bool one keeping the positions on and below the diagonal, or an
    additive one) compute is_causal=True, eagerly and compiled."""
    q = ft.tensor(np.random.default_rng(40).standard_normal((2, 2, 5, 4)).astype(np.float32))
    want = F.scaled_dot_product_attention(q, q, q, is_causal=True).numpy()
    np.testing.assert_array_equal(F.scaled_dot_product_attention(q, q, q, attn_mask=mask(5)).numpy(), want)
    assert not np.array_equal(F.scaled_dot_product_attention(q, q, q).numpy(), want)

    class Heads(ft.nn.Module):
        def __init__(self, masked):
            super().__init__()
            self.masked, self.qkv, self.head = masked, ft.nn.Linear(4, 12), ft.nn.Linear(4, 3)

        def forward(self, x):
            q, k, v = (t.view(x.size(0), 5, 2, 2).transpose(1, 2) for t in self.qkv(x).chunk(3, -1))
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask(5)) if self.masked else \
                F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.head(a.transpose(1, 2).reshape(x.size(0), 5, 4)[:, 0])

    x, y = np.random.default_rng(41).standard_normal((2, 5, 4)).astype(np.float32), np.array([0, 2])
    losses = []
    for masked in (True, False):
        ft.manual_seed(42)
        model = Heads(masked)
        losses.append(model.compile(ft.optim.SGD(model.parameters(), lr=0.1), batch_size=2, input_shape=(5, 4),
                                    memory_format="contiguous").backward(x, y))
    assert losses[0] == losses[1]


# ---- dropout on the attention weights ----

def weights_mask(shape, p, seed, offset):
    """The factors dropout_forward gives the (N, H, Tq, Tk) weights at (p, seed, offset): its mask is checked
    against Random123's Philox in test_ops_dropout."""
    return n(ft.ops.dropout_forward(None, ft.ones(*shape), p, seed, offset))


@pytest.mark.parametrize("N,H,Tq,Tk,D,causal", CASES[:6], ids=str)
def test_dropout_drops_the_weights_by_dropouts_mask(N, H, Tq, Tk, D, causal):
    """out = (P o Z) v with Z dropout's mask of the weights; the backward regenerates Z: dv = (P o Z)^T dout,
    dS = P (dout v^T o Z - rowsum(dout * out)). Against NumPy float64 with that mask, and lse without it."""
    q, k, v, dout = inputs(N, H, Tq, Tk, D, seed=11)
    p, seed, offset, scale = 0.3, 1234, 77, 0.4
    z = weights_mask((N, H, Tq, Tk), p, seed, offset)
    probs, want_lse = ref_probs(q, k, scale, causal)
    pz = probs * z
    kw = dict(dropout_p=p, seed=seed, offset=offset)
    out, lse = ft.ops.sdpa_forward(None, None, t(q), t(k), t(v), scale, causal, **kw)
    np.testing.assert_allclose(n(out), pz @ v, rtol=1e-5, atol=4e-6)
    np.testing.assert_allclose(n(lse), want_lse, rtol=1e-5, atol=2e-6)
    dpz = dout @ np.swapaxes(v, -1, -2) * z
    ds = probs * (dpz - (dpz * probs).sum(-1, keepdims=True))
    want = ds @ k * scale, np.swapaxes(ds, -1, -2) @ q * scale, np.swapaxes(pz, -1, -2) @ dout
    got = ft.ops.sdpa_backward(None, None, None, t(dout), t(q), t(k), t(v), out, lse, scale, causal, **kw)
    for g, w in zip(got, want):
        np.testing.assert_allclose(n(g), w, rtol=1e-4, atol=3e-5)
    dq_alone = ft.ops.sdpa_backward(None, False, False, t(dout), t(q), t(k), t(v), out, lse, scale, causal, **kw)[0]
    assert bits(dq_alone) == bits(got[0])


def test_dropout_gradients_match_finite_differences():
    """The analytic gradients under a fixed mask against central differences of the forward with that mask."""
    q, k, v, dout = inputs(1, 2, 6, 9, 5, seed=12)
    kw = dict(causal=True, dropout_p=0.4, seed=9, offset=3)

    def f(qq, kk, vv):
        return n(ft.ops.sdpa_forward(None, False, t(qq), t(kk), t(vv), **kw)[0])

    out, lse = ft.ops.sdpa_forward(None, None, t(q), t(k), t(v), **kw)
    got = ft.ops.sdpa_backward(None, None, None, t(dout), t(q), t(k), t(v), out, lse, **kw)
    fds = (fd_grad(lambda x: f(x, k, v), q, dout, 1e-2), fd_grad(lambda x: f(q, x, v), k, dout, 1e-2),
           fd_grad(lambda x: f(q, k, x), v, dout, 1e-2))
    for g, fd in zip(got, fds):
        np.testing.assert_allclose(n(g), fd, rtol=2e-2, atol=2e-3)


def test_functional_dropout_draws_from_the_default_generator():
    """F.scaled_dot_product_attention(dropout_p=p) takes the next dropout_blocks(N H Tq Tk) blocks of the default
    generator, as F.dropout of the weights would: ft.manual_seed repeats it, the next call draws a new mask; the
    dropped fraction is p, and p = 0 gives the bits of no dropout."""
    q, k, v, _ = (t(a) for a in inputs(2, 2, 40, 50, 8, seed=14))
    ft.manual_seed(3)
    g = ft.default_generator
    seed, before = g._seed, g._offset
    a = F.scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    assert g._offset - before == ft.ops.dropout_blocks(2 * 2 * 40 * 50)
    b = F.scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    ft.manual_seed(3)
    assert bits(F.scaled_dot_product_attention(q, k, v, dropout_p=0.5)) == bits(a) != bits(b)
    want = ft.ops.sdpa_forward(None, False, q, k, v, dropout_p=0.5, seed=seed, offset=before)[0]
    assert bits(a) == bits(want)
    assert bits(F.scaled_dot_product_attention(q, k, v, dropout_p=0.0)) == \
        bits(F.scaled_dot_product_attention(q, k, v))
    z = weights_mask((2, 2, 40, 50), 0.5, seed, before)
    assert abs((z == 0).mean() - 0.5) < 0.03


def test_compiled_attention_dropout_is_the_ops_in_the_step_and_off_in_eval():
    """A compiled step's attention drops the weights by the mask at the program's next draw (its loss is the eager
    forward's with that mask), draws a new one each step, and predict runs without dropout."""
    E, H, T, p = 8, 2, 6, 0.5

    class Heads(ft.nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = ft.nn.Linear(E, 3 * E)

        def forward(self, x, seed=None):
            q, k, v = (a.view(x.size(0), T, H, E // H).transpose(1, 2) for a in self.qkv(x).chunk(3, -1))
            if seed is None:
                a = F.scaled_dot_product_attention(q, k, v, dropout_p=p if self.training else 0.0, is_causal=True)
            else:  # the op itself at the program's draw
                a = ft.ops.sdpa_forward(None, False, q.contiguous(), k.contiguous(), v.contiguous(), causal=True,
                                        dropout_p=p, seed=seed[0], offset=seed[1])[0]
            return a.transpose(1, 2).reshape(x.size(0), T, E)

    ft.manual_seed(4)
    model = Heads()
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.0), ft.nn.MSELoss(), batch_size=3,
                            input_shape=(T, E), memory_format="contiguous")
    x = np.random.default_rng(15).standard_normal((3, T, E)).astype(np.float32)
    y = np.zeros((3, T, E), np.float32)
    losses = set()
    for _ in range(3):
        state = program._c.get_dropout_state()
        loss = program.train_step(x, y)
        want = model(ft.tensor(x), state).numpy()
        assert loss == pytest.approx(float((want.astype(np.float64) ** 2).mean()), rel=1e-5)
        losses.add(loss)
    assert len(losses) == 3
    model.eval()
    np.testing.assert_allclose(program.predict(x).numpy(), model(ft.tensor(x)).numpy(), rtol=1e-5, atol=1e-6)


def test_encoder_layer_with_pytorchs_default_dropout_compiles_and_matches_it_in_eval():
    """TransformerEncoderLayer's default dropout=0.1 (attention weights included) compiles; in eval mode its output
    is PyTorch's layer's with the same weights, and training steps draw fresh masks."""
    ft.manual_seed(16)
    layer = ft.nn.TransformerEncoderLayer(16, 4, 32, batch_first=True)
    assert layer.self_attn.dropout == 0.1 and layer.dropout.p == 0.1
    program = layer.compile(ft.optim.SGD(layer.parameters(), lr=0.0), ft.nn.MSELoss(), batch_size=2,
                            input_shape=(7, 16))
    x, y = np.random.default_rng(17).standard_normal((2, 2, 7, 16)).astype(np.float32)
    assert len({program.train_step(x, y) for _ in range(3)}) == 3  # (a layer norm's output against 0 has loss ~1)
    layer.eval()
    got = program.predict(x).numpy()
    np.testing.assert_allclose(layer(ft.tensor(x)).numpy(), got, rtol=1e-5, atol=1e-5)
    torch = pytest.importorskip("torch")
    tl = torch.nn.TransformerEncoderLayer(16, 4, 32, batch_first=True).eval()
    tl.load_state_dict({k: torch.from_numpy(v) for k, v in layer.state_dict().items()})
    with torch.no_grad():
        np.testing.assert_allclose(tl(torch.from_numpy(x)).numpy(), got, rtol=1e-4, atol=1e-5)
    no_bias = torch.nn.TransformerEncoderLayer(16, 4, 32, batch_first=True, bias=False)
    assert list(ft.nn.TransformerEncoderLayer(16, 4, 32, batch_first=True, bias=False).state_dict()) == \
        list(no_bias.state_dict())  # no bias anywhere, the layer norms' included


def test_attention_dropout_fixed_at_compile_is_kept_and_changes_refused():
    """An attention layer's dropout is fixed by compile as a Dropout's p is: changing it or the layer's mode
    afterwards is refused, and ft.fit keeps a layer compiled in eval mode (no attention dropout) in eval mode."""
    ft.manual_seed(18)
    model = ft.nn.Sequential(ft.nn.Linear(4, 8), ft.nn.TransformerEncoderLayer(8, 2, 16, batch_first=True))
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), ft.nn.MSELoss(), batch_size=2,
                            input_shape=(3, 4))
    x, y = np.ones((2, 3, 4), np.float32), np.zeros((2, 3, 8), np.float32)
    attn = model[1].self_attn
    attn.dropout = 0.2
    with pytest.raises(ValueError, match=r"MultiheadAttention.dropout changed from 0.1 to 0.2 after compile"):
        program.train_step(x, y)
    attn.dropout = 0.1
    attn.eval()
    with pytest.raises(ValueError, match=r"MultiheadAttention '1.self_attn' is in eval mode, but was in training mode"):
        program.train_step(x, y)
    attn.train()
    program.train_step(x, y)
    attn.eval()
    frozen = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), ft.nn.MSELoss(), batch_size=2,
                           input_shape=(3, 4))
    assert "dropout" not in repr(frozen.entries[2].module)  # the attention node: no dropout traced
    ft.fit(frozen, (x, y), epochs=1, progress=False)
    assert model.training and not attn.training


# ---- masks of keys (padding masks) ----

def ref_masked(q, k, v, dout, scale, causal, masked, z=1.0):
    """out, lse and (dq, dk, dv) in NumPy float64 with keys masked out ((N, Tk) True) and dropout factors z; a
    query that sees no key gets out 0, lse -inf and no gradient."""
    s = q @ np.swapaxes(k, -1, -2) * scale
    seen = ~masked[:, None, None, :]
    if causal:
        seen = seen & np.tril(np.ones(s.shape[-2:], bool))
    s = np.where(seen, s, -np.inf)
    m = s.max(-1, keepdims=True)
    e = np.exp(s - np.where(np.isfinite(m), m, 0))
    total = e.sum(-1, keepdims=True)
    p = e / np.where(total > 0, total, 1)
    lse = np.where(total[..., 0] > 0, (m + np.log(np.where(total > 0, total, 1)))[..., 0], -np.inf)
    dpz = dout @ np.swapaxes(v, -1, -2) * z
    ds = p * (dpz - (dpz * p).sum(-1, keepdims=True))
    return (p * z) @ v, lse, (ds @ k * scale, np.swapaxes(ds, -1, -2) @ q * scale, np.swapaxes(p * z, -1, -2) @ dout)


@pytest.mark.parametrize("dropout_p", [0.0, 0.25])
@pytest.mark.parametrize("N,H,Tq,Tk,D,causal", [(3, 2, 70, 130, 20, False), (4, 3, 65, 65, 16, True),
                                                (2, 1, 5, 9, 8, False), (5, 4, 80, 80, 24, False)], ids=str)
def test_key_mask_masks_keys_out(N, H, Tq, Tk, D, causal, dropout_p):
    """Keys masked out get no weight (a padding mask); a sample whose keys are all masked gets out 0, lse -inf and
    zero gradients (PyTorch gives NaN there). Against NumPy float64, with dropout too; dq alone the same bits."""
    q, k, v, dout = inputs(N, H, Tq, Tk, D, seed=21)
    masked = np.random.default_rng(22).random((N, Tk)) < 0.3
    masked[0] = True
    kw = dict(causal=causal, dropout_p=dropout_p, seed=8, offset=2, key_mask=ft.tensor(masked))
    z = weights_mask((N, H, Tq, Tk), dropout_p, 8, 2) if dropout_p else 1.0
    want_out, want_lse, want = ref_masked(q, k, v, dout, 0.5, causal, masked, z)
    out, lse = ft.ops.sdpa_forward(None, None, t(q), t(k), t(v), 0.5, **kw)
    np.testing.assert_allclose(n(out), want_out, rtol=1e-5, atol=4e-6)
    np.testing.assert_array_equal(np.isneginf(n(lse)), np.isneginf(want_lse))
    np.testing.assert_allclose(n(lse)[1:], want_lse[1:], rtol=1e-5, atol=2e-6)
    got = ft.ops.sdpa_backward(None, None, None, t(dout), t(q), t(k), t(v), out, lse, 0.5, **kw)
    for g, w in zip(got, want):
        np.testing.assert_allclose(n(g), w, rtol=1e-4, atol=3e-5)
    assert (n(got[0])[0] == 0).all() and (n(got[1])[0] == 0).all()
    dq = ft.ops.sdpa_backward(None, False, False, t(dout), t(q), t(k), t(v), out, lse, 0.5, **kw)[0]
    assert bits(dq) == bits(got[0])


def test_key_mask_bad_input():
    q, k = ft.zeros(2, 3, 5, 8), ft.zeros(2, 3, 6, 8)
    with pytest.raises(TypeError, match="sdpa: key_mask must be bool, got float32"):
        ft.ops.sdpa_forward(None, None, q, k, k, key_mask=ft.zeros(2, 6))
    with pytest.raises(ValueError, match=r"sdpa: key_mask should have shape \(2, 6\), got \(2, 5\)"):
        ft.ops.sdpa_forward(None, None, q, k, k, key_mask=ft.zeros(2, 5, dtype=ft.bool))
    out, lse = ft.ops.sdpa_forward(None, None, q, k, k)
    with pytest.raises(ValueError, match=r"sdpa_backward: key_mask should have shape \(2, 6\)"):
        ft.ops.sdpa_backward(None, None, None, out, q, k, k, out, lse, key_mask=ft.zeros(6, dtype=ft.bool))
    with pytest.raises(ValueError, match="a mask of keys for 3 samples, but the batch has 2"):
        F.scaled_dot_product_attention(q, k, k, attn_mask=ft.ones(3, 1, 1, 6, dtype=ft.bool))


PADDING_MASKS = {  # the keys kept per sample, as each form writes a padding mask for F.scaled_dot_product_attention
    "bool": lambda kept: ft.tensor(kept[:, None, None, :]),
    "additive": lambda kept: ft.tensor(np.where(kept, 0.0, -np.inf).astype(np.float32)[:, None, None, :]),
    "hugging_face": lambda kept: ft.tensor(((1.0 - kept) * np.finfo(np.float32).min).astype(np.float32)[:, None,
                                                                                                         None, :]),
}


@pytest.mark.parametrize("form", PADDING_MASKS)
def test_functional_takes_padding_masks_in_pytorchs_forms(form):
    """F.scaled_dot_product_attention(attn_mask=) of a padding mask (bool True where attention is allowed,
    additive 0/-inf, or Hugging Face's 0/float32-lowest) equals the op's key_mask, and PyTorch's when it
    imports; the mask broadcasts over heads and queries, and over the batch when its first dimension is 1."""
    q, k, v, _ = (t(a) for a in inputs(3, 2, 7, 9, 8, seed=25))
    kept = np.random.default_rng(26).random((3, 9)) < 0.6
    kept[:, 0] = True
    got = F.scaled_dot_product_attention(q, k, v, attn_mask=PADDING_MASKS[form](kept))
    want = ft.ops.sdpa_forward(None, False, q, k, v, key_mask=ft.tensor(~kept))[0]
    np.testing.assert_array_equal(n(got), n(want))
    one = F.scaled_dot_product_attention(q, k, v, attn_mask=PADDING_MASKS[form](kept[:1]))
    np.testing.assert_array_equal(n(one), n(ft.ops.sdpa_forward(None, False, q, k, v, key_mask=ft.tensor(
        np.repeat(~kept[:1], 3, 0)))[0]))
    torch = pytest.importorskip("torch")
    mask = torch.from_numpy(PADDING_MASKS[form](kept).numpy())
    tq, tk, tv = (torch.from_numpy(x.numpy()) for x in (q, k, v))
    np.testing.assert_allclose(n(got), torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, attn_mask=mask),
                               rtol=1e-5, atol=2e-6)


PAD, VOCAB = 0, 30


def padded_classifier(lib, enable_nested_tensor=True):
    """A text classifier as PyTorch users write one over padded batches: the padding mask from the ids
    (ids == PAD) into the encoder's src_key_padding_mask, and a mean over the positions that are not padding."""
    nn = lib.nn
    extra = {} if lib is ft else dict(enable_nested_tensor=enable_nested_tensor)

    class Classifier(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(VOCAB, 16, padding_idx=PAD)
            layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
            self.enc = nn.TransformerEncoder(layer, 2, **extra)
            self.fc = nn.Linear(16, 3)

        def forward(self, ids):
            pad = ids == PAD
            h = self.enc(self.emb(ids), src_key_padding_mask=pad)
            keep = (~pad).float().unsqueeze(-1)
            return self.fc((h * keep).sum(1) / keep.sum(1))
    return Classifier()


def padded_batch(seed):
    ids = np.random.default_rng(seed).integers(1, VOCAB, (4, 10))
    for i, length in enumerate((10, 7, 3, 1)):
        ids[i, length:] = PAD
    return ids, np.array([0, 1, 2, 1])


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
def test_compiled_padding_mask_from_the_ids(precision):
    """ids == PAD traced into the encoder's key padding mask and a masked mean: the compiled step's loss equals
    the eager model's, and PyTorch's loss and gradients with the same weights when it imports."""
    if precision != "32-true" and not ft.backends.cpu_has_bf16():
        pytest.skip("no AVX512-BF16")
    ft.manual_seed(27)
    model = padded_classifier(ft)
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), ft.nn.CrossEntropyLoss(), batch_size=4,
                            input_shape=(10,), input_dtype=ft.int64, precision=precision)
    ids, y = padded_batch(28)
    assert "bool" in program.summary() or precision == "32-true"
    loss = program.backward(ids, y)
    eager = model(ft.tensor(ids))
    logp = eager.numpy() - np.log(np.exp(eager.numpy()).sum(1, keepdims=True))
    want = -logp[np.arange(4), y].mean()
    assert loss == pytest.approx(want, rel=1e-5 if precision == "32-true" else 2e-2)
    if precision != "32-true":
        return
    model.eval()
    np.testing.assert_allclose(program.predict(ids).numpy(), eager.numpy(), rtol=1e-5, atol=1e-6)
    torch = pytest.importorskip("torch")
    theirs = padded_classifier(torch, enable_nested_tensor=False)
    theirs.load_state_dict({k: torch.from_numpy(v) for k, v in model.state_dict().items()})
    tl = torch.nn.functional.cross_entropy(theirs(torch.from_numpy(ids)), torch.from_numpy(y))
    tl.backward()
    assert loss == pytest.approx(tl.item(), rel=1e-5)
    for (name, p), tp in zip(model.named_parameters(), theirs.parameters()):
        np.testing.assert_allclose(p.grad.numpy(), tp.grad.numpy(), rtol=1e-4, atol=1e-6, err_msg=name)


def test_padding_hides_what_it_covers_in_compiled_training():
    """What the padded positions hold (the padding token's embedding) never reaches the loss or the other
    positions' gradients: the keys are masked out and the mean skips them."""
    ft.manual_seed(30)
    model = padded_classifier(ft)
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), ft.nn.CrossEntropyLoss(), batch_size=4,
                            input_shape=(10,), input_dtype=ft.int64)
    ids, y = padded_batch(31)
    runs = []
    for row in (np.zeros(16), np.random.default_rng(32).standard_normal(16)):
        model.emb.weight[PAD].copy_(row.astype(np.float32))
        model.zero_grad()
        runs.append((program.backward(ids, y), [p.grad.numpy().copy() for p in model.parameters()][1:]))
    assert runs[0][0] == runs[1][0]
    for a, b in zip(runs[0][1], runs[1][1]):
        np.testing.assert_array_equal(a, b)


def test_multihead_attention_key_padding_mask_matches_pytorch():
    """MultiheadAttention(key_padding_mask=) eagerly, bool (True: padding) or additive, against PyTorch's layer;
    the attention weights it returns (need_weights, averaged over the heads or not) too: each query's sum to 1
    over the keys it sees."""
    ft.manual_seed(32)
    mha = ft.nn.MultiheadAttention(8, 2, batch_first=True)
    x = ft.tensor(np.random.default_rng(33).standard_normal((3, 5, 8)).astype(np.float32))
    pad = np.array([[0, 0, 0, 0, 0], [0, 0, 0, 1, 1], [0, 1, 1, 1, 1]], bool)
    got, weights = (a.numpy() for a in mha(x, x, x, key_padding_mask=ft.tensor(pad)))
    per_head = mha(x, x, x, key_padding_mask=ft.tensor(pad), average_attn_weights=False, is_causal=True)[1].numpy()
    assert weights.shape == (3, 5, 5) and per_head.shape == (3, 2, 5, 5)
    np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-6)
    assert (weights[pad[:, None, :].repeat(5, 1)] == 0).all() and (np.triu(per_head, 1) == 0).all()
    assert mha(x, x, x, need_weights=False)[1] is None
    dropping = ft.nn.MultiheadAttention(8, 2, dropout=0.5, batch_first=True)  # weights after dropout, as PyTorch's:
    out, w = dropping(x, x, x, average_attn_weights=False)  # the output is their product with the values
    v = ft.nn.functional.linear(x, dropping.in_proj_weight, dropping.in_proj_bias).numpy()[..., 16:]
    heads = (w.numpy() @ v.reshape(3, 5, 2, 4).transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3).reshape(3, 5, 8)
    np.testing.assert_allclose(out.numpy(), heads @ dropping.out_proj.weight.numpy().T + dropping.out_proj.bias.numpy(),
                               rtol=1e-5, atol=1e-6)
    assert not np.allclose(w.numpy().sum(-1), 1.0)
    additive = ft.tensor(np.where(pad, -np.inf, 0.0).astype(np.float32))
    np.testing.assert_array_equal(mha(x, x, x, key_padding_mask=additive)[0].numpy(), got)
    assert not np.allclose(mha(x, x, x)[0].numpy(), got)
    torch = pytest.importorskip("torch")
    theirs = torch.nn.MultiheadAttention(8, 2, batch_first=True)
    theirs.load_state_dict({k: torch.from_numpy(v) for k, v in mha.state_dict().items()})
    tx = torch.from_numpy(x.numpy())
    with torch.no_grad():
        want, want_weights = theirs(tx, tx, tx, key_padding_mask=torch.from_numpy(pad))
        causal = torch.ones(5, 5, dtype=torch.bool).triu(1)
        want_per_head = theirs(tx, tx, tx, key_padding_mask=torch.from_numpy(pad), attn_mask=causal,
                               average_attn_weights=False)[1]
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(weights, want_weights.numpy(), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(per_head, want_per_head.numpy(), rtol=1e-5, atol=1e-7)


def test_traced_masks_refused_where_they_cannot_be_compiled():
    """Masks a compiled program cannot take fail at compile, naming the line: ~ of a value that is not a mask, a
    padding mask fixed for every sample, and a mask computed from the input that PyTorch would broadcast against the
    queries."""
    def compile_forward(forward):
        class M(ft.nn.Module):
            def __init__(self):
                super().__init__()
                self.emb, self.attn = ft.nn.Embedding(VOCAB, 8), ft.nn.MultiheadAttention(8, 2, batch_first=True)

            def forward(self, ids):
                return forward(self, ids).mean(1)
        m = M()
        return m.compile(ft.optim.SGD(m.parameters(), lr=0.1), ft.nn.MSELoss(), batch_size=2, input_shape=(5,),
                         input_dtype=ft.int64, target_shape=(8,))

    def attend(m, ids, mask):
        h = m.emb(ids)
        return m.attn(h, h, h, key_padding_mask=mask)[0]
    compile_forward(lambda m, ids: attend(m, ids, ids == ft.zeros(5, dtype=ft.int64)))  # ids compare as floats
    with pytest.raises(ft.nn.TracingError, match=r"~ \(logical_not\) of a traced value of float32"):
        compile_forward(lambda m, ids: ~m.emb(ids))
    with pytest.raises(ft.nn.TracingError, match="a mask of keys fixed for every sample"):
        compile_forward(lambda m, ids: attend(m, ids, ft.zeros(2, 5, dtype=ft.bool)))
    with pytest.raises(ft.nn.TracingError, match="PyTorch broadcasts an \\(N, S\\) one over the queries"):
        compile_forward(lambda m, ids: F.scaled_dot_product_attention(m.emb(ids), m.emb(ids), m.emb(ids),
                                                                      attn_mask=ids != PAD))
    keep = (lambda m, ids: F.scaled_dot_product_attention(*(m.emb(ids).unsqueeze(1),) * 3,
                                                          attn_mask=(ids != PAD)[:, None, None, :]).squeeze(1))
    compile_forward(keep)
    with pytest.raises(ft.nn.TracingError, match="the attention weights of a compiled MultiheadAttention"):
        compile_forward(lambda m, ids: m.attn(m.emb(ids), m.emb(ids), m.emb(ids))[1].sum(-1))
    compile_forward(lambda m, ids: attend(m, ids, ids == PAD))


def test_functional_takes_expanded_inputs():
    """Broadcast views (stride 0 along the batch, the heads or D, as expand gives) compute what their contiguous
    copies do, with an output of the usual layout."""
    r = np.random.default_rng(37)
    q = t(r.standard_normal((1, 1, 5, 8))).expand(3, 2, 5, 8)
    k = t(r.standard_normal((3, 1, 6, 8))).expand(3, 2, 6, 8)
    v = t(r.standard_normal((3, 2, 6, 1))).expand(3, 2, 6, 8)
    out = F.scaled_dot_product_attention(q, k, v)
    assert out.shape == (3, 2, 5, 8) and out.is_contiguous()
    assert bits(out) == bits(F.scaled_dot_product_attention(q.contiguous(), k.contiguous(), v.contiguous()))


@pytest.mark.parametrize("start", [0, 1, 7])
def test_gradients_into_the_columns_of_one_packed_buffer_wherever_its_rows_start(start):
    """dq, dk and dv written into the q, k, v columns of one (N, T, 3E) buffer (a packed projection's
    gradient), its rows starting anywhere in memory: the same values as separate buffers; columns that do meet
    are refused."""
    N, H, T, D = 2, 3, 5, 6
    E = H * D
    q, k, v, dout = (t(a) for a in inputs(N, H, T, T, D, seed=3))
    out, lse = ft.ops.sdpa_forward(None, None, q, k, v, causal=True)
    want = ft.ops.sdpa_backward(None, None, None, dout, q, k, v, out, lse, causal=True)
    flat = ft.zeros(start + N * T * 3 * E)

    def part(column):
        return flat.as_strided((N, H, T, D), (T * 3 * E, D, 3 * E, 1), start + column)

    got = ft.ops.sdpa_backward(part(0), part(E), part(2 * E), dout, q, k, v, out, lse, causal=True)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(n(g), n(w))
    with pytest.raises(ValueError, match="partly overlaps"):
        ft.ops.sdpa_backward(part(0), part(D // 2), part(2 * E), dout, q, k, v, out, lse, causal=True)


# ---- masks the fused kernel does not take: attention written out ----

def ref_biased(q, k, v, bias):
    """softmax(q k^T / sqrt(D) + bias) v in float64, bias -inf where a score is masked out."""
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1]) + bias
    e = np.exp(s - s.max(-1, keepdims=True))
    return (e / e.sum(-1, keepdims=True)) @ v


class Biased(ft.nn.Module):
    """Self-attention of 2 heads under a learned (1, H, T, T) bias of the scores (T5's or Swin's relative positions,
    as a table) and, with `block`, a fixed bool pattern of the keys each query sees."""

    def __init__(self, block=None):
        super().__init__()
        self.qkv, self.head = ft.nn.Linear(4, 12), ft.nn.Linear(4, 3)
        self.bias = ft.nn.Parameter(ft.tensor(np.random.default_rng(45).normal(size=(1, 2, 5, 5)).astype(np.float32)))
        self.block = block

    def forward(self, x):
        q, k, v = (t.view(x.size(0), 5, 2, 2).transpose(1, 2) for t in self.qkv(x).chunk(3, -1))
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=self.bias)
        if self.block is not None:
            a = a + F.scaled_dot_product_attention(q, k, v, attn_mask=self.block)
        return self.head(a.transpose(1, 2).reshape(x.size(0), 5, 4)[:, 0])


@pytest.mark.parametrize("N,H,Tq,Tk,D,causal", CASES, ids=str)
def test_a_bias_of_the_scores_runs_fused_with_its_gradient(N, H, Tq, Tk, D, causal):
    """softmax(q k^T * scale + bias) v with the bias inside the kernel (a relative position bias, ALiBi's), shared
    by the samples (a stride of 0) or each sample's own, against NumPy float64: out, lse, dq, dk, dv and the bias's
    gradient dS, which is 0 where a key is not seen; bfloat16 within its rounding."""
    q, k, v, dout = inputs(N, H, Tq, Tk, D, seed=60)
    r = np.random.default_rng(61)
    for shape in ((1, H, Tq, Tk), (N, H, Tq, Tk)):
        bias = r.normal(size=shape)
        s = q @ np.swapaxes(k, -1, -2) * 0.3 + bias
        if causal:
            s = np.where(np.tril(np.ones(s.shape[-2:], bool)), s, -np.inf)
        m = s.max(-1, keepdims=True)
        p = np.exp(s - m) / np.exp(s - m).sum(-1, keepdims=True)
        dp = dout @ np.swapaxes(v, -1, -2)
        ds = p * (dp - (dp * p).sum(-1, keepdims=True))
        want = (p @ v, (m + np.log(np.exp(s - m).sum(-1, keepdims=True)))[..., 0], ds @ k * 0.3,
                np.swapaxes(ds, -1, -2) @ q * 0.3, np.swapaxes(p, -1, -2) @ dout, ds)
        for dtype, tol in ((ft.float32, 1e-5), (ft.bfloat16, 3e-2)):
            b = t(bias).to(dtype).expand(N, H, Tq, Tk)
            qs = [t(x).to(dtype) for x in (q, k, v, dout)]
            out, lse = ft.ops.sdpa_forward(None, None, *qs[:3], 0.3, causal, bias=b)
            got = (out, lse, *ft.ops.sdpa_backward(None, None, None, qs[3], *qs[:3], out, lse, 0.3, causal, bias=b))
            for g, w in zip(got, want):
                scale = max(np.abs(w).max(), 1e-30)
                assert np.abs(g.float().numpy() - w).max() <= tol * scale + tol * 1e-1, (dtype, shape)
    with pytest.raises(ValueError, match=r"bias should have shape"):
        ft.ops.sdpa_forward(None, None, t(q), t(k), t(v), bias=t(np.zeros((N, H, Tq, Tk + 1))))
    with pytest.raises(ValueError, match="dbias is the gradient of a bias, and none was given"):
        out, lse = ft.ops.sdpa_forward(None, None, t(q), t(k), t(v))
        ft._C.sdpa_backward(None, None, None, t(dout), t(q), t(k), t(v), out, lse, dbias=t(np.zeros((N, H, Tq, Tk))))


def test_a_learned_bias_compiles_into_the_fused_attention():
    """F.scaled_dot_product_attention(q, k, v, attn_mask=bias) of a learned bias (a relative position table's
    rows) runs as one attention node with the bias added inside the kernel (it formed the (N, H, T, T) scores and
    their softmax as separate nodes), with the same loss and gradients as the scores written out."""
    from test_trace import RelativeBias
    ft.manual_seed(62)
    model = RelativeBias("sdpa")
    x = np.random.default_rng(63).standard_normal((3, 4, 4)).astype(np.float32)
    y = np.random.default_rng(64).standard_normal(model.reference(x).shape).astype(np.float32)
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), ft.nn.MSELoss(), batch_size=3,
                            input_shape=(4, 4))
    kinds = [row.split()[1] for row in program.summary().splitlines()[1:] if row.strip()[:1].isdigit()]
    assert "Attention" in kinds and "Softmax" not in kinds
    np.testing.assert_allclose(n(program.predict(x)), model.reference(x), rtol=1e-5, atol=1e-6)
    assert gradcheck(program, x, y, rtol=3e-2, atol=1e-4)


def test_other_masks_run_the_attention_written_out():
    """A bias added to the scores (ALiBi's, a learned one: fused, see above) and a bool pattern that is neither
    causal nor of keys (they were refused) give PyTorch's formula, eagerly against NumPy float64 and compiled against
    finite differences, through the learned bias too; MultiheadAttention takes them as PyTorch's, (T, S) or
    (N * H, T, S)."""
    q, k, v, _ = inputs(2, 2, 5, 6, 4, seed=44)
    alibi = -np.abs(np.arange(5)[:, None] - np.arange(6)[None]) * np.array([0.5, 0.25])[:, None, None]
    block = np.random.default_rng(46).random((5, 6)) > 0.4
    block[:, 0] = True  # every query sees a key
    for mask, bias in ((alibi, alibi), (block, np.where(block, 0.0, -np.inf)),
                       (np.broadcast_to(alibi, (2, 2, 5, 6)), alibi)):
        got = F.scaled_dot_product_attention(t(q), t(k), t(v), attn_mask=ft.tensor(mask.astype(mask.dtype)))
        np.testing.assert_allclose(n(got), ref_biased(q, k, v, bias), rtol=1e-5, atol=1e-6)
    mha = ft.nn.MultiheadAttention(4, 2, batch_first=True)
    x = t(np.random.default_rng(47).normal(size=(2, 5, 4)))
    weights = []
    for mask in (alibi[0, :, :5], np.tile(alibi[:, :, :5], (2, 1, 1))):  # (T, S) for every head; (N * H, T, S)
        out, w = mha(x, x, x, attn_mask=ft.tensor(mask.astype(np.float32)), average_attn_weights=False)
        weights.append(n(w))
        qh, kh, vh = (n(p).reshape(2, 5, 2, 2).transpose(0, 2, 1, 3)
                      for p in F.linear(x, mha.in_proj_weight, mha.in_proj_bias).chunk(3, -1))
        heads = ref_biased(qh, kh, vh, mask.reshape(-1, 2, 5, 5) if mask.ndim == 3 else mask)
        np.testing.assert_allclose(n(out), n(mha.out_proj(t(heads.transpose(0, 2, 1, 3).reshape(2, 5, 4)))),
                                   rtol=1e-5, atol=1e-6)
    assert not np.allclose(weights[0][:, 1], weights[1][:, 1])  # the 3-d mask's second head has its own bias
    for block in (None, ft.tensor(block[:, :5])):
        ft.manual_seed(48)
        model = Biased(block)
        program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), batch_size=2, input_shape=(5, 4),
                                memory_format="contiguous")
        xs, y = np.random.default_rng(49).standard_normal((2, 5, 4)).astype(np.float32), np.array([0, 2])
        np.testing.assert_allclose(n(program.predict(xs)), n(model(ft.tensor(xs))), rtol=1e-5, atol=1e-6)
        assert gradcheck(program, xs, y, eps=1e-3, rtol=3e-2, atol=1e-3)
        program.backward(xs, y)
        assert np.abs(n(model.bias.grad)).max() > 1e-3


@pytest.mark.parametrize("how", ["alibi", "learned", "block", "pairs", "mha_padding", "float_padding", "encoder"])
def test_other_masks_match_pytorch(how):
    """Each mask that runs the attention written out, eagerly and compiled, against PyTorch's loss and gradients:
    ALiBi's constant bias, a learned one, a bool pattern, pairs of tokens both not padding (a mask computed from
    the input), MultiheadAttention's (T, S) bias with a padding mask, a padding mask of floats added to the scores,
    and an encoder layer's."""
    torch = pytest.importorskip("torch")
    alibi = (-np.abs(np.arange(5)[None] - np.arange(5)[:, None]) * np.array([0.5, 0.25])[:, None, None])
    block = (np.random.default_rng(50).random((5, 5)) > 0.3) | np.eye(5, dtype=bool)

    def build(lib):
        L = lib.nn
        Fn = L.functional

        class M(L.Module):
            def __init__(self):
                super().__init__()
                self.emb, self.qkv, self.out = L.Embedding(7, 8), L.Linear(8, 24), L.Linear(8, 3)
                self.bias = L.Parameter(lib.tensor(np.random.default_rng(51).normal(size=(1, 2, 5, 5)).astype(
                    np.float32)))
                self.mha = L.MultiheadAttention(8, 2, batch_first=True)
                self.enc = L.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)

            def forward(self, ids):
                x, N = self.emb(ids), ids.shape[0]
                if how == "mha_padding":
                    return self.out(self.mha(x, x, x, attn_mask=lib.tensor(alibi[0], dtype=lib.float32),
                                             key_padding_mask=ids == 0)[0][:, 0])
                if how == "float_padding":
                    return self.out(self.mha(x, x, x, key_padding_mask=(ids == 0).float() * -3.0)[0][:, 0])
                if how == "encoder":
                    return self.out(self.enc(x, src_mask=lib.tensor(alibi[1], dtype=lib.float32),
                                             src_key_padding_mask=ids == 0)[:, 0])
                q, k, v = self.qkv(x).view(N, 5, 3, 2, 4).permute(2, 0, 3, 1, 4)
                keep = ids != 0
                mask = {"alibi": lib.tensor(alibi, dtype=lib.float32), "learned": self.bias,
                        "block": lib.tensor(block),
                        "pairs": (keep[:, None, :, None] & keep[:, None, None, :]) | lib.tensor(np.eye(5, dtype=bool))
                        }[how]
                o = Fn.scaled_dot_product_attention(q, k, v, attn_mask=mask)
                return self.out(o.transpose(1, 2).reshape(N, 5, 8)[:, 0])
        return M()

    torch.manual_seed(52)
    tm, model = build(torch), build(ft)
    model.load_state_dict({k: v.detach().numpy() for k, v in tm.state_dict().items()})
    ids, y = np.random.default_rng(53).integers(0, 7, (3, 5)), np.array([0, 1, 2])
    ids[:, 0] = 1
    want = torch.nn.functional.cross_entropy(tm(torch.tensor(ids)), torch.tensor(y))
    want.backward()
    assert F.cross_entropy(model(ft.tensor(ids)), ft.tensor(y)).item() == pytest.approx(want.item(), rel=1e-5)
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), batch_size=3, input_shape=(5,),
                            input_dtype=ft.int64)
    assert program.backward(ids, y) == pytest.approx(want.item(), rel=1e-5)
    for (name, p), tp in zip(model.named_parameters(), tm.parameters()):
        if tp.grad is not None:
            np.testing.assert_allclose(n(p.grad), tp.grad.numpy(), rtol=1e-4, atol=1e-6, err_msg=name)


def test_a_query_that_sees_no_key_gets_zero_under_any_mask():
    """A row of scores all masked out (a bool pattern, -inf in a float mask, a mask with a padding mask) gives weights
    0, as the fused kernel and PyTorch 2 give, eagerly and compiled, with finite gradients (a softmax of -inf alone
    was NaN, and its gradient NaN in every parameter before it); the others rows are unchanged."""
    q, k, v, _ = inputs(1, 2, 4, 5, 3, seed=54)
    block = np.ones((4, 5), bool)
    block[2] = False  # query 2 sees no key
    got = F.scaled_dot_product_attention(t(q), t(k), t(v), attn_mask=ft.tensor(block)).numpy()
    assert not got[:, :, 2].any() and np.isfinite(got).all()
    np.testing.assert_allclose(got[:, :, [0, 1, 3]], ref_biased(q, k, v, np.zeros((4, 5)))[:, :, [0, 1, 3]], rtol=1e-5,
                               atol=1e-6)
    ft.manual_seed(55)
    model = Biased(ft.tensor(block[[0, 1, 2, 3, 3], :]))  # 5 queries, the third seeing no key
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), batch_size=2, input_shape=(5, 4),
                            memory_format="contiguous")
    xs = np.random.default_rng(56).standard_normal((2, 5, 4)).astype(np.float32)
    program.backward(xs, np.array([0, 2]))
    assert all(np.isfinite(p.grad.numpy()).all() for p in model.parameters())
    for mask in ([[True] * 5] * 4, np.ones((4, 5), bool)):
        with pytest.raises(TypeError, match="scaled_dot_product_attention: a mask must be a tensor, got"):
            F.scaled_dot_product_attention(t(q), t(k), t(v), attn_mask=mask)
    with pytest.raises(ValueError, match="explicit attn_mask should not be given with is_causal=True"):
        F.scaled_dot_product_attention(t(q), t(k), t(v), attn_mask=ft.tensor(block), is_causal=True)
    mha = ft.nn.MultiheadAttention(4, 2, batch_first=True)
    x = ft.tensor(xs)
    with pytest.raises(ValueError, match=r"a 3-d attn_mask should be \(N \* num_heads, T, S\) = \(4, 5, 5\), got "
                                         r"\(2, 5, 5\)"):
        mha(x, x, x, attn_mask=ft.zeros(2, 5, 5))


def test_the_bias_gradient_cannot_be_the_bias():
    """dbias written over the bias it is read from gave wrong dq and dbias: refused, as dq over q is."""
    q, k, v, dout = (t(x) for x in inputs(1, 2, 5, 5, 4, seed=65))
    bias = t(np.random.default_rng(66).normal(size=(1, 2, 5, 5)))
    out, lse = ft.ops.sdpa_forward(None, None, q, k, v, bias=bias)
    with pytest.raises(ValueError, match="dbias cannot be bias itself"):
        ft.ops.sdpa_backward(None, None, None, dout, q, k, v, out, lse, bias=bias, dbias=bias)
