/* Data-parallel gradient sums in buckets, overlapped with the backward (the
 * reducer of PyTorch's DistributedDataParallel, over ft.distributed; the
 * step divides by the world size after).
 *
 * The program's flat gradient buffer is cut into buckets of about
 * bucket_bytes, counted from its end: parameters are laid out in the order
 * the model creates them, so the backward, which runs the model in reverse,
 * finishes the last bucket first. A bucket's sum over the ranks starts
 * (MPI_Iallreduce) as soon as every gradient slot that overlaps it is final
 * and every bucket before it has started, so every rank starts the same sums
 * in the same order whatever its data; ft_reducer_finish starts the rest and
 * waits. A model whose parameters come in another order is still summed
 * right, only later. */
#ifndef FT_NN_REDUCER_H
#define FT_NN_REDUCER_H

#include "nn/program.h"

typedef struct ft_reducer ft_reducer;

/* A reducer of p's gradients, grads being p's flat float32 gradient buffer
 * (every slot of p a view into it). bucket_bytes > 0. */
ft_status ft_reducer_create(ft_reducer **out, ft_program *p, const ft_tensor *grads, int64_t bucket_bytes);
void ft_reducer_destroy(ft_reducer *r);

/* Before a step's last backward: the buckets wait again. */
void ft_reducer_begin(ft_reducer *r);

/* After it: the sums of the buckets not started yet start, all are waited
 * for, and the first error of any (started from within the backward) is
 * returned. The gradients are then the sums over the ranks. */
ft_status ft_reducer_finish(ft_reducer *r);

int ft_reducer_num_buckets(const ft_reducer *r);

/* How many buckets the last step started before its backward ended, and
 * the seconds it then spent finishing the sums (what the backward did not
 * hide of them). */
int ft_reducer_started_early(const ft_reducer *r);
double ft_reducer_wait_seconds(const ft_reducer *r);

#endif
