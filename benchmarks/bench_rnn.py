"""Sequences/s of whole training steps (forward, cross-entropy, backward, SGD update) of a text classifier written as a
PyTorch user writes it (Embedding, an LSTM or GRU with batch_first=True, the last layer's final state into a Linear
head), compiled by fasttrain (an LSTM or GRU layer's recurrence is one node, ops/rnn.h), against the same model,
weights and recipe in PyTorch (its fused CPU LSTM/GRU kernels) on the same thread count, when torch imports. Each
model runs in float32 against torch's eager float32, and, on a CPU with AVX512-BF16, in fasttrain's
precision="bf16-mixed" against torch under torch.autocast("cpu", dtype=torch.bfloat16) (the _bf16 lines).

JSON lines: {"name", "value", "unit", "precision"} plus, with torch, "reference" (torch's sequences/s),
"reference_name" and "ratio" (ours / torch). Medians of timed steps after warm-up; fasttrain and torch steps
alternate so that load on a shared machine hits both alike.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE PYTHONPATH=python python benchmarks/bench_rnn.py [--quick]
"""
import argparse
import itertools
import json
import statistics
import time

import numpy as np

import fasttrain as ft

try:
    import torch
except ImportError:
    torch = None

VOCAB, EMBED, CLASSES = 1000, 64, 4


def classifier(lib, kind, hidden, layers):
    nn = lib.nn

    class Classifier(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(VOCAB, EMBED)
            self.rnn = getattr(nn, kind)(EMBED, hidden, layers, batch_first=True)
            self.head = nn.Linear(hidden, CLASSES)

        def forward(self, ids):
            _, state = self.rnn(self.emb(ids))
            h = state[0] if isinstance(state, tuple) else state
            return self.head(h[-1])
    return Classifier()


def timed(fn):
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer timed steps")
    args = parser.parse_args()
    steps = 5 if args.quick else 15
    rng = np.random.default_rng(0)
    precisions = ["32-true"] + (["bf16-mixed"] if ft.backends.cpu_has_bf16() else [])
    for (kind, hidden, layers, seq, batch), precision in itertools.product(
            [("LSTM", 128, 1, 32, 64), ("GRU", 128, 2, 32, 64)], precisions):
        ids, labels = rng.integers(0, VOCAB, (batch, seq)), rng.integers(0, CLASSES, batch)
        ft.manual_seed(0)
        model = classifier(ft, kind, hidden, layers)
        program = model.compile(ft.optim.SGD(model.parameters(), lr=0.01), ft.nn.CrossEntropyLoss(),
                                batch_size=batch, input_shape=(seq,), input_dtype=ft.int64, precision=precision)
        runs = {"ours": lambda: program.train_step(ids, labels)}
        low = precision == "bf16-mixed"
        if torch is not None:
            torch.set_num_threads(ft.get_num_threads())
            theirs = classifier(torch, kind, hidden, layers)
            theirs.load_state_dict({k: torch.from_numpy(np.asarray(v)) for k, v in model.state_dict().items()})
            opt = torch.optim.SGD(theirs.parameters(), lr=0.01)
            t_ids, t_labels = torch.from_numpy(ids), torch.from_numpy(labels)

            def torch_step():
                opt.zero_grad()
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=low):
                    loss = torch.nn.functional.cross_entropy(theirs(t_ids), t_labels)
                loss.backward()
                opt.step()
            runs["theirs"] = torch_step
        for fn in runs.values():  # warm-up
            fn(), fn()
        times = {k: [] for k in runs}
        for _ in range(steps):
            for k, fn in runs.items():
                times[k].append(timed(fn))
        name = f"train_step_{kind.lower()}{layers}x{hidden}_T{seq}_b{batch}{'_bf16' if low else ''}"
        line = {"name": name, "value": round(batch / statistics.median(times["ours"]), 1), "unit": "sequences/s",
                "precision": precision, "threads": ft.get_num_threads()}
        if "theirs" in times:
            ref = batch / statistics.median(times["theirs"])
            mode = "bf16 autocast" if low else "eager float32"
            line.update(reference=round(ref, 1), reference_name=f"torch {torch.__version__} {mode}",
                        ratio=round(line["value"] / ref, 3))
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
