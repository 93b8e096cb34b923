"""Two programs that read each other's modules and train their own: a GAN's discriminator step (the generator's
output detached) and generator step (the discriminator frozen), alternating as a PyTorch GAN loop does."""
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

import fasttrain as ft
from fasttrain import nn
import fasttrain.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "examples"))
from gan import DStep, GStep, d_loss, g_loss  # noqa: E402  the steps of examples/gan.py

B, Z, X = 8, 6, 10


def nets(batch_norm, seed=0):
    """DCGAN's shape in miniature; as there, no bias before a batch norm (its gradient is rounding noise, which
    Adam would scale up to steps of lr)."""
    ft.manual_seed(seed)
    norm = [nn.BatchNorm1d(16)] if batch_norm else []
    G = nn.Sequential(nn.Linear(Z, 16, bias=not batch_norm), *norm, nn.ReLU(), nn.Linear(16, X), nn.Tanh())
    norm = [nn.BatchNorm1d(16)] if batch_norm else []
    D = nn.Sequential(nn.Linear(X, 16, bias=not batch_norm), *norm, nn.LeakyReLU(0.2), nn.Linear(16, 1))
    return G, D


def programs(G, D, g_first, precision="32-true", lr=2e-3):
    def d_program():
        return DStep(G, D).compile(ft.optim.Adam(D.parameters(), lr=lr, betas=(0.5, 0.999)), d_loss, batch_size=B,
                                   input_shape=((X,), (Z,)), precision=precision)

    def g_program():
        return GStep(G, D).compile(ft.optim.Adam(G.parameters(), lr=lr, betas=(0.5, 0.999)), g_loss, batch_size=B,
                                   input_shape=(Z,), precision=precision)
    if g_first:
        pg = g_program()
        return d_program(), pg
    pd = d_program()
    return pd, g_program()


def batches(steps, seed=1):
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        real = np.tanh(rng.normal(0.5, 0.3, (B, X))).astype(np.float32)
        yield real, rng.normal(size=(B, Z)).astype(np.float32), rng.normal(size=(B, Z)).astype(np.float32)


def values(module):
    return {k: np.array(v) for k, v in module.state_dict().items()}


def numpy_losses(G, D, real, z):
    """The two losses from the modules' current weights (no batch norm), in float64."""
    def linear(m, x):
        return x @ m.weight.numpy().astype(np.float64).T + m.bias.numpy()

    def g(z):
        return np.tanh(linear(G[2], np.maximum(linear(G[0], z), 0)))

    def d(x):
        h = linear(D[0], x)
        return linear(D[2], np.where(h > 0, h, 0.2 * h))[:, 0]

    def softplus(v):
        return np.logaddexp(0, v)
    fake = d(g(z.astype(np.float64)))
    return np.mean(softplus(-d(real.astype(np.float64))) + softplus(fake)), np.mean(softplus(-fake))


@pytest.mark.parametrize("g_first", [False, True])
def test_each_step_reads_the_other_programs_latest_weights_and_trains_only_its_own(g_first):
    G, D = nets(batch_norm=False)
    pd, pg = programs(G, D, g_first)
    for real, z1, z2 in batches(4):
        want_d, _ = numpy_losses(G, D, real, z1)
        g_before = values(G)
        np.testing.assert_allclose(pd.train_step((real, z1), None), want_d, rtol=1e-5)
        assert all(np.array_equal(v, values(G)[k]) for k, v in g_before.items())
        _, want_g = numpy_losses(G, D, real, z2)
        d_before = values(D)
        np.testing.assert_allclose(pg.train_step(z2, None), want_g, rtol=1e-5)
        assert all(np.array_equal(v, values(D)[k]) for k, v in d_before.items())
        assert not all(np.array_equal(v, values(G)[k]) for k, v in g_before.items())
    lent = G if g_first else D  # the module whose program compiled first is read by the second
    assert f"frozen here): {sum(p.numel() for p in lent.parameters()):,} parameters" in \
        str((pg if not g_first else pd).summary())
    # each optimizer's parameters sit in its own program's flat buffer; the other program reads them there
    for program, module in ((pd, D), (pg, G)):
        base, end = program.flat_params.data_ptr(), program.flat_params.data_ptr() + program.flat_params.nbytes
        assert all(base <= p.data_ptr() < end for p in module.parameters())


def test_a_parameter_two_optimizers_hold_is_refused_by_the_program_it_left():
    """A parameter trains in one program: a second compile whose optimizer holds it too takes it into its buffer,
    and the first program refuses its next call rather than train old values."""
    d, g = nn.Sequential(nn.Linear(4, 1)), nn.Sequential(nn.Linear(2, 4))
    first = d.compile(ft.optim.SGD(d.parameters(), lr=0.1), nn.BCEWithLogitsLoss(), batch_size=3, input_shape=(4,),
                      target_shape=(1,))
    x, y = np.ones((3, 4), np.float32), np.ones((3, 1), np.float32)
    first.train_step(x, y)
    both = nn.Sequential(g, d)
    second = both.compile(ft.optim.SGD(both.parameters(), lr=0.1), nn.BCEWithLogitsLoss(), batch_size=3,
                          input_shape=(2,), target_shape=(1,))
    for call in (first.train_step, first.backward, first.evaluate, lambda x, y: first.predict(x)):
        with pytest.raises(ValueError, match=r"0\.weight moved after compile .* A parameter trains in one program"):
            call(x, y)
    second.train_step(np.ones((3, 2), np.float32), y)  # the program compiled last trains
    again = d.compile(ft.optim.SGD(d.parameters(), lr=0.1), nn.BCEWithLogitsLoss(), batch_size=3, input_shape=(4,),
                      target_shape=(1,))
    np.testing.assert_allclose(again.predict(x).numpy(), d(ft.tensor(x)).numpy(), rtol=1e-6)


def test_a_model_compiled_again_shares_its_weights_with_the_first_program():
    """The same model compiled twice (float32, then bf16-mixed) keeps one flat buffer: a step of either moves the
    weights the other reads next."""
    m = nn.Sequential(nn.Linear(4, 3))
    first = m.compile(ft.optim.SGD(m.parameters(), lr=0.1), nn.CrossEntropyLoss(), batch_size=8, input_shape=(4,))
    x, y = np.random.default_rng(9).standard_normal((8, 4)).astype(np.float32), np.arange(8) % 3
    first.train_step(x, y)
    second = m.compile(ft.optim.SGD(m.parameters(), lr=0.1), nn.CrossEntropyLoss(), batch_size=8, input_shape=(4,),
                       precision="bf16-mixed")
    for stepping, reading in ((first, second), (second, first)):
        before = reading.predict(x).numpy()
        stepping.train_step(x, y)
        np.testing.assert_allclose(reading.predict(x).numpy(), m(ft.tensor(x)).numpy(), rtol=2e-2, atol=2e-2)
        assert not np.array_equal(reading.predict(x).numpy(), before)


def test_a_module_read_before_its_optimizer_compiled_follows_it():
    """Compiled first, the generator's step differentiates the discriminator (its optimizer does not hold it, no
    other program trains it yet); the discriminator's compile then takes its parameters, and the generator's
    step reads them there from its next call, its own gradient of them no longer being their .grad."""
    G, D = nets(batch_norm=False)
    pg = GStep(G, D).compile(ft.optim.SGD(G.parameters(), lr=0.1), g_loss, batch_size=B, input_shape=(Z,))
    pd = DStep(G, D).compile(ft.optim.SGD(D.parameters(), lr=0.1), d_loss, batch_size=B, input_shape=((X,), (Z,)))
    (real, z1, z2), = batches(1)
    pd.train_step((real, z1), None)
    d_grad = D[0].weight.grad
    pg.backward(z2, None)
    assert D[0].weight.grad is d_grad
    np.testing.assert_allclose(pg.evaluate(z2, None)[0], numpy_losses(G, D, real, z2)[1], rtol=1e-5)


def torch_losses(G, D, steps, lr=2e-3):
    """The same alternating steps in PyTorch: the discriminator on real and detached generated samples, then the
    generator through the discriminator (its gradients computed, not applied, as in every PyTorch GAN loop)."""
    torch = pytest.importorskip("torch")
    tG, tD = torch_net(torch, G), torch_net(torch, D)
    opt_d = torch.optim.Adam(tD.parameters(), lr=lr, betas=(0.5, 0.999))
    opt_g = torch.optim.Adam(tG.parameters(), lr=lr, betas=(0.5, 0.999))
    sp = torch.nn.functional.softplus
    out = []
    for real, z1, z2 in batches(steps):
        real, z1, z2 = map(torch.from_numpy, (real, z1, z2))
        opt_d.zero_grad()
        ld = (sp(-tD(real)[:, 0]) + sp(tD(tG(z1).detach())[:, 0])).mean()
        ld.backward()
        opt_d.step()
        opt_g.zero_grad()
        lg = sp(-tD(tG(z2))[:, 0]).mean()
        lg.backward()
        opt_g.step()
        out.append((ld.item(), lg.item()))
    return out, tG, tD


def torch_net(torch, net):
    layers = {nn.Linear: lambda m: torch.nn.Linear(m.in_features, m.out_features, bias=m.bias is not None),
              nn.BatchNorm1d: lambda m: torch.nn.BatchNorm1d(m.num_features), nn.ReLU: lambda m: torch.nn.ReLU(),
              nn.Tanh: lambda m: torch.nn.Tanh(), nn.LeakyReLU: lambda m: torch.nn.LeakyReLU(0.2)}
    t = torch.nn.Sequential(*(layers[type(m)](m) for m in net))
    t.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in net.state_dict().items()})
    return t


@pytest.mark.parametrize("g_first", [False, True])
def test_alternating_steps_match_pytorch_with_batch_norms(g_first):
    G, D = nets(batch_norm=True)
    want, tG, tD = torch_losses(G, D, 6)
    pd, pg = programs(G, D, g_first)
    for (real, z1, z2), (ld, lg) in zip(batches(6), want):
        np.testing.assert_allclose(pd.train_step((real, z1), None), ld, rtol=2e-5)
        np.testing.assert_allclose(pg.train_step(z2, None), lg, rtol=2e-5)
    for net, ref in ((G, tG), (D, tD)):
        for k, v in ref.state_dict().items():
            np.testing.assert_allclose(net.state_dict()[k], v.numpy(), rtol=1e-4, atol=1e-5, err_msg=k)


@pytest.mark.parametrize("g_first", [False, True])
def test_bf16_mixed_programs_alternate_as_float32_does(g_first):
    """In bf16-mixed each node reads a bfloat16 copy of the other program's weights, converted before every run
    (their owner changes them between the calls), so the losses follow float32's within bfloat16's rounding."""
    runs = []
    for precision in ("32-true", "bf16-mixed"):
        G, D = nets(batch_norm=True)
        pd, pg = programs(G, D, g_first, precision)
        runs.append([(pd.train_step((real, z1), None), pg.train_step(z2, None))
                     for real, z1, z2 in batches(6)])
    np.testing.assert_allclose(runs[1], runs[0], rtol=3e-2)
    assert runs[0][-1] != runs[0][0]


def test_both_programs_saved_and_loaded_resume_bit_for_bit(tmp_path):
    """ft.save of each program (each model holds both modules) and ft.load into freshly built ones: the
    alternating steps go on as if uninterrupted."""
    def run(stop):
        G, D = nets(batch_norm=True)
        pd, pg = programs(G, D, g_first=False)
        losses = []
        for k, (real, z1, z2) in enumerate(batches(6)):
            if k == stop:
                ft.save(tmp_path / "d.safetensors", pd)
                ft.save(tmp_path / "g.safetensors", pg)
                G, D = nets(batch_norm=True, seed=9)
                pd, pg = programs(G, D, g_first=True)
                ft.load(tmp_path / "d.safetensors", pd)
                ft.load(tmp_path / "g.safetensors", pg)
            losses.append((pd.train_step((real, z1), None), pg.train_step(z2, None)))
        return losses
    assert run(stop=3) == run(stop=None)


def test_the_example_trains_on_fashion_mnist(tmp_path):
    """examples/gan.py for 40 iterations of the real data: the discriminator tells real from generated better
    than chance (its loss below 2 ln 2), the generator's samples are saved, and the last line reports."""
    try:
        ft.data.FashionMNIST(train=True)
    except FileNotFoundError as e:
        pytest.skip(f"Fashion-MNIST is not installed (Debian package dataset-fashion-mnist): {e}")
    out = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "gan.py"), "--epochs", "1", "--steps", "40",
                          "--threads", "2", "--out", str(tmp_path)], capture_output=True, text=True, check=True,
                         env=dict(os.environ, PYTHONPATH=os.path.dirname(ft.__path__[0])), timeout=300).stdout
    report = json.loads(out.strip().splitlines()[-1])
    assert report["name"] == "gan" and report["precision"] == "32-true"
    assert report["d_loss"] < 2 * math.log(2)
    assert (tmp_path / "gan_samples.png").exists() or "matplotlib is not installed" in out


def conditional(lib):
    """A conditional GAN's generator and discriminator, each embedding the class label (an input of one value
    per sample) next to its other input; the same code for lib = fasttrain or torch."""
    n = lib.nn

    class Generator(n.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.fc, self.out = n.Embedding(3, 4), n.Linear(Z + 4, 16), n.Linear(16, X)

        def forward(self, z, c):
            return lib.tanh(self.out(lib.relu(self.fc(lib.cat([z, self.emb(c)], 1)))))

    class Discriminator(n.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.fc, self.out = n.Embedding(3, 4), n.Linear(X + 4, 16), n.Linear(16, 1)

        def forward(self, x, c):
            return self.out(n.functional.leaky_relu(self.fc(lib.cat([x, self.emb(c)], 1)), 0.2))
    return Generator(), Discriminator()


def test_a_conditional_gan_with_a_hinge_loss_and_two_discriminator_steps_matches_pytorch():
    """Labels as inputs of per-sample shape (), a hinge loss for the discriminator, two of its Adam steps per SGD
    step of the generator: every loss against PyTorch's loop."""
    torch = pytest.importorskip("torch")

    class CondD(nn.Module):
        def __init__(self, G, D):
            super().__init__()
            self.G, self.D = G, D

        def forward(self, real, z, c):
            return ft.cat([self.D(real, c), self.D(self.G(z, c).detach(), c)], dim=1)

    class CondG(CondD):
        def forward(self, z, c):
            return self.D(self.G(z, c), c)
    ft.manual_seed(0)
    G, D = conditional(ft)
    tG, tD = conditional(torch)
    for t, m in ((tG, G), (tD, D)):
        t.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in m.state_dict().items()})
    pd = CondD(G, D).compile(ft.optim.Adam(D.parameters(), lr=1e-3),
                             lambda o: (F.relu(1 - o[:, 0]) + F.relu(1 + o[:, 1])).mean(), batch_size=B,
                             input_shape=((X,), (Z,), ()), input_dtype=(ft.float32, ft.float32, ft.int64))
    pg = CondG(G, D).compile(ft.optim.SGD(G.parameters(), lr=0.05), g_loss, batch_size=B, input_shape=((Z,), ()),
                             input_dtype=(ft.float32, ft.int64))
    opt_d, opt_g = torch.optim.Adam(tD.parameters(), lr=1e-3), torch.optim.SGD(tG.parameters(), lr=0.05)
    relu, sp = torch.relu, torch.nn.functional.softplus
    labels = np.random.default_rng(2)
    for real, z1, z2 in batches(4):
        c = labels.integers(0, 3, B)
        tr, t1, t2, tc = map(torch.from_numpy, (real, z1, z2, c))
        for _ in range(2):
            opt_d.zero_grad()
            want = (relu(1 - tD(tr, tc)[:, 0]) + relu(1 + tD(tG(t1, tc).detach(), tc)[:, 0])).mean()
            want.backward()
            opt_d.step()
            np.testing.assert_allclose(pd.train_step((real, z1, c), None), want.item(), rtol=2e-5)
        opt_g.zero_grad()
        want = sp(-tD(tG(t2, tc), tc)[:, 0]).mean()
        want.backward()
        opt_g.step()
        np.testing.assert_allclose(pg.train_step((z2, c), None), want.item(), rtol=2e-5)


def test_a_module_behind_a_detach_gets_no_update_not_even_weight_decay():
    """One AdamW over both modules in the discriminator's step: the generator, read only through .detach(), gets
    no gradient, and as in PyTorch (its .grad None) the optimizer leaves it alone, weight decay included."""
    G, D = nets(batch_norm=False)
    pd = DStep(G, D).compile(ft.optim.AdamW([*G.parameters(), *D.parameters()], lr=0.1, weight_decay=0.1), d_loss,
                             batch_size=B, input_shape=((X,), (Z,)))
    g_before, d_before = values(G), values(D)
    for real, z1, _ in batches(3):
        pd.train_step((real, z1), None)
    assert all(np.array_equal(v, values(G)[k]) for k, v in g_before.items())
    assert not any(np.array_equal(v, values(D)[k]) for k, v in d_before.items())


@pytest.mark.parametrize("g_first", [False, True])
def test_freezing_the_other_module_around_each_step_is_allowed_in_either_order(g_first):
    """CycleGAN's idiom, D.requires_grad_(False) for the generator's step and back for the discriminator's (and
    the generator frozen in the discriminator's step): neither program trains the module it only reads, so the
    toggles change nothing and are not refused."""
    runs = []
    for toggle in (False, True):
        G, D = nets(batch_norm=False)
        pd, pg = programs(G, D, g_first)
        losses = []
        for real, z1, z2 in batches(3):
            if toggle:
                G.requires_grad_(False), D.requires_grad_(True)
            losses.append(pd.train_step((real, z1), None))
            if toggle:
                G.requires_grad_(True), D.requires_grad_(False)
            losses.append(pg.train_step(z2, None))
        runs.append(losses)
    assert runs[0] == runs[1]
