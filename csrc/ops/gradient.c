#include "ops/gradient.h"

#include <string.h>

#include "ops/check.h"
#include "ops/elementwise.h"

static ft_status begin(ft_grad_out *g, const ft_tensor *dst, bool accumulate, const ft_tensor **write, bool wide) {
    memset(g, 0, sizeof *g);
    g->dst = dst;
    *write = dst;
    if (!dst || !accumulate || ft_tensor_numel(dst) == 0)
        return FT_OK;
    ft_dtype dt = wide && (dst->dtype == FT_BFLOAT16 || dst->dtype == FT_FLOAT16) ? FT_FLOAT32 : dst->dtype;
    FT_TRY(ft_tensor_empty_like(&g->tmp, dst, dst->ndim, dst->shape, dt, ft_op_device(dst)));
    *write = &g->tmp;
    return FT_OK;
}

ft_status ft_grad_out_begin(ft_grad_out *g, const ft_tensor *dst, bool accumulate, const ft_tensor **write) {
    return begin(g, dst, accumulate, write, false);
}

ft_status ft_grad_out_begin_float(ft_grad_out *g, const ft_tensor *dst, bool accumulate, const ft_tensor **write) {
    return begin(g, dst, accumulate, write, true);
}

ft_status ft_grad_out_end(ft_grad_out *g, ft_status s) {
    if (!g->tmp.storage)
        return s;
    if (s == FT_OK)
        s = ft_add_forward(g->dst, g->dst, &g->tmp, (ft_act){FT_ACT_NONE, 0});
    ft_tensor_release(&g->tmp);
    return s;
}
