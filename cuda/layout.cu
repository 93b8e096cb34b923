/* Operands in the layouts cuDNN and cuBLASLt take, the epilogue they cannot
 * fuse, and the program's batch counter. */
#include "backend.h"
#include "ops/cuda_ops.h"

static ft_copy_desc copy_desc(const ft_tensor *t) {
    ft_copy_desc d;
    d.ndim = t->ndim;
    for (int k = 0; k < t->ndim; k++)
        d.shape[k] = t->shape[k];
    return d;
}

static void contiguous_strides(int64_t *strides, const ft_tensor *t) {
    int64_t step = 1;
    for (int k = t->ndim - 1; k >= 0; k--) {
        strides[k] = step;
        step *= t->shape[k];
    }
}

ft_status ft_cuda_stage(ft_cuda_scratch *s, const ft_tensor *t, ft_dtype dtype, bool copy) {
    int64_t numel = 1;
    for (int k = 0; k < t->ndim; k++)
        numel *= t->shape[k];
    int device = ft_tensor_device(t).index;
    FT_TRY(ft_cuda_scratch_alloc(s, (size_t)numel * ft_cuda_itemsize(dtype), device));
    if (!copy)
        return FT_OK;
    ft_copy_desc d = copy_desc(t);
    d.dst = s->ptr;
    d.src = ft_tensor_data(t);
    contiguous_strides(d.dst_strides, t);
    for (int k = 0; k < t->ndim; k++)
        d.src_strides[k] = t->strides[k];
    d.dst_dtype = dtype;
    d.src_dtype = t->dtype;
    ft_status st = ft_cuda_copy_strided(&d, device, FT_CUDA_STREAM);
    if (st != FT_OK)
        ft_cuda_scratch_free(s);
    return st;
}

ft_status ft_cuda_copy_back(const ft_tensor *dst, const void *src, ft_dtype src_dtype) {
    ft_copy_desc d = copy_desc(dst);
    d.dst = ft_tensor_data(dst);
    d.src = src;
    for (int k = 0; k < dst->ndim; k++)
        d.dst_strides[k] = dst->strides[k];
    contiguous_strides(d.src_strides, dst);
    d.dst_dtype = dst->dtype;
    d.src_dtype = src_dtype;
    return ft_cuda_copy_strided(&d, ft_tensor_device(dst).index, FT_CUDA_STREAM);
}

/* `inner` is the product of the sizes after `dim`: element i of the C order
 * belongs to channel (i / inner) % channels. */
template <typename T>
__global__ void bias_act_kernel(T *out, ft_cuda_layout l, int64_t numel, const float *b, int64_t inner,
                                int64_t channels, ft_act act) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < numel; i += (int64_t)gridDim.x * blockDim.x) {
        T *p = out + ft_cuda_offset(l, i);
        float v = ft_cuda_io<T>::load(p);
        if (b)
            v += b[i / inner % channels];
        ft_cuda_io<T>::store(p, ft_act_forward(act, v));
    }
}

ft_status ft_cuda_bias_act(const ft_tensor *out, const ft_tensor *b, int dim, ft_act act) {
    if (!b && act.kind == FT_ACT_NONE)
        return FT_OK;
    int64_t numel = 1, inner = 1;
    for (int k = 0; k < out->ndim; k++) {
        numel *= out->shape[k];
        if (k > dim)
            inner *= out->shape[k];
    }
    if (numel == 0)
        return FT_OK;
    FT_TRY(ft_cuda_use_device(out));
    /* bias is contiguous float32 (the entry points check it) */
    const float *bias = b ? (const float *)ft_tensor_data(b) : NULL;
    ft_cuda_layout l = ft_cuda_layout_of(out);
    unsigned blocks = ft_cuda_blocks(numel, 256);
    if (out->dtype == FT_BFLOAT16)
        bias_act_kernel<<<blocks, 256, 0, FT_CUDA_STREAM>>>((uint16_t *)ft_tensor_data(out), l, numel, bias, inner,
                                                           out->shape[dim], act);
    else if (out->dtype == FT_FLOAT16)
        bias_act_kernel<<<blocks, 256, 0, FT_CUDA_STREAM>>>((ft_cuda_half *)ft_tensor_data(out), l, numel, bias,
                                                           inner, out->shape[dim], act);
    else
        bias_act_kernel<<<blocks, 256, 0, FT_CUDA_STREAM>>>((float *)ft_tensor_data(out), l, numel, bias, inner,
                                                           out->shape[dim], act);
    return ft_cuda_launched("bias_act kernel");
}

__global__ void increment_kernel(int64_t *counter) { ++*counter; }

static ft_status increment(const ft_tensor *counter) {
    FT_TRY(ft_cuda_use_device(counter));
    increment_kernel<<<1, 1, 0, FT_CUDA_STREAM>>>((int64_t *)ft_tensor_data(counter));
    return ft_cuda_launched("increment kernel");
}

void ft_cuda_register_layout(ft_cuda_ops *ops) { ops->increment = increment; }
