/* Pointwise ops on the device: activations, add (+ act), mul, concat,
 * dropout, forward and backward, and the two directions of broadcasting.
 *
 * Each is one walk of cuda/strided.h over its operands with the scalar math
 * of kernels/activation.h and kernels/philox.h, computing exactly what the
 * CPU loops compute (ops/activation.c, elementwise.c, dropout.c). Operands
 * sit in fixed slots per op, absent ones left empty. */
#include "backend.h"
#include "kernels/activation.h"
#include "kernels/lstm.h"
#include "kernels/philox.h"
#include "ops/cuda_ops.h"
#include "strided.h"

namespace {

/* dy * act'(s), s the forward output when from_output, else its input. relu
 * and leaky relu select rather than multiply, as the CPU loops do, so that
 * 0 * inf gives 0. */
__device__ float act_grad(ft_act act, bool from_output, float dy, float s) {
    if (act.kind == FT_ACT_RELU || act.kind == FT_ACT_LEAKY_RELU) {
        float alpha = act.kind == FT_ACT_LEAKY_RELU ? act.alpha : 0.0f;
        return s > 0.0f ? dy : alpha == 0.0f ? 0.0f : dy * alpha;
    }
    return dy * (from_output ? ft_act_grad_from_output(act, s) : ft_act_grad_from_input(act, s));
}

__device__ float put(float old, float g, bool accumulate) { return accumulate ? old + g : g; }

/* slots: out, inp */
struct act_fwd_op {
    ft_act act;
    __device__ void operator()(float *v, int64_t) const { v[0] = ft_act_forward(act, v[1]); }
};

/* slots: dinp, dout, the saved input or output */
struct act_bwd_op {
    ft_act act;
    bool from_output, accumulate;
    __device__ void operator()(float *v, int64_t) const {
        v[0] = put(v[0], act_grad(act, from_output, v[1], v[2]), accumulate);
    }
};

/* slots: out, a, b */
struct add_fwd_op {
    ft_act act;
    __device__ void operator()(float *v, int64_t) const { v[0] = ft_act_forward(act, v[1] + v[2]); }
};

/* slots: da, db, dout, then out (from_output) or a and b; none for identity */
struct add_bwd_op {
    ft_act act;
    bool from_output, has_da, has_db, acc_a, acc_b;
    __device__ void operator()(float *v, int64_t) const {
        float g = v[2];
        if (act.kind != FT_ACT_NONE)
            g = act_grad(act, from_output, g, from_output ? v[3] : v[3] + v[4]);
        if (has_da)
            v[0] = put(v[0], g, acc_a);
        if (has_db)
            v[1] = put(v[1], g, acc_b);
    }
};

/* slots: out, a, b */
struct mul_fwd_op {
    __device__ void operator()(float *v, int64_t) const { v[0] = v[1] * v[2]; }
};

/* slots: out, inp (expanded) */
struct scaled_copy_op {
    float scale;
    bool accumulate;
    __device__ void operator()(float *v, int64_t) const { v[0] = put(v[0], scale * v[1], accumulate); }
};

/* A thread per out element, summing its inp elements in C order (as the CPU
 * loop of ops/reduce.c, in double); a block per out element where there are
 * few of them, each of many (sum_to_rows_kernel). */
struct sum_to_args {
    int ndim, nred;
    int red[FT_MAX_DIMS];
    int64_t out_shape[FT_MAX_DIMS], out_st[FT_MAX_DIMS], inp_shape[FT_MAX_DIMS], inp_st[FT_MAX_DIMS];
    int64_t n, count;
    const char *src;
    char *dst;
    int8_t src_kind, dst_kind;
    bool accumulate;
    double scale;
};

/* Where output element o and the first of its input elements are. */
__device__ void sum_to_places(const sum_to_args &a, int64_t o, int64_t *at_in, int64_t *at_out) {
    int64_t rest = o;
    *at_in = *at_out = 0;
    for (int d = a.ndim - 1; d >= 0; d--) {
        int64_t i = rest % a.out_shape[d];
        rest /= a.out_shape[d];
        *at_in += i * a.inp_st[d];
        *at_out += i * a.out_st[d];
    }
}

/* Output element at at_out: sum times the scale, written or added. */
__device__ void sum_to_store(const sum_to_args &a, int64_t at_out, double sum) {
    float v = (float)(sum * a.scale);
    ft_cuda_store_f(a.dst, at_out, a.dst_kind, a.accumulate ? ft_cuda_load_f(a.dst, at_out, a.dst_kind) + v : v);
}

/* Output element o: the sum of its input elements, in their row-major order. */
__device__ void sum_to_one(const sum_to_args &a, int64_t o) {
    int64_t at_in, at_out;
    sum_to_places(a, o, &at_in, &at_out);
    int64_t idx[FT_MAX_DIMS] = {0}, off = at_in;
    double sum = 0;
    for (int64_t k = 0; k < a.count; k++) {
        sum += ft_cuda_load_f(a.src, off, a.src_kind);
        for (int r = a.nred - 1; r >= 0; r--) {
            int d = a.red[r];
            off += a.inp_st[d];
            if (++idx[r] < a.inp_shape[d])
                break;
            off -= idx[r] * a.inp_st[d];
            idx[r] = 0;
        }
    }
    sum_to_store(a, at_out, sum);
}

__global__ void sum_to_kernel(sum_to_args a) {
    for (int64_t o = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; o < a.n; o += (int64_t)gridDim.x * blockDim.x)
        sum_to_one(a, o);
}

/* Output element o per block, for few sums of many elements each (a per-pixel loss's per-sample sums, which one
 * thread per output reads serially): thread t adds elements t, t + blockDim, ..., then a tree in shared memory
 * adds the threads' sums. The order is fixed by the block size alone, so the sums are the same in every run. */
__global__ void __launch_bounds__(FT_CUDA_PW_THREADS) sum_to_rows_kernel(sum_to_args a) {
    __shared__ double part[FT_CUDA_PW_THREADS];
    for (int64_t o = blockIdx.x; o < a.n; o += gridDim.x) {
        int64_t at_in, at_out;
        sum_to_places(a, o, &at_in, &at_out);
        double sum = 0;
        for (int64_t k = threadIdx.x; k < a.count; k += blockDim.x) {
            int64_t off = at_in, left = k;
            for (int r = a.nred - 1; r >= 0; r--) {
                int d = a.red[r];
                off += left % a.inp_shape[d] * a.inp_st[d];
                left /= a.inp_shape[d];
            }
            sum += ft_cuda_load_f(a.src, off, a.src_kind);
        }
        part[threadIdx.x] = sum;
        __syncthreads();
        for (int s = blockDim.x / 2; s > 0; s /= 2) {
            if (threadIdx.x < s)
                part[threadIdx.x] += part[threadIdx.x + s];
            __syncthreads();
        }
        if (threadIdx.x == 0)
            sum_to_store(a, at_out, part[0]);
        __syncthreads(); /* part is the next output's */
    }
}

/* slots: da, db, dout, a (for db), b (for da) */
struct mul_bwd_op {
    bool has_da, has_db, acc_a, acc_b;
    __device__ void operator()(float *v, int64_t) const {
        if (has_da)
            v[0] = put(v[0], v[2] * v[4], acc_a);
        if (has_db)
            v[1] = put(v[1], v[2] * v[3], acc_b);
    }
};

/* slots: dst, src */
struct copy_op {
    bool accumulate;
    __device__ void operator()(float *v, int64_t) const { v[0] = put(v[0], v[1], accumulate); }
};

/* slots: out, inp. Element number i (C order) is kept when, for j = i / span,
 * word j % 4 of Philox block offset + j / 4 has (word >> 8) >= threshold.
 * The block last drawn is kept: a thread's consecutive elements mostly
 * share it. */
struct dropout_op {
    uint64_t seed, offset;
    int64_t span;
    uint32_t threshold;
    float scale;
    bool accumulate;
    bool drawn;
    uint64_t block;
    ft_philox_block r;
    __device__ void operator()(float *v, int64_t e) {
        int64_t i = e / span;
        uint64_t b = offset + (uint64_t)(i >> 2);
        if (!drawn || b != block) {
            r = ft_philox(seed, 0, b);
            block = b;
            drawn = true;
        }
        int64_t k = i & 3;
        uint32_t w = k == 0 ? r.v[0] : k == 1 ? r.v[1] : k == 2 ? r.v[2] : r.v[3];
        v[0] = put(v[0], v[1] * ((w >> 8) >= threshold ? scale : 0.0f), accumulate);
    }
};

} // namespace

/* ---- activations ---- */

static ft_status activation_forward(const ft_tensor *out, const ft_tensor *inp, ft_act act) {
    FT_TRY(ft_cuda_use_device(out));
    const ft_tensor *t[] = {out, inp};
    ft_cuda_pw p;
    if (!ft_cuda_pw_make(&p, t, 2, 1, false, false))
        return FT_OK;
    return ft_cuda_pw_run<1>(p, act_fwd_op{act}, "activation_forward kernel launch");
}

static ft_status activation_backward(const ft_tensor *dinp, const ft_tensor *dout, const ft_tensor *inp,
                                     const ft_tensor *out, ft_act act, bool accumulate) {
    FT_TRY(ft_cuda_use_device(dinp));
    bool from_output = out && ft_act_grad_uses_output(act);
    const ft_tensor *t[] = {dinp, dout, from_output ? out : inp};
    ft_cuda_pw p;
    if (!ft_cuda_pw_make(&p, t, 3, 1, accumulate, false))
        return FT_OK;
    return ft_cuda_pw_run<1>(p, act_bwd_op{act, from_output, accumulate}, "activation_backward kernel launch");
}

/* ---- add, mul ---- */

static ft_status add_forward(const ft_tensor *out, const ft_tensor *a, const ft_tensor *b, ft_act act) {
    FT_TRY(ft_cuda_use_device(out));
    const ft_tensor *t[] = {out, a, b};
    ft_cuda_pw p;
    if (!ft_cuda_pw_make(&p, t, 3, 1, false, false))
        return FT_OK;
    return ft_cuda_pw_run<1>(p, add_fwd_op{act}, "add_forward kernel launch");
}

/* At least one of da, db. The entry point has checked only what act needs:
 * out when the derivative comes from it, else a and b, and none of them for
 * identity. */
static ft_status add_backward(const ft_tensor *da, const ft_tensor *db, const ft_tensor *dout, const ft_tensor *a,
                              const ft_tensor *b, const ft_tensor *out, ft_act act, bool accumulate_a,
                              bool accumulate_b) {
    FT_TRY(ft_cuda_use_device(dout));
    bool from_output = act.kind != FT_ACT_NONE && out && ft_act_grad_uses_output(act);
    bool from_input = act.kind != FT_ACT_NONE && !from_output;
    const ft_tensor *t[] = {da, db, dout, from_output ? out : from_input ? a : NULL, from_input ? b : NULL};
    ft_cuda_pw p;
    if (!ft_cuda_pw_make(&p, t, 5, 2, (da && accumulate_a) || (db && accumulate_b), false))
        return FT_OK;
    add_bwd_op op = {act, from_output, da != NULL, db != NULL, accumulate_a, accumulate_b};
    return ft_cuda_pw_run<1>(p, op, "add_backward kernel launch");
}

static ft_status mul_forward(const ft_tensor *out, const ft_tensor *a, const ft_tensor *b) {
    FT_TRY(ft_cuda_use_device(out));
    const ft_tensor *t[] = {out, a, b};
    ft_cuda_pw p;
    if (!ft_cuda_pw_make(&p, t, 3, 1, false, false))
        return FT_OK;
    return ft_cuda_pw_run<1>(p, mul_fwd_op{}, "mul_forward kernel launch");
}

/* At least one of da, db; a is checked only when db is wanted, b only when da is. */
static ft_status mul_backward(const ft_tensor *da, const ft_tensor *db, const ft_tensor *dout, const ft_tensor *a,
                              const ft_tensor *b, bool accumulate_a, bool accumulate_b) {
    FT_TRY(ft_cuda_use_device(dout));
    const ft_tensor *t[] = {da, db, dout, db ? a : NULL, da ? b : NULL};
    ft_cuda_pw p;
    if (!ft_cuda_pw_make(&p, t, 5, 2, (da && accumulate_a) || (db && accumulate_b), false))
        return FT_OK;
    mul_bwd_op op = {da != NULL, db != NULL, accumulate_a, accumulate_b};
    return ft_cuda_pw_run<1>(p, op, "mul_backward kernel launch");
}

/* ---- concat ---- */

/* The view of t that holds [start, start + size) along dim. */
static ft_tensor narrow(const ft_tensor *t, int dim, int64_t start, int64_t size) {
    ft_tensor v = *t;
    v.shape[dim] = size;
    if (size > 0)
        v.offset += start * t->strides[dim] * (int64_t)ft_cuda_itemsize(t->dtype);
    return v;
}

/* dst = (or +=) src. The entry point has checked that a part either is its
 * slice of the whole (the very same view) or does not overlap the whole, so
 * a part that starts where its slice starts is that slice. */
static ft_status copy_part(const ft_tensor *dst, const ft_tensor *src, bool accumulate) {
    const ft_tensor *t[] = {dst, src};
    ft_cuda_pw p;
    if (!ft_cuda_pw_make(&p, t, 2, 1, accumulate, false))
        return FT_OK;
    if (!accumulate && ft_tensor_data(dst) == ft_tensor_data(src))
        return FT_OK;
    return ft_cuda_pw_run<1>(p, copy_op{accumulate}, "concat kernel launch");
}

/* dim is in [0, ndim): the entry point has resolved a negative one. */
static ft_status concat_forward(const ft_tensor *out, const ft_tensor *const *inps, int n, int dim) {
    FT_TRY(ft_cuda_use_device(out));
    int64_t start = 0;
    for (int i = 0; i < n; i++) {
        ft_tensor slice = narrow(out, dim, start, inps[i]->shape[dim]);
        start += inps[i]->shape[dim];
        FT_TRY(copy_part(&slice, inps[i], false));
    }
    return FT_OK;
}

static ft_status concat_backward(const ft_tensor *const *dinps, const int64_t *sizes, int n, const ft_tensor *dout,
                                 int dim, bool accumulate) {
    FT_TRY(ft_cuda_use_device(dout));
    int64_t start = 0;
    for (int i = 0; i < n; i++) {
        ft_tensor slice = narrow(dout, dim, start, sizes[i]);
        start += sizes[i];
        if (dinps[i])
            FT_TRY(copy_part(dinps[i], &slice, accumulate));
    }
    return FT_OK;
}

/* ---- dropout ---- */

static ft_status dropout_run(const ft_tensor *out, const ft_tensor *inp, const ft_dropout_params *dp,
                             bool accumulate, const char *kernel) {
    FT_TRY(ft_cuda_use_device(out));
    const ft_tensor *t[] = {out, inp};
    ft_cuda_pw p;
    if (!ft_cuda_pw_make(&p, t, 2, 1, accumulate, true))
        return FT_OK;
    dropout_op op = {};
    op.seed = dp->seed;
    op.offset = dp->offset;
    op.span = dp->span;
    op.threshold = ft_dropout_threshold(dp->p);
    op.scale = ft_dropout_scale(dp->p);
    op.accumulate = accumulate;
    /* 4 elements a thread: one Philox block serves 4 consecutive ones */
    return ft_cuda_pw_run<4>(p, op, kernel);
}

static ft_status dropout_forward(const ft_tensor *out, const ft_tensor *inp, const ft_dropout_params *p) {
    return dropout_run(out, inp, p, false, "dropout_forward kernel launch");
}

static ft_status dropout_backward(const ft_tensor *dinp, const ft_tensor *dout, const ft_dropout_params *p,
                                  bool accumulate) {
    return dropout_run(dinp, dout, p, accumulate, "dropout_backward kernel launch");
}

/* ---- the LSTM cell (ops/rnn.h), over gate views; the CPU's formulas in its order ---- */

namespace {

/* slots: c, i, f, g, c_prev (absent: zeros) */
struct lstm_cell_op {
    bool prev;
    __device__ void operator()(float *v, int64_t) const {
        v[0] = ft_lstm_c(v[1], v[2], v[3], prev ? v[4] : 0.0f, prev);
    }
};

/* slots: df, dc_prev, dc, f, c_prev */
struct lstm_cell_f_op {
    bool has_df, has_dcp, acc_df, acc_dcp;
    __device__ void operator()(float *v, int64_t) const {
        float s = ft_sigmoidf(v[3]);
        if (has_df)
            v[0] = put(v[0], ft_lstm_dsigmoid(v[2], v[4], s), acc_df);
        if (has_dcp)
            v[1] = put(v[1], v[2] * s, acc_dcp);
    }
};

/* slots: out */
struct zero_op {
    __device__ void operator()(float *v, int64_t) const { v[0] = 0.0f; }
};

/* slots: h, o, c */
struct lstm_hidden_op {
    __device__ void operator()(float *v, int64_t) const { v[0] = ft_lstm_h(v[1], v[2]); }
};

/* y = sigmoid(a) tanh(b), both halves of an LSTM step (c's sigmoid(i) tanh(g), h): slots da, db, dy, a, b */
struct sig_tanh_bwd_op {
    bool has_da, has_db, acc_da, acc_db;
    __device__ void operator()(float *v, int64_t) const {
        float s = ft_sigmoidf(v[3]), t = ft_tanhf(v[4]);
        if (has_da)
            v[0] = put(v[0], ft_lstm_dsigmoid(v[2], t, s), acc_da);
        if (has_db)
            v[1] = put(v[1], ft_lstm_dtanh(v[2], s, t), acc_db);
    }
};

} // namespace

/* Gate k (i, f, g, o) of gates (N, 4H): its (N, H) columns. */
static ft_tensor gate(const ft_tensor *gates, int k) {
    int64_t H = gates->shape[1] / 4;
    return narrow(gates, 1, k * H, H);
}

static ft_status lstm_cell_forward(const ft_tensor *c, const ft_tensor *gates, const ft_tensor *c_prev) {
    FT_TRY(ft_cuda_use_device(c));
    ft_tensor i = gate(gates, 0), f = gate(gates, 1), g = gate(gates, 2);
    const ft_tensor *t[] = {c, &i, &f, &g, c_prev};
    ft_cuda_pw p;
    if (!ft_cuda_pw_make(&p, t, 5, 1, false, false))
        return FT_OK;
    return ft_cuda_pw_run<1>(p, lstm_cell_op{c_prev != NULL}, "lstm_cell kernel launch");
}

static ft_status lstm_cell_backward(const ft_tensor *dgates, const ft_tensor *dc_prev, const ft_tensor *dc,
                                   const ft_tensor *gates, const ft_tensor *c_prev, bool accumulate_gates,
                                   bool accumulate_c_prev) {
    FT_TRY(ft_cuda_use_device(dc));
    ft_tensor f = gate(gates, 1), df = dgates ? gate(dgates, 1) : ft_tensor{};
    ft_cuda_pw p;
    if (dgates && !c_prev && !accumulate_gates) { /* f multiplied zeros */
        const ft_tensor *t[] = {&df};
        if (ft_cuda_pw_make(&p, t, 1, 1, false, false))
            FT_TRY(ft_cuda_pw_run<1>(p, zero_op{}, "lstm_cell_backward kernel launch"));
    } else if (c_prev && (dgates || dc_prev)) {
        const ft_tensor *t[] = {dgates ? &df : NULL, dc_prev, dc, &f, c_prev};
        if (ft_cuda_pw_make(&p, t, 5, 2, accumulate_gates || accumulate_c_prev, false))
            FT_TRY(ft_cuda_pw_run<1>(p, lstm_cell_f_op{dgates != NULL, dc_prev != NULL, accumulate_gates,
                                                       accumulate_c_prev},
                                     "lstm_cell_backward kernel launch"));
    }
    if (!dgates)
        return FT_OK;
    ft_tensor di = gate(dgates, 0), dg = gate(dgates, 2), i = gate(gates, 0), g = gate(gates, 2);
    const ft_tensor *t[] = {&di, &dg, dc, &i, &g};
    if (!ft_cuda_pw_make(&p, t, 5, 2, accumulate_gates, false))
        return FT_OK;
    return ft_cuda_pw_run<1>(p, sig_tanh_bwd_op{true, true, accumulate_gates, accumulate_gates},
                             "lstm_cell_backward kernel launch");
}

static ft_status lstm_hidden_forward(const ft_tensor *h, const ft_tensor *gates, const ft_tensor *c) {
    FT_TRY(ft_cuda_use_device(h));
    ft_tensor o = gate(gates, 3);
    const ft_tensor *t[] = {h, &o, c};
    ft_cuda_pw p;
    if (!ft_cuda_pw_make(&p, t, 3, 1, false, false))
        return FT_OK;
    return ft_cuda_pw_run<1>(p, lstm_hidden_op{}, "lstm_hidden kernel launch");
}

static ft_status lstm_hidden_backward(const ft_tensor *dgates, const ft_tensor *dc, const ft_tensor *dh,
                                     const ft_tensor *gates, const ft_tensor *c, bool accumulate_gates,
                                     bool accumulate_c) {
    FT_TRY(ft_cuda_use_device(dh));
    ft_tensor o = gate(gates, 3), dgo = dgates ? gate(dgates, 3) : ft_tensor{};
    const ft_tensor *t[] = {dgates ? &dgo : NULL, dc, dh, &o, c};
    ft_cuda_pw p;
    if (!ft_cuda_pw_make(&p, t, 5, 2, accumulate_gates || accumulate_c, false))
        return FT_OK;
    return ft_cuda_pw_run<1>(p, sig_tanh_bwd_op{dgates != NULL, dc != NULL, accumulate_gates, accumulate_c},
                             "lstm_hidden_backward kernel launch");
}

/* ---- broadcasting ---- */

static ft_status broadcast_to(const ft_tensor *out, const ft_tensor *inp, double scale, bool accumulate) {
    FT_TRY(ft_cuda_use_device(out));
    ft_tensor expanded = *inp;
    for (int d = 0; d < inp->ndim; d++)
        if (inp->shape[d] != out->shape[d]) {
            expanded.shape[d] = out->shape[d];
            expanded.strides[d] = 0;
        }
    const ft_tensor *t[] = {out, &expanded};
    ft_cuda_pw p;
    if (!ft_cuda_pw_make(&p, t, 2, 1, accumulate, false))
        return FT_OK;
    return ft_cuda_pw_run<1>(p, scaled_copy_op{(float)scale, accumulate}, "broadcast_to kernel launch");
}

static ft_status sum_to(const ft_tensor *out, const ft_tensor *inp, double scale, bool accumulate) {
    FT_TRY(ft_cuda_use_device(out));
    sum_to_args a = {};
    a.ndim = inp->ndim;
    a.count = a.n = 1;
    for (int d = 0; d < inp->ndim; d++) {
        a.n *= out->shape[d];
        a.out_shape[d] = out->shape[d];
        a.out_st[d] = out->strides[d];
        a.inp_shape[d] = inp->shape[d];
        a.inp_st[d] = inp->strides[d];
        if (out->shape[d] != inp->shape[d]) {
            a.red[a.nred++] = d;
            a.count *= inp->shape[d];
        }
    }
    if (a.n == 0)
        return FT_OK;
    a.src = (const char *)ft_tensor_data(inp);
    a.dst = (char *)ft_tensor_data(out);
    a.src_kind = ft_cuda_kind(inp->dtype);
    a.dst_kind = ft_cuda_kind(out->dtype);
    a.accumulate = accumulate;
    a.scale = scale;
    /* a block per output where the outputs would not fill a device with threads but each sums thousands */
    if (a.count >= 4 * FT_CUDA_PW_THREADS && a.n < 65536)
        sum_to_rows_kernel<<<(unsigned)a.n, FT_CUDA_PW_THREADS, 0, FT_CUDA_STREAM>>>(a);
    else
        sum_to_kernel<<<ft_cuda_blocks(a.n, FT_CUDA_PW_THREADS), FT_CUDA_PW_THREADS, 0, FT_CUDA_STREAM>>>(a);
    return ft_cuda_launched("sum_to kernel launch");
}

void ft_cuda_register_pointwise(struct ft_cuda_ops *ops) {
    ops->sum_to = sum_to;
    ops->broadcast_to = broadcast_to;
    ops->activation_forward = activation_forward;
    ops->activation_backward = activation_backward;
    ops->add_forward = add_forward;
    ops->add_backward = add_backward;
    ops->mul_forward = mul_forward;
    ops->mul_backward = mul_backward;
    ops->concat_forward = concat_forward;
    ops->concat_backward = concat_backward;
    ops->dropout_forward = dropout_forward;
    ops->dropout_backward = dropout_backward;
    ops->lstm_cell_forward = lstm_cell_forward;
    ops->lstm_cell_backward = lstm_cell_backward;
    ops->lstm_hidden_forward = lstm_hidden_forward;
    ops->lstm_hidden_backward = lstm_hidden_backward;
}
