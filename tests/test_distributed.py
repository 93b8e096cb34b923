"""Data-parallel training over MPI ranks (ft.distributed): two processes launched by mpirun on this machine
(shared memory), each a rank of tests/_distributed_worker.py, against one process training on both ranks'
samples at once."""
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

import fasttrain as ft

import _distributed_worker as worker

pytestmark = pytest.mark.skipif(not (shutil.which("mpirun") and ft.distributed.is_available()),
                                reason="needs MPI (openmpi-bin, libopenmpi-dev) and a build with its backend")

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_distributed_worker.py")


def mpirun(mode, out, ranks=2, timeout=120):
    """Runs the worker on `ranks` processes; the completed process (output in .stdout)."""
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_btl_vader_single_copy_mechanism="none",  # containers forbid cross-process memory access
               OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([os.path.dirname(os.path.dirname(ft.__file__)),
                                           os.environ.get("PYTHONPATH", "")]))
    cmd = ["mpirun", "-np", str(ranks), "--oversubscribe", sys.executable, WORKER, mode, str(out)]
    return subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)


def run_ok(mode, out, **kw):
    done = mpirun(mode, out, **kw)
    assert done.returncode == 0, done.stdout[-3000:]
    return done


@pytest.mark.parametrize("mode", ["steps", "sync_bn", "buckets", "mixed", "recompute"])
def test_two_ranks_of_b_samples_train_as_one_process_of_2b(tmp_path, mode):
    """Averaged gradients (and, with SyncBatchNorm, statistics of both ranks' samples) make 2 ranks x B samples
    the same training as one process of 2B samples (with a plain batch norm), whether the gradient is summed in
    one piece or in buckets started during the backward (of the last micro-batch only; with frozen, unused and
    tied parameters too)."""
    run_ok(mode, tmp_path / "dp.npz")
    got = np.load(tmp_path / "dp.npz")
    if mode in ("buckets", "mixed"):  # 163 (447) floats in buckets of 16, every one started within the backward
        assert got["buckets"].tolist() == ([11, 11] if mode == "buckets" else [28, 28])
    m = worker.mixed_model() if mode == "mixed" else worker.model("plain" if mode in ("sync_bn", "recompute") else None)
    p = worker.compiled(m, distributed=False)
    x, y = worker.batch()
    losses = [p.train_step(x, y) for _ in range(worker.STEPS)]
    np.testing.assert_allclose(got["losses"], losses, rtol=1e-5)
    for name, w in worker.weights(m).items():
        np.testing.assert_allclose(got[name], w, rtol=1e-5, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("mode", ["sync_bn", "buckets"])
def test_two_ranks_are_bitwise_repeatable(tmp_path, mode):
    run_ok(mode, tmp_path / "a.npz")
    run_ok(mode, tmp_path / "b.npz")
    a, b = np.load(tmp_path / "a.npz"), np.load(tmp_path / "b.npz")
    for name in a.files:
        assert np.array_equal(a[name], b[name]), name


def test_fit_and_evaluate_on_two_ranks(tmp_path):
    """Each rank trains on its half of every epoch (the Loader shards by rank once init() ran); the ranks keep
    identical weights, evaluate reports the whole split's figures on every rank, and the run equals one process
    fitting batches of both ranks' size."""
    run_ok("fit", tmp_path / "fit")
    r0, r1 = np.load(tmp_path / "fit.0.npz"), np.load(tmp_path / "fit.1.npz")
    assert r0["batches"][0] == 96 // worker.B // 2  # half of the batches each
    for name in r0.files:
        assert np.array_equal(r0[name], r1[name]), name
    assert r0["train_loss"][-1] < r0["train_loss"][0]
    m = worker.fit_model()
    m.load_state_dict({k: ft.tensor(r0[k]) for k in worker.weights(m)})
    p = m.compile(ft.optim.SGD(m.parameters(), lr=0.05), ft.nn.CrossEntropyLoss(), batch_size=worker.B,
                  input_shape=(1, 4, 4))
    images, labels = worker.fit_data()
    whole = ft.evaluate(p, ft.data.Loader((images, labels), batch_size=worker.B, num_workers=1))
    np.testing.assert_allclose(r0["figures"], whole, rtol=1e-6)
    # The epoch's order does not depend on the world size: rank r takes every other sample of it, so the two
    # ranks' batches together are the batches of 2B samples of one process with the same seed.
    m = worker.fit_model()
    p = m.compile(ft.optim.SGD(m.parameters(), lr=0.05, momentum=0.9), ft.nn.CrossEntropyLoss(),
                  batch_size=2 * worker.B, input_shape=(1, 4, 4))
    ft.fit(p, ft.data.Loader((images, labels), batch_size=2 * worker.B, shuffle=True, num_workers=1), 3,
           progress=False)
    for name, w in worker.weights(m).items():
        np.testing.assert_allclose(r0[name], w, rtol=1e-5, atol=1e-6, err_msg=name)


def test_a_non_finite_loss_on_one_rank_skips_the_step_on_every_rank(tmp_path):
    """nan_policy='skip' with a NaN in one rank's batch: the averaged loss is NaN, so every rank skips the step,
    and every rank's weights and batch-norm statistics stay as they were (the finite rank's forward moved its
    statistics: they are put back)."""
    done = run_ok("nan_on_one_rank", tmp_path / "x", timeout=60)
    assert "rank 0: skipped, model unchanged" in done.stdout and "rank 1: skipped, model unchanged" in done.stdout


def test_a_rank_that_fails_stops_every_rank(tmp_path):
    done = mpirun("error", tmp_path / "x", timeout=60)
    assert done.returncode != 0
    assert "label" in done.stdout and "outside" in done.stdout, done.stdout[-3000:]


def test_a_rank_that_leaves_does_not_keep_the_others_waiting(tmp_path):
    """sys.exit on one rank (SystemExit, which no exception hook sees): the other rank's next gradient sum ends
    the job after init(timeout=), saying why, instead of waiting forever."""
    started = time.monotonic()
    done = mpirun("stops", tmp_path / "x", timeout=90)
    assert done.returncode != 0 and time.monotonic() - started < 80
    assert "rank 0: not every rank took part in a collective within 3 s" in done.stdout, done.stdout[-3000:]


def test_each_rank_draws_its_own_dropout_masks(tmp_path):
    """The same batch on both ranks: their dropout masks differ (every rank drew the same ones for its rows, so
    the ranks' samples shared masks), rank 0's being one process's, and a checkpoint keeps the one seed."""
    run_ok("dropout", tmp_path / "g", timeout=60)
    grads = [np.load(tmp_path / f"g.{rank}.npy") for rank in (0, 1)]
    assert not np.array_equal(grads[0], grads[1])
    alone = worker.dropout_program(False)
    alone.backward(*worker.batch())
    np.testing.assert_array_equal(grads[0], np.array(alone.flat_grads))


def test_evaluate_on_an_uneven_split_counts_each_sample_once(tmp_path):
    """99 samples over 2 ranks: the sharded loader repeats one sample to give both ranks 50, which evaluation
    counted twice. The figures, through a Loader or arrays, are one process's over the 99."""
    done = run_ok("uneven", tmp_path / "x.npy", timeout=60)
    assert "rank 1: fit: the Loader shards its samples over 1 rank(s), the program trains on 2" in done.stdout
    p = worker.compiled(worker.model(), False)
    X, Y = worker.uneven_split()
    want = ft.evaluate(p, (X, Y))
    for loss, accuracy in np.load(tmp_path / "x.npy"):
        assert loss == pytest.approx(want[0], rel=1e-6) and accuracy == pytest.approx(want[1], abs=1e-12)


def test_ranks_compiling_different_programs_are_refused_on_every_rank(tmp_path):
    """Two models of 163 parameters each in other layouts: rank 0's weights would be broadcast into rank 1's
    layout and both would train on, diverging. compile refuses on both ranks, naming rank 1."""
    done = run_ok("mismatch", tmp_path / "x", timeout=60)
    for rank in (0, 1):
        assert f"rank {rank}: compile(..., distributed=True): rank(s) [1] compiled another program" in done.stdout, \
            done.stdout[-3000:]


@pytest.mark.parametrize("mode", ["refused", "refused_ids"])
def test_a_batch_refused_on_one_rank_is_a_step_no_rank_takes(tmp_path, mode):
    done = run_ok(mode, tmp_path / "x", timeout=60)
    out = done.stdout
    assert "rank 1 step 1: IndexError" in out or "rank 1 step 1: ValueError" in out, out[-3000:]
    assert "rank 0 step 1: RuntimeError: train_step: 1 other rank(s) refused their batch" in out, out[-3000:]
    assert "step 0" not in out and "step 2" not in out and "step 3" not in out, out[-3000:]
    assert "rank 0: the weights of 3 steps" in out and "rank 1: the weights of 3 steps" in out, out[-3000:]


def test_checkpoint_written_by_rank_0_resumes_every_rank(tmp_path):
    run_ok("resume", tmp_path / "r")
    full = np.load(tmp_path / "r.full.npz")
    for rank in (0, 1):
        resumed = np.load(tmp_path / f"r.resumed.{rank}.npz")
        for name in full.files:
            assert np.array_equal(full[name], resumed[name]), (rank, name)


def test_without_init_everything_is_one_process():
    assert ft.distributed.get_rank() == 0 and ft.distributed.get_world_size() == 1
    assert not ft.distributed.is_initialized()
    with pytest.raises(RuntimeError, match=r"ft\.distributed\.init\(\) first"):
        ft.distributed.barrier()
    m = worker.model()
    with pytest.raises(RuntimeError, match=r"ft\.distributed\.init\(\) first"):
        worker.compiled(m, distributed=True)
    with pytest.raises(ValueError, match="op must be 'sum' or 'mean'"):
        ft.distributed.all_reduce(ft.zeros(3), op="max")
    for bad in (0, -1, float("nan"), True, "25"):
        with pytest.raises(ValueError, match="bucket_cap_mb must be a positive number"):
            worker.compiled(m, distributed=True, bucket_cap_mb=bad)
    assert worker.compiled(m, distributed=False).gradient_buckets is None
    for bad in (0, -3.0, float("nan"), True, "30"):  # refused before MPI starts
        with pytest.raises(ValueError, match="init: timeout must be a positive number of seconds or a timedelta"):
            ft.distributed.init(timeout=bad)
    assert not ft.distributed.is_initialized()


def test_convert_sync_batchnorm_keeps_parameters_and_buffers():
    m = worker.model("plain")
    m[1].running_mean.fill_(0.5)
    weight = m[1].weight
    converted = ft.nn.SyncBatchNorm.convert_sync_batchnorm(m)
    assert isinstance(converted[1], ft.nn.SyncBatchNorm) and converted[1].weight is weight
    assert dict(converted.named_buffers())["1.running_mean"].tolist() == [0.5] * 16
    assert [n for n, _ in converted.named_parameters()] == [n for n, _ in worker.model("plain").named_parameters()]
    with pytest.raises(NotImplementedError, match="process groups are not supported"):
        ft.nn.SyncBatchNorm(4, process_group=object())
