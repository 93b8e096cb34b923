#include "ops/gradient.h"

#include <string.h>

#include "ops/check.h"
#include "ops/elementwise.h"

ft_status ft_grad_out_begin(ft_grad_out *g, const ft_tensor *dst, bool accumulate, const ft_tensor **write) {
    memset(g, 0, sizeof *g);
    g->dst = dst;
    *write = dst;
    if (!dst || !accumulate || ft_tensor_numel(dst) == 0)
        return FT_OK;
    FT_TRY(ft_tensor_empty_like(&g->tmp, dst, dst->ndim, dst->shape, dst->dtype, ft_op_device(dst)));
    *write = &g->tmp;
    return FT_OK;
}

ft_status ft_grad_out_end(ft_grad_out *g, ft_status s) {
    if (!g->tmp.storage)
        return s;
    if (s == FT_OK)
        s = ft_add_forward(g->dst, g->dst, &g->tmp, (ft_act){FT_ACT_NONE, 0});
    ft_tensor_release(&g->tmp);
    return s;
}
