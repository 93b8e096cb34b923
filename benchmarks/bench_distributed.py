"""Data-parallel training over MPI ranks on this machine, against one process on the same cores.

Prints one JSON object per line, {"name", "value", "unit"} and, for comparisons, "reference" and "ratio":

  memcpy_GBps             GB/s of a NumPy copy of the demo network's flat gradient (read + write counted):
                          the bound a shared-memory all-reduce between processes of one machine works against.
  allreduce_GBps          the all-reduce of that gradient over 2 ranks (ft.distributed.all_reduce, MPI over
                          shared memory), as bus bandwidth: 2 (n - 1) / n x bytes / time; ratio = / memcpy.
  step_1x2                images/s of the demo network (examples/demo.py) on 1 process x 2 threads, batch 2B.
  dp_scaling_2x1_vs_1x2   images/s of 2 ranks x 1 thread, batch B each (compile(distributed=True)), over
                          step_1x2: "ratio" >= 0.9 is the goal at equal total cores.
  allreduce_share         the fraction of a 2-rank step the gradient all-reduce takes on its own (the blocking
                          all-reduce above over the step time).
  allreduce_wait_buckets  the time a 2-rank step waits after its backward for the gradient sums, with the gradient
                          in buckets of --bucket-mb MiB (compile's bucket_cap_mb) summed while the backward goes
                          on, against one bucket (the default size holds the whole 1.2 MB gradient: nothing to
                          overlap), at a batch of --overlap-batch per rank (where the all-reduce is a larger share
                          of the step), the ranks meeting at a barrier before each step, the two set-ups
                          alternating. "ratio" = buckets / one bucket: what the buckets leave of the wait. The
                          wait includes the ranks' skew (one rank's backward ending later than the other's),
                          which on a shared machine is of the order of the all-reduce itself: only a median over
                          many steps means anything.

Figures are medians of repetitions, from one run; only the ratios mean anything across machines.

    python benchmarks/bench_distributed.py [--quick]
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))


def emit(name, value, unit, **extra):
    print(json.dumps({"name": name, "value": round(value, 4), "unit": unit, **extra}), flush=True)


def demo_program(batch, distributed, **options):
    import fasttrain as ft
    from demo import make_model
    ft.manual_seed(0)
    model = make_model()
    opt = ft.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    return model.compile(opt, ft.nn.CrossEntropyLoss(), batch_size=batch, input_shape=(1, 28, 28),
                         distributed=distributed, **options)


def images_per_second(program, batch, steps):
    """Median images/s of `steps` train steps (after two warm-up steps) on random Fashion-MNIST-shaped data."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, 1, 28, 28)).astype(np.float32)
    y = rng.integers(0, 10, batch)
    for _ in range(2):
        program.train_step(x, y)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        program.train_step(x, y)
        times.append(time.perf_counter() - start)
    return batch / statistics.median(times)


def waits(program, batch, steps):
    """Each step's wait for its gradient sums after its backward, the ranks meeting at a barrier before each."""
    import fasttrain as ft
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, 1, 28, 28)).astype(np.float32)
    y = rng.integers(0, 10, batch)
    out = []
    for _ in range(steps):
        ft.distributed.barrier()
        program.train_step(x, y)
        out.append(program.gradient_buckets["wait_seconds"])
    return out


def rank_main(batch, steps, bucket_mb, overlap_batch):
    """Run by each rank under mpirun: rank 0 prints one JSON object of the ranks' figures."""
    import fasttrain as ft
    ft.distributed.init()
    ft.set_num_threads(1)
    program = demo_program(batch, distributed=True)
    grads = program.flat_grads
    times = []
    for _ in range(steps * 4):
        ft.distributed.barrier()
        start = time.perf_counter()
        ft.distributed.all_reduce(grads)
        times.append(time.perf_counter() - start)
    allreduce = statistics.median(times)
    rate = images_per_second(program, batch, steps) * ft.distributed.get_world_size()
    one = demo_program(overlap_batch, distributed=True)
    bucketed = demo_program(overlap_batch, distributed=True, bucket_cap_mb=bucket_mb)
    one_waits, bucket_waits = [], []
    for _ in range(steps):
        one_waits += waits(one, overlap_batch, 5)[1:]
        bucket_waits += waits(bucketed, overlap_batch, 5)[1:]
    if ft.distributed.get_rank() == 0:
        print(json.dumps({"allreduce_s": allreduce, "bytes": grads.nbytes, "images_per_second": rate,
                          "step_s": batch * ft.distributed.get_world_size() / rate,
                          "one_bucket_wait_s": statistics.median(one_waits),
                          "wait_s": statistics.median(bucket_waits),
                          "buckets": bucketed.gradient_buckets["buckets"]}), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer steps")
    ap.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--batch", type=int, default=128, help="samples per rank (the single process takes 2x)")
    ap.add_argument("--bucket-mb", type=float, default=0.25, help="bucket_cap_mb of the overlapped run")
    ap.add_argument("--overlap-batch", type=int, default=16, help="samples per rank of the overlapped run")
    args = ap.parse_args()
    steps = 5 if args.quick else 20
    if args.rank:
        return rank_main(args.batch, steps, args.bucket_mb, args.overlap_batch)
    import fasttrain as ft
    if not (shutil.which("mpirun") and ft.distributed.is_available()):
        print("bench_distributed: needs mpirun and a build with the MPI backend", file=sys.stderr)
        return 1
    program = demo_program(2 * args.batch, distributed=False)
    n = program.flat_grads.numel()
    src, dst = np.ones(n, np.float32), np.empty(n, np.float32)
    copies = []
    for _ in range(50):
        start = time.perf_counter()
        np.copyto(dst, src)
        copies.append(time.perf_counter() - start)
    memcpy = 2 * src.nbytes / statistics.median(copies) / 1e9
    emit("memcpy_GBps", memcpy, "GB/s")
    ft.set_num_threads(2)
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_btl_vader_single_copy_mechanism="none", OMP_NUM_THREADS="1")
    cmd = ["mpirun", "-np", "2", "--oversubscribe", "--bind-to", "core", sys.executable, os.path.abspath(__file__),
           "--rank", "--batch", str(args.batch), "--bucket-mb", str(args.bucket_mb), "--overlap-batch",
           str(args.overlap_batch)]
    cmd += ["--quick"] if args.quick else []
    # Rounds alternate the two set-ups, so that a busy spell of a shared machine falls on both.
    singles, rounds = [], []
    for _ in range(1 if args.quick else 3):
        singles.append(images_per_second(program, 2 * args.batch, steps))
        out = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, text=True, check=True).stdout
        rounds.append(json.loads(out.strip().splitlines()[-1]))
    single = statistics.median(singles)
    ranks = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
    bus = 2 * (2 - 1) / 2 * ranks["bytes"] / ranks["allreduce_s"] / 1e9
    emit("allreduce_GBps", bus, "GB/s", reference=round(memcpy, 4), reference_name="memcpy",
         ratio=round(bus / memcpy, 4))
    emit("step_1x2", single, "images/s")
    emit("dp_scaling_2x1_vs_1x2", ranks["images_per_second"], "images/s", reference=round(single, 4),
         reference_name="1 process x 2 threads", ratio=round(ranks["images_per_second"] / single, 4))
    emit("allreduce_share", ranks["allreduce_s"] / ranks["step_s"], "fraction of a step")
    emit("allreduce_wait_buckets", ranks["wait_s"] * 1e3, "ms", buckets=int(ranks["buckets"]),
         bucket_mb=args.bucket_mb, batch=args.overlap_batch, reference=round(ranks["one_bucket_wait_s"] * 1e3, 4),
         reference_name="one bucket", ratio=round(ranks["wait_s"] / ranks["one_bucket_wait_s"], 4))
    return 0


if __name__ == "__main__":
    sys.exit(main())
