"""One rank of the data-parallel tests (tests/test_distributed.py), run under mpirun:

    python _distributed_worker.py MODE OUT [ARGS]

steps: B samples per rank of a fixed 2B-sample batch, STEPS train_steps; rank 0 writes the weights to OUT (after
checking that a broadcast from a rank that does not exist is refused).
sync_bn: the same with a SyncBatchNorm in the model.
buckets: "steps" with the gradient summed in buckets of 16 floats, each batch in two micro-batches; rank 0 also
writes the program's gradient_buckets.
mixed: "buckets" on a model with a frozen layer, a layer called twice (one weight, two writers of its
gradient) and a module the forward never calls.
recompute: "sync_bn" with every output recomputed that can be (the SyncBatchNorm's replay reduces its statistics
over the ranks again, amid the buckets' sums started by then) and the gradient in buckets.
fit: ft.fit over a shuffled Loader sharded by rank, then ft.evaluate; every rank writes its weights and figures.
error: rank 1 passes a label out of range: every rank must stop.
stops: rank 1 leaves by sys.exit(0) after one step, rank 0 steps on: its gradient sum fails after init(timeout=).
mismatch: rank 1 compiles a model of as many parameters in another layout: compile fails on both ranks.
uneven: ft.evaluate of a split of 99 samples, through a Loader and as arrays; rank 0 writes the figures. Before,
fit on a Loader of one rank (as one built before init()) is refused.
dropout: program.backward (which does not communicate) of the same batch on both ranks through a Dropout; each
rank writes its gradient.
refused: rank 1 refuses its batch of the second of 4 steps and every rank catches its exception and goes on: that
step is skipped on both ranks (a SyncBatchNorm communicates in the forward), which then hold the weights of 3 steps.
refused_ids: the same with an embedding model and a token id out of range in rank 1's batch (met in the forward).
resume: STEPS steps, a checkpoint, STEPS more (OUT.full.npz); then a fresh program loads the checkpoint and
runs the last STEPS (OUT.resumed.npz).
nccl: one rank, on CUDA: a program averaging through NCCL against one that does not (they must agree)."""
import sys

import numpy as np

import fasttrain as ft
from fasttrain import nn

B, STEPS, CLASSES = 8, 5, 3


def model(norm=None):
    """An MLP; norm "sync" puts a SyncBatchNorm after its first layer, "plain" a BatchNorm1d."""
    ft.manual_seed(0)
    # No bias before a batch norm: its gradient is zero but for rounding, which AdamW would turn into full steps.
    layers = [nn.Linear(6, 16, bias=norm is None)]
    if norm:
        layers.append(nn.SyncBatchNorm(16) if norm == "sync" else nn.BatchNorm1d(16))
    return nn.Sequential(*layers, nn.GELU(), nn.Linear(16, CLASSES))


class Mixed(nn.Module):
    def __init__(self):
        super().__init__()
        self.frozen, self.shared, self.head = nn.Linear(6, 16), nn.Linear(16, 16), nn.Linear(16, CLASSES)
        self.unused = nn.Linear(3, 3)
        self.frozen.requires_grad_(False)

    def forward(self, x):
        h = nn.functional.gelu(self.frozen(x))
        return self.head(nn.functional.gelu(self.shared(nn.functional.gelu(self.shared(h)))))


def mixed_model():
    ft.manual_seed(0)
    return Mixed()


def fit_model():
    ft.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, CLASSES))


def fit_data():
    rng = np.random.default_rng(2)
    labels = rng.integers(0, CLASSES, 96)
    return (rng.integers(0, 128, (96, 4, 4)) + 40 * labels[:, None, None]).astype(np.uint8), labels


def batch(seed=1):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((2 * B, 6)).astype(np.float32), rng.integers(0, CLASSES, 2 * B)


def compiled(m, distributed, **options):
    opt = ft.optim.AdamW(m.parameters(), lr=0.01)
    return m.compile(opt, nn.CrossEntropyLoss(), batch_size=B if distributed else 2 * B, input_shape=(6,),
                     distributed=distributed, **options)


VOCAB = 11


def token_model():
    ft.manual_seed(0)
    return nn.Sequential(nn.Embedding(VOCAB, 5), nn.Flatten(), nn.Linear(20, CLASSES))


def compiled_tokens(m):
    return m.compile(ft.optim.AdamW(m.parameters(), lr=0.01), nn.CrossEntropyLoss(), batch_size=B, input_shape=(4,),
                     input_dtype=ft.int64, distributed=True)


def dropout_program(distributed):
    ft.manual_seed(0)
    m = nn.Sequential(nn.Linear(6, 64), nn.Dropout(0.5), nn.Linear(64, CLASSES))
    return m.compile(ft.optim.SGD(m.parameters(), lr=0.1), nn.CrossEntropyLoss(), batch_size=2 * B, input_shape=(6,),
                     distributed=distributed)


def uneven_split():
    """99 samples: 2 ranks' shards are 50 and 49, the second padded with a repeat."""
    rng = np.random.default_rng(11)
    return rng.standard_normal((99, 6)).astype(np.float32), rng.integers(0, CLASSES, 99)


def weights(m):
    return {k: np.array(v) for k, v in m.state_dict().items()}


def main(mode, out):
    ft.distributed.init(timeout=3 if mode == "stops" else 1800)
    rank = ft.distributed.get_rank()
    mine = slice(rank * B, (rank + 1) * B)
    x, y = batch()
    if mode == "steps":  # a bad source is refused on every rank before any rank communicates
        try:
            ft.distributed.broadcast(ft.zeros(2), src=2)
            raise AssertionError("broadcast from rank 2 of 2 was not refused")
        except ValueError as e:
            assert "broadcast: src 2 is not a rank of 2" in str(e), e
    if mode in ("steps", "sync_bn", "buckets", "mixed", "recompute"):
        m = mixed_model() if mode == "mixed" else model("sync" if mode in ("sync_bn", "recompute") else None)
        options = {"bucket_cap_mb": 16 * 4 / 2 ** 20, "accumulate_steps": 2} if mode in ("buckets", "mixed") else \
            {"bucket_cap_mb": 16 * 4 / 2 ** 20, "recompute": [m]} if mode == "recompute" else {}
        p = compiled(m, True, **options)
        losses = [p.train_step(x[mine], y[mine]) for _ in range(STEPS)]
        if rank == 0:
            buckets = p.gradient_buckets
            np.savez(out, losses=np.array(losses), buckets=np.array([buckets["buckets"], buckets["started_early"]]),
                     **weights(m))
    elif mode == "fit":
        m = fit_model()
        p = m.compile(ft.optim.SGD(m.parameters(), lr=0.05, momentum=0.9), nn.CrossEntropyLoss(), batch_size=B,
                      input_shape=(1, 4, 4), distributed=True)
        images, labels = fit_data()
        train = ft.data.Loader((images, labels), batch_size=B, shuffle=True, num_workers=1)
        history = ft.fit(p, train, 3, progress=False)
        loss, accuracy = ft.evaluate(p, ft.data.Loader((images, labels), batch_size=B, num_workers=1))
        np.savez(f"{out}.{rank}.npz", train_loss=np.array(history["train_loss"]), figures=np.array([loss, accuracy]),
                 batches=np.array([len(train)]), **weights(m))
    elif mode == "nan_on_one_rank":  # rank 1's loss alone is NaN: every rank skips, every model stays as it was
        m = model("plain")
        p = compiled(m, True, nan_policy="skip")
        before = weights(m)
        xs = x[mine].copy()
        if rank == 1:
            xs[0, 0] = np.nan
        loss = p.train_step(xs, y[mine])
        after = weights(m)
        changed = [k for k in before if not np.array_equal(before[k], after[k])]
        assert np.isnan(loss) and p.skipped_steps == 1 and not changed, (rank, loss, p.skipped_steps, changed)
        print(f"rank {rank}: skipped, model unchanged", flush=True)
    elif mode == "error":
        m = model()
        p = compiled(m, True)
        labels = y[mine].copy()
        if rank == 1:
            labels[0] = CLASSES + 7
        for _ in range(3):
            p.train_step(x[mine], labels)
    elif mode == "stops":
        p = compiled(model(), True)
        p.train_step(x[mine], y[mine])
        if rank == 1:
            sys.exit(0)  # SystemExit: no exception hook runs
        for _ in range(3):
            p.train_step(x[mine], y[mine])
    elif mode == "mismatch":  # 6*16+16 + 16*3+3 = 163 parameters; 6*10+10 + 10*3+3 + 5*(3*3+3) = 163 too
        ft.manual_seed(0)
        m = model() if rank == 0 else nn.Sequential(nn.Linear(6, 10), nn.GELU(), nn.Linear(10, CLASSES),
                                                    *[nn.Linear(CLASSES, CLASSES) for _ in range(5)])
        assert sum(p.numel() for p in m.parameters()) == 163
        try:
            compiled(m, True)
        except ValueError as e:
            print(f"rank {rank}: {e}", flush=True)
    elif mode == "dropout":
        p = dropout_program(True)
        p.backward(x, y)
        np.save(f"{out}.{rank}.npy", np.array(p.flat_grads))
    elif mode == "uneven":
        p = compiled(model(), True)
        X, Y = uneven_split()
        try:
            ft.fit(p, ft.data.Loader((X, Y), B, num_workers=1, rank=0, world_size=1), progress=False)
        except ValueError as e:
            print(f"rank {rank}: {e}", flush=True)
        figures = [ft.evaluate(p, ft.data.Loader((X, Y), B, num_workers=1)), ft.evaluate(p, (X, Y))]
        if rank == 0:
            np.save(out, np.array(figures))
    elif mode in ("refused", "refused_ids"):
        ids = mode == "refused_ids"
        make = token_model if ids else lambda: model("sync")
        xs = np.random.default_rng(3).integers(0, VOCAB, (2 * B, 4))[mine] if ids else x[mine]
        m = make()
        p = compiled_tokens(m) if ids else compiled(m, True)
        for step in range(4):
            xb, labels = xs.copy(), y[mine].copy()
            if rank == 1 and step == 1:
                if ids:
                    xb[0, 2] = VOCAB + 3
                else:
                    labels[0] = CLASSES + 7
            try:
                p.train_step(xb, labels)
            except (ValueError, IndexError, RuntimeError) as e:
                print(f"rank {rank} step {step}: {type(e).__name__}: {e}", flush=True)
        three = make()
        p3 = compiled_tokens(three) if ids else compiled(three, True)
        for _ in range(3):
            p3.train_step(xs, y[mine])
        got, want = weights(m), weights(three)
        assert all(np.array_equal(got[k], want[k]) for k in want), f"rank {rank}: not the weights of 3 steps"
        print(f"rank {rank}: the weights of 3 steps", flush=True)
    elif mode == "resume":
        m = model()
        p = compiled(m, True)
        for _ in range(STEPS):
            p.train_step(x[mine], y[mine])
        ft.save(f"{out}.ckpt", p)
        for _ in range(STEPS):
            p.train_step(x[mine], y[mine])
        if rank == 0:
            np.savez(f"{out}.full.npz", **weights(m))
        m2 = model()
        p2 = compiled(m2, True)
        ft.load(f"{out}.ckpt", p2)
        for _ in range(STEPS):
            p2.train_step(x[mine], y[mine])
        np.savez(f"{out}.resumed.{rank}.npz", **weights(m2))
    elif mode == "nccl":
        results = []
        for distributed in (True, False):
            m = model().to("cuda")
            opt = ft.optim.AdamW(m.parameters(), lr=0.01)
            p = m.compile(opt, nn.CrossEntropyLoss(), batch_size=2 * B, input_shape=(6,), distributed=distributed)
            losses = [p.train_step(x, y) for _ in range(STEPS)]
            results.append((losses, m.state_dict()))
        (l1, w1), (l0, w0) = results
        assert l1 == l0, (l1, l0)
        assert all(np.array_equal(w1[k], w0[k]) for k in w0), "NCCL over one rank changed the weights"
        print("nccl: world of one equals no NCCL", flush=True)
    else:
        raise ValueError(f"unknown mode {mode}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
