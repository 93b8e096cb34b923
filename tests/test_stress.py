"""Bounded stress of concurrent misuse: close() and del from another thread at random moments of fit,
evaluate, iteration and record writing. Every round must end in a result or a clear exception, never a crash
or a hang (each round is bounded by a join timeout)."""
import random
import threading

import numpy as np
import pytest

import fasttrain as ft
from fasttrain import data as D
from fasttrain import nn

ROUNDS = 25


def program():
    ft.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(16, 4))
    return model.compile(ft.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss(), batch_size=4,
                         input_shape=(1, 4, 4))


def loader(n=4000, workers=2):
    rng = np.random.default_rng(0)
    return D.Loader((rng.integers(0, 256, (n, 4, 4), np.uint8), rng.integers(0, 4, n)), batch_size=4,
                    num_workers=workers, shuffle=True)


def run_in_thread(fn):
    """fn() on a thread; its exception (if any), or TimeoutError when it does not end in 20 s."""
    outcome = []

    def body():
        try:
            fn()
            outcome.append(None)
        except Exception as e:  # noqa: BLE001 (every exception is checked by the caller)
            outcome.append(e)

    t = threading.Thread(target=body)
    t.start()
    t.join(20)
    return outcome[0] if outcome else TimeoutError(f"{fn} did not end")


@pytest.mark.parametrize("what", ["fit", "evaluate", "iterate"])
def test_close_at_random_moments(what):
    rng = random.Random(1)
    p = program()
    allowed = ("the loader was closed during the epoch", "closed")
    for _ in range(ROUNDS):
        data = loader()
        if what == "fit":
            work = lambda: ft.fit(p, data, 1, progress=False)  # noqa: E731
        elif what == "evaluate":
            work = lambda: ft.evaluate(p, data)  # noqa: E731
        else:
            work = lambda: [None for _ in data]  # noqa: E731
        closer = threading.Timer(rng.uniform(0, 0.01), data.close)
        closer.start()
        error = run_in_thread(work)
        closer.join()
        assert error is None or (isinstance(error, (RuntimeError, ValueError))
                                 and any(a in str(error) for a in allowed)), repr(error)
        assert data.closed


def test_del_of_a_loader_another_thread_iterates():
    """Dropping the last Python reference while a thread iterates: the iterator keeps the loader alive."""
    for _ in range(ROUNDS):
        data = loader(400)
        it = iter(data)
        del data
        assert run_in_thread(lambda: [None for _ in it]) is None


@pytest.mark.parametrize("end", ["close", "abort"])
def test_record_writer_ends_at_random_moments(tmp_path, end):
    rng = random.Random(2)
    payload = b"\xff\xd8" + bytes(256 << 10)  # large enough that the add runs without the GIL
    for k in range(ROUNDS):
        writer = D.RecordWriter(tmp_path / f"w{k}.rec")

        def add_many():
            for i in range(200):
                writer.add_jpeg(payload, i)

        stopper = threading.Timer(rng.uniform(0, 0.005), getattr(writer, end))
        stopper.start()
        error = run_in_thread(add_many)
        stopper.join()
        assert error is None or (isinstance(error, ValueError) and "closed" in str(error)), repr(error)


@pytest.mark.parametrize("kind", ["record", "tar"])
def test_files_cut_while_the_loader_reads_them(tmp_path, kind):
    """Another process cutting a file short at a random moment of an epoch: the workers' reads fail with an
    OSError naming the file (a mapped file would give SIGBUS there, between any check and the read)."""
    rng = random.Random(3)
    images = np.random.default_rng(0).integers(0, 256, (256, 48, 48, 3), np.uint8)
    path = tmp_path / f"cut.{'rec' if kind == 'record' else 'tar'}"
    for _ in range(ROUNDS):
        if kind == "record":
            D.write_records(path, (images, np.arange(256) % 4), quality=90)
        else:
            import io
            import tarfile
            with tarfile.open(path, "w") as tar:
                for i, image in enumerate(images):
                    for name, payload in ((f"{i:03d}.jpg", D.encode_jpeg(image)), (f"{i:03d}.cls", b"1")):
                        info = tarfile.TarInfo(name)
                        info.size = len(payload)
                        tar.addfile(info, io.BytesIO(payload))
        source = D.RecordFile(path) if kind == "record" else D.TarShards(path)
        data = D.Loader(source, batch_size=4, num_workers=2)
        cutter = threading.Timer(rng.uniform(0, 0.01), lambda: open(path, "r+b").truncate(2048))
        cutter.start()
        error = run_in_thread(lambda: [None for _ in data])
        cutter.join()
        data.close()
        assert error is None or (isinstance(error, OSError) and "was truncated after it was opened" in str(error)
                                 and path.name in str(error)), repr(error)
