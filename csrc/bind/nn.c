/* fasttrain._C.Program: a compiled model (csrc/nn/program.h) and its
 * training step, with the optimizer update, in one call that releases the
 * GIL.
 *
 * Python describes each node as a dict (python/fasttrain/nn/program.py
 * builds them): kind, inputs, shape, the parameter/gradient tensors and the
 * op's arguments. The Program keeps every tensor it was given alive. */
#include "bind/bind.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>

#include "core/cuda.h"
#include "core/dist.h"
#include "data/loader.h"
#include "nn/node.h"
#include "nn/reducer.h"
#include "ops/activation.h"
#include "ops/check.h"
#include "ops/math.h"
#include "ops/reduce.h"
#include "optim/optim.h"

/* Dynamic loss scaling, as torch.amp.GradScaler: the backward starts from
 * `scale` instead of 1 and the update multiplies the gradients by 1 / scale;
 * a step whose loss or gradients overflowed is skipped and multiplies the
 * scale by `backoff`, `interval` steps in a row without one by `growth`.
 * scale 0: off. */
typedef struct {
    double scale, growth, backoff;
    int64_t interval, good; /* good: steps since the last overflow or growth */
} loss_scaler;

typedef struct {
    PyObject_HEAD
    ft_program *prog;
    PyObject *keep;        /* the node dicts and flat buffers, holding the parameter tensors */
    ft_tensor params, grads; /* the flat buffers (borrowed from `keep`) */
    int64_t *trained;        /* (ntrained) sorted offsets in grads of the gradients the program writes */
    int ntrained;
    bool distributed; /* steps average the gradients and the loss over the ranks of ft.distributed */
    void *nccl;       /* a distributed CUDA program's NCCL communicator */
    ft_reducer *reducer; /* a distributed CPU program's: its gradients summed in buckets during the backward */
    double last_grad_norm;   /* of the last step (NaN before the first) */
    loss_scaler scaler;
    /* fit_epoch's calls, and the steps the last one applied, skipped and tallied: kept here rather than only
     * returned, since a signal's handler may raise as the result reaches Python, after the steps were applied */
    int64_t fit_calls, fit_steps, fit_skipped;
    ft_tally fit_tally;
    bool busy;           /* a call runs (see claim); read and written with the GIL only */
    unsigned long owner; /* the thread of that call */
} program_object;

/* ---- parsing a node dict ---- */

static int get_long(PyObject *d, const char *key, long long dflt, long long *out) {
    PyObject *v = PyDict_GetItemString(d, key);
    if (!v) {
        *out = dflt;
        return 0;
    }
    *out = PyLong_AsLongLong(v);
    return *out == -1 && PyErr_Occurred() ? -1 : 0;
}

static int get_double(PyObject *d, const char *key, double dflt, double *out) {
    PyObject *v = PyDict_GetItemString(d, key);
    if (!v) {
        *out = dflt;
        return 0;
    }
    *out = PyFloat_AsDouble(v);
    return *out == -1.0 && PyErr_Occurred() ? -1 : 0;
}

/* An ops/math.h op by its name (as _C.math_pointwise takes it), FT_MATH_NUM_OPS when absent. */
static int get_math_op(PyObject *d, const char *key, int *out) {
    PyObject *v = PyDict_GetItemString(d, key);
    *out = FT_MATH_NUM_OPS;
    if (!v)
        return 0;
    const char *name = PyUnicode_AsUTF8(v);
    ft_math_op op;
    if (!name || ft_math_op_of(name, &op) != FT_OK) {
        if (!PyErr_Occurred())
            PyErr_Format(PyExc_ValueError, "node field %s: %R names no math op", key, v);
        return -1;
    }
    *out = (int)op;
    return 0;
}

static int get_ints(PyObject *d, const char *key, int64_t *out, int max, int *n) {
    PyObject *v = PyDict_GetItemString(d, key);
    if (!v) {
        *n = 0;
        return 0;
    }
    int64_t vals[FT_MAX_DIMS];
    int count;
    if (ft_py_parse_shape(v, vals, &count) < 0)
        return -1;
    if (count > max) {
        PyErr_Format(PyExc_ValueError, "node field %s has %d entries, at most %d allowed", key, count, max);
        return -1;
    }
    memcpy(out, vals, (size_t)count * sizeof *vals);
    *n = count;
    return 0;
}

static int get_pair(PyObject *d, const char *key, int64_t dflt, int64_t out[2]) {
    int n;
    out[0] = out[1] = dflt;
    if (get_ints(d, key, out, 2, &n) < 0)
        return -1;
    if (n == 1)
        out[1] = out[0];
    return 0;
}

static int get_tensor(ft_module_state *st, PyObject *d, const char *key, ft_tensor *out) {
    PyObject *v = PyDict_GetItemString(d, key);
    memset(out, 0, sizeof *out);
    if (!v || v == Py_None)
        return 0;
    ft_tensor *t = ft_py_unwrap(st, v, key);
    if (!t)
        return -1;
    *out = *t; /* borrowed: the node dict keeps the object alive */
    return 0;
}

static int parse_node(ft_module_state *st, PyObject *d, ft_node *nd) {
    if (!PyDict_Check(d)) {
        PyErr_SetString(PyExc_TypeError, "program nodes must be dicts");
        return -1;
    }
    memset(nd, 0, sizeof *nd);
    long long kind, groups, act, ceil_mode, include_pad, divisor, training, norm_dims, slice_dim, slice_start,
        slice_step, dtype, reduction, ignore_index, dim, padding_idx, causal, reverse, sync, abn, align_corners, uniform,
        channels, score_bias, common, weight_input;
    int64_t shape[FT_NODE_MAX_DIMS], perm[FT_NODE_MAX_DIMS];
    int nperm;
    double alpha;
    int64_t inputs[FT_NODE_MAX_INPUTS];
    if (get_long(d, "kind", -1, &kind) < 0 || get_ints(d, "inputs", inputs, FT_NODE_MAX_INPUTS, &nd->ninputs) < 0 ||
        get_ints(d, "shape", shape, FT_NODE_MAX_DIMS, &nd->ndim) < 0)
        return -1;
    for (int k = 0; k < nd->ninputs; k++)
        nd->inputs[k] = (int)inputs[k];
    memcpy(nd->shape, shape, sizeof shape);
    nd->kind = (ft_node_kind)kind;
    if (get_tensor(st, d, "weight", &nd->weight) < 0 || get_tensor(st, d, "bias", &nd->bias) < 0 ||
        get_tensor(st, d, "dweight", &nd->dweight) < 0 || get_tensor(st, d, "dbias", &nd->dbias) < 0 ||
        get_tensor(st, d, "running_mean", &nd->running_mean) < 0 ||
        get_tensor(st, d, "running_var", &nd->running_var) < 0 ||
        get_tensor(st, d, "num_batches_tracked", &nd->num_batches) < 0)
        return -1;
    if (nd->num_batches.storage && (nd->num_batches.dtype != FT_INT64 || nd->num_batches.ndim != 0)) {
        PyErr_SetString(PyExc_TypeError, "num_batches_tracked must be a 0-d int64 tensor");
        return -1;
    }
    if (get_long(d, "act", FT_ACT_NONE, &act) < 0 || get_double(d, "alpha", 0.0, &alpha) < 0 ||
        get_pair(d, "stride", 1, nd->conv.stride) < 0 || get_pair(d, "padding", 0, nd->conv.padding) < 0 ||
        get_pair(d, "dilation", 1, nd->conv.dilation) < 0 || get_long(d, "groups", 1, &groups) < 0 ||
        get_pair(d, "kernel", 1, nd->pool.kernel) < 0 || get_long(d, "ceil_mode", 0, &ceil_mode) < 0 ||
        get_long(d, "count_include_pad", 1, &include_pad) < 0 || get_long(d, "divisor_override", 0, &divisor) < 0 ||
        get_double(d, "eps", 1e-5, &nd->bn.eps) < 0 ||
        get_double(d, "momentum", 0.1, &nd->bn.momentum) < 0 || get_long(d, "batch_stats", 1, &training) < 0 ||
        get_double(d, "p", 0.0, &nd->dropout_p) < 0 || get_long(d, "norm_dims", 0, &norm_dims) < 0 ||
        get_double(d, "layer_eps", 1e-5, &nd->eps) < 0 || get_double(d, "scale", 1.0, &nd->scale) < 0 ||
        get_ints(d, "perm", perm, FT_NODE_MAX_DIMS, &nperm) < 0 || get_long(d, "slice_dim", 0, &slice_dim) < 0 ||
        get_long(d, "dim", 0, &dim) < 0 || get_long(d, "padding_idx", -1, &padding_idx) < 0 ||
        get_long(d, "causal", 0, &causal) < 0 || get_long(d, "score_bias", 0, &score_bias) < 0 ||
        get_long(d, "reverse", 0, &reverse) < 0 ||
        get_pair(d, "factor", 1, nd->factor) < 0 ||
        get_long(d, "slice_start", 0, &slice_start) < 0 || get_long(d, "slice_step", 1, &slice_step) < 0 ||
        get_long(d, "dtype", FT_FLOAT32, &dtype) < 0 || get_long(d, "reduction", FT_NODE_REDUCE_NONE, &reduction) < 0 ||
        get_double(d, "label_smoothing", 0.0, &nd->label_smoothing) < 0 ||
        get_double(d, "count_offset", 0.0, &nd->count_offset) < 0 ||
        get_double(d, "count_floor", -INFINITY, &nd->count_floor) < 0 ||
        get_long(d, "ignore_index", -100, &ignore_index) < 0 || get_long(d, "sync", 0, &sync) < 0 ||
        get_long(d, "abn", 0, &abn) < 0 || get_double(d, "flops", 0.0, &nd->flops) < 0 ||
        get_long(d, "align_corners", 0, &align_corners) < 0 || get_double(d, "scale_h", 0.0, &nd->lerp.scale_h) < 0 ||
        get_double(d, "scale_w", 0.0, &nd->lerp.scale_w) < 0 || get_long(d, "uniform", 0, &uniform) < 0 ||
        get_long(d, "channels", 0, &channels) < 0 || get_math_op(d, "math_op", &nd->math_op) < 0 ||
        get_long(d, "common", 0, &common) < 0 || get_long(d, "weight_input", 0, &weight_input) < 0)
        return -1;
    if ((dtype != FT_FLOAT32 && dtype != FT_INT64 && dtype != FT_BOOL) || reduction < 0 ||
        reduction > FT_NODE_REDUCE_RATIO) {
        PyErr_Format(PyExc_ValueError, "node dtype code %lld or reduction code %lld is not one a program takes", dtype,
                     reduction);
        return -1;
    }
    nd->dtype = (ft_dtype)dtype;
    nd->lerp.align_corners = align_corners;
    nd->uniform = uniform;
    nd->common = common;
    nd->weight_input = (int)weight_input;
    nd->dropout_channels = channels;
    nd->ignore_index = ignore_index;
    nd->reduction = (ft_node_reduction)reduction;
    if (nperm && nperm != nd->ndim) {
        PyErr_Format(PyExc_ValueError, "node field perm has %d entries for a %d-d shape", nperm, nd->ndim);
        return -1;
    }
    for (int k = 0; k < nperm; k++)
        nd->perm[k] = (int)perm[k];
    nd->slice_dim = (int)slice_dim;
    nd->dim = (int)dim;
    nd->slice_start = slice_start;
    nd->slice_step = slice_step;
    nd->norm_dims = (int)norm_dims;
    if (act < 0 || act >= FT_NUM_ACTS) {
        PyErr_Format(PyExc_ValueError, "unknown activation code %lld", act);
        return -1;
    }
    nd->act = (ft_act){(ft_act_kind)act, (float)alpha};
    nd->conv.groups = nd->groups = groups;
    nd->padding_idx = padding_idx;
    nd->causal = causal;
    nd->score_bias = score_bias;
    nd->reverse = reverse;
    memcpy(nd->pool.stride, nd->conv.stride, sizeof nd->pool.stride);
    memcpy(nd->pool.padding, nd->conv.padding, sizeof nd->pool.padding);
    memcpy(nd->pool.dilation, nd->conv.dilation, sizeof nd->pool.dilation);
    nd->pool.ceil_mode = ceil_mode;
    nd->pool.count_include_pad = include_pad;
    nd->pool.divisor_override = divisor;
    nd->bn.training = training;
    nd->bn.sync = sync;
    nd->bn.inplace_abn = abn;
    return 0;
}

static int compare_offsets(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* The sorted, distinct element offsets in grads of the nodes' gradient views. */
static int trained_offsets(const ft_node *nodes, int n, const ft_tensor *grads, int64_t *out) {
    int count = 0;
    for (int i = 0; i < n; i++) {
        const ft_tensor *g[2] = {&nodes[i].dweight, &nodes[i].dbias};
        for (int k = 0; k < 2; k++)
            if (g[k]->storage)
                out[count++] = (g[k]->offset - grads->offset) / 4;
    }
    qsort(out, (size_t)count, sizeof *out, compare_offsets);
    int distinct = 0;
    for (int k = 0; k < count; k++)
        if (distinct == 0 || out[k] != out[distinct - 1])
            out[distinct++] = out[k];
    return distinct;
}

/* The recomputation `obj` asks for (ft_recompute): None none, "auto" the
 * planner's sqrt(N) segments, an int the planner's choice within that many
 * bytes of training arena, a list of each node's segment (-1: none) those
 * segments. *segment gets the list's ints (PyMem; the caller frees it). */
static int parse_recompute(PyObject *obj, Py_ssize_t n, ft_recompute *rc, int **segment) {
    *rc = (ft_recompute){.budget = -1};
    *segment = NULL;
    if (obj == Py_None)
        return 0;
    if (PyUnicode_Check(obj) && PyUnicode_CompareWithASCIIString(obj, "auto") == 0) {
        rc->automatic = true;
        return 0;
    }
    if (PyLong_Check(obj) && !PyBool_Check(obj)) {
        long long budget = PyLong_AsLongLong(obj);
        if (budget == -1 && PyErr_Occurred())
            return -1;
        if (budget < 0) {
            PyErr_Format(PyExc_ValueError, "Program: a recompute budget is a number of bytes, got %lld", budget);
            return -1;
        }
        rc->automatic = true;
        rc->budget = budget;
        return 0;
    }
    if (!PyList_Check(obj) || PyList_GET_SIZE(obj) != n) {
        PyErr_SetString(PyExc_TypeError, "Program: recompute is None, 'auto', a budget in bytes or a list of each "
                                         "node's segment");
        return -1;
    }
    *segment = PyMem_Malloc((size_t)(n ? n : 1) * sizeof **segment);
    if (!*segment) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        long v = PyLong_AsLong(PyList_GET_ITEM(obj, i));
        if ((v == -1 && PyErr_Occurred()) || v < -1 || v > INT_MAX) {
            if (!PyErr_Occurred())
                PyErr_Format(PyExc_ValueError, "Program: node %zd's recompute segment is %ld", i, v);
            PyMem_Free(*segment);
            *segment = NULL;
            return -1;
        }
        (*segment)[i] = (int)v;
    }
    rc->segment = *segment;
    return 0;
}

/* Program(nodes, params, grads, output, batch, channels_last, seed,
 * compute=float32, recompute=None): params and grads are the model's flat
 * buffers, every parameter (gradient) a view into them; nodes[output] is
 * the model's output, the last node the loss; compute bfloat16 or float16
 * is mixed precision (ft_program_create); recompute as parse_recompute. */
static PyObject *program_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"nodes",   "params", "grads",     "output", "batch", "channels_last",
                             "seed",    "compute", "recompute", NULL};
    PyObject *nodes, *params_obj, *grads_obj, *recompute_obj = Py_None;
    int output, channels_last = 1, compute = FT_FLOAT32;
    long long batch;
    unsigned long long seed = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!OOiLpK|iO:Program", kwlist, &PyList_Type, &nodes, &params_obj,
                                     &grads_obj, &output, &batch, &channels_last, &seed, &compute, &recompute_obj))
        return NULL;
    ft_module_state *st = ft_py_state_of_type(type);
    ft_tensor *params = ft_py_unwrap(st, params_obj, "params");
    ft_tensor *grads = params ? ft_py_unwrap(st, grads_obj, "grads") : NULL;
    if (!grads)
        return NULL;
    if (params->dtype != FT_FLOAT32 || grads->dtype != FT_FLOAT32 || params->ndim != 1 || grads->ndim != 1 ||
        params->shape[0] != grads->shape[0] || !ft_tensor_is_contiguous(params) || !ft_tensor_is_contiguous(grads))
        return PyErr_Format(PyExc_ValueError, "Program: params and grads must be flat float32 buffers of one size");
    if (!ft_device_eq(ft_op_device(params), ft_op_device(grads)))
        return PyErr_Format(PyExc_RuntimeError, "Program: params and grads must be on one device");
    Py_ssize_t n = PyList_GET_SIZE(nodes);
    if (n > 100000)
        return PyErr_Format(PyExc_ValueError, "a program of %zd nodes is too large", n);
    ft_recompute rc;
    int *segment;
    if (parse_recompute(recompute_obj, n, &rc, &segment) < 0)
        return NULL;
    ft_node *parsed = PyMem_Calloc((size_t)(n ? n : 1), sizeof *parsed);
    if (!parsed) {
        PyMem_Free(segment);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < n; i++)
        if (parse_node(st, PyList_GET_ITEM(nodes, i), &parsed[i]) < 0) {
            PyMem_Free(parsed);
            PyMem_Free(segment);
            return NULL;
        }
    int64_t *trained = PyMem_Malloc((size_t)(2 * n + 1) * sizeof *trained);
    if (!trained) {
        PyMem_Free(parsed);
        PyMem_Free(segment);
        return PyErr_NoMemory();
    }
    int ntrained = trained_offsets(parsed, (int)n, grads, trained);
    ft_program *prog;
    ft_status s;
    Py_BEGIN_ALLOW_THREADS
    s = ft_program_create(&prog, (int)n, parsed, output, batch, channels_last, seed, ft_op_device(params), params,
                          (ft_dtype)compute, &rc);
    Py_END_ALLOW_THREADS
    PyMem_Free(parsed);
    PyMem_Free(segment);
    program_object *self = s == FT_OK ? (program_object *)type->tp_alloc(type, 0) : NULL;
    if (!self) {
        PyMem_Free(trained);
        if (s == FT_OK)
            ft_program_destroy(prog);
        return s == FT_OK ? NULL : ft_py_raise(s);
    }
    self->trained = trained;
    self->ntrained = ntrained;
    self->prog = prog;
    self->last_grad_norm = NAN;
    self->keep = Py_BuildValue("(OOO)", nodes, params_obj, grads_obj);
    if (!self->keep) {
        Py_DECREF(self);
        return NULL;
    }
    self->params = *params;
    self->grads = *grads;
    return (PyObject *)self;
}

static int program_traverse(PyObject *self, visitproc visit, void *arg) {
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(((program_object *)self)->keep);
    return 0;
}

static int program_clear(PyObject *self) {
    Py_CLEAR(((program_object *)self)->keep);
    return 0;
}

static void program_dealloc(PyObject *self) {
    PyTypeObject *type = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    ft_program_destroy(((program_object *)self)->prog);
    if (((program_object *)self)->nccl)
        ft_cuda()->nccl_destroy(((program_object *)self)->nccl);
    ft_reducer_destroy(((program_object *)self)->reducer);
    PyMem_Free(((program_object *)self)->trained);
    program_clear(self);
    type->tp_free(self);
    Py_DECREF(type);
}

/* A batch's inputs x (or targets y: `name`), a tensor or a tuple of one for
 * each of `want` nodes, into out (borrowed from their tensors); -1 with
 * TypeError. */
static int unwrap_parts(PyObject *self, PyObject *obj, int want, const char *name, ft_tensor *out) {
    ft_module_state *st = ft_py_state_of_type(Py_TYPE(self));
    Py_ssize_t got = PyTuple_Check(obj) ? PyTuple_GET_SIZE(obj) : 1;
    if (got != want) {
        PyErr_Format(PyExc_TypeError, "the program's %s %d %s: give %s as %s, got %s%zd", *name == 'x' ? "forward takes"
                     : "loss reads", want, *name == 'x' ? "input(s)" : "targets", name,
                     want > 1 ? "a tuple of as many tensors" : "one tensor", PyTuple_Check(obj) ? "a tuple of " : "",
                     got);
        return -1;
    }
    for (int j = 0; j < want; j++) {
        const ft_tensor *t = ft_py_unwrap(st, PyTuple_Check(obj) ? PyTuple_GET_ITEM(obj, j) : obj, name);
        if (!t)
            return -1;
        out[j] = *t;
    }
    return 0;
}

static int unwrap_x(PyObject *self, PyObject *xo, ft_tensor *xs) {
    return unwrap_parts(self, xo, ft_program_num_inputs(((program_object *)self)->prog), "x", xs);
}

/* 0, or -1 with TypeError for a program of several inputs or targets, which
 * a Loader's batches of (images or features, targets) cannot feed. */
static int loader_fits(PyObject *self) {
    const ft_program *prog = ((program_object *)self)->prog;
    int n = ft_program_num_inputs(prog), t = ft_program_num_targets(prog);
    if (n > 1)
        PyErr_Format(PyExc_TypeError, "the program's forward takes %d inputs, but a fasttrain Loader's batches are "
                     "(x, y): give (x1, ..., y) arrays or an iterable of (x1, ..., y) batches", n);
    else if (t > 1)
        PyErr_Format(PyExc_TypeError, "the program's loss reads %d targets, but a fasttrain Loader's batches are "
                     "(x, y): give (x, (y1, ..., y%d)) arrays or an iterable of such batches", t, t);
    return n > 1 || t > 1 ? -1 : 0;
}

/* _check_loader(): None, or TypeError where a Loader cannot feed the program (loader_fits). */
/* _move_weight(node, bias, tensor): the node reads its weight (bias) from
 * tensor, the parameter's new place (ft_program_move_weight); the caller's
 * node dict holds the tensor. */
static PyObject *program_move_weight(PyObject *self, PyObject *args) {
    int node, bias;
    PyObject *obj;
    if (!PyArg_ParseTuple(args, "ipO", &node, &bias, &obj))
        return NULL;
    ft_tensor *w = ft_py_unwrap(ft_py_state_of_type(Py_TYPE(self)), obj, "tensor");
    if (!w)
        return NULL;
    ft_status s = ft_program_move_weight(((program_object *)self)->prog, node, bias, w);
    return s == FT_OK ? Py_NewRef(Py_None) : ft_py_raise(s);
}

static PyObject *program_check_loader(PyObject *self, PyObject *unused) {
    (void)unused;
    return loader_fits(self) < 0 ? NULL : Py_NewRef(Py_None);
}

/* x as unwrap_x and y as unwrap_parts into ys (*y NULL for None: no
 * targets), or -1 with TypeError. */
static int unwrap_xy(PyObject *self, PyObject *xo, PyObject *yo, ft_tensor *xs, ft_tensor *ys, const ft_tensor **y) {
    if (unwrap_x(self, xo, xs) < 0)
        return -1;
    int want = ft_program_num_targets(((program_object *)self)->prog);
    *y = yo == Py_None ? NULL : ys;
    return yo == Py_None ? 0 : unwrap_parts(self, yo, want > 1 ? want : 1, "y", ys);
}

/* ---- the step ---- */

typedef struct {
    double max_grad_norm;
    bool skip_nonfinite;
    const ft_tensor *rank_grads; /* a distributed program's flat gradients, averaged over the ranks; or NULL */
    void *nccl;                  /* their communicator when they are on a CUDA device */
    ft_reducer *reducer;         /* or the reducer that sums them during the backward on the CPU */
    loss_scaler *scaler;         /* or NULL */
} step_options;

static void set_program_options(step_options *o, program_object *po) {
    o->rank_grads = po->distributed ? &po->grads : NULL;
    o->nccl = po->nccl;
    o->reducer = po->reducer;
    o->scaler = po->scaler.scale > 0 ? &po->scaler : NULL;
}

/* A step of a scaling program ran (overflowed: skipped) with the scale,
 * which stays within the normal floats, where 1 / scale is one too. */
static void scaler_update(loss_scaler *ls, bool overflowed) {
    if (overflowed) {
        ls->scale = fmax(ls->scale * ls->backoff, 0x1p-126);
        ls->good = 0;
    } else if (++ls->good == ls->interval) {
        ls->scale = fmin(ls->scale * ls->growth, 0x1p127);
        ls->good = 0;
    }
}

/* The gradients and the loss of every rank's batch averaged in place, so
 * that each rank's update is the one of all their batches together (as
 * DistributedDataParallel's). Every rank calls it once per step, before it
 * looks at the loss, so that all of them take the same decision on it. On
 * the CPU the reducer has summed the gradients already. */
static ft_status average_over_ranks(const ft_tensor *grads, void *nccl, double *loss) {
    if (nccl)
        FT_TRY(ft_cuda()->nccl_allreduce_sum_f32(nccl, (float *)ft_tensor_data(grads), grads->shape[0],
                                                  ft_op_device(grads).index));
    FT_TRY(ft_dist_allreduce_sum_f64(loss, 1));
    *loss /= ft_dist_world_size();
    return ft_broadcast_to(grads, grads, 1.0 / ft_dist_world_size(), false); /* in place: a scaling */
}

/* The outcome of a step: its loss, whether it was skipped, its tally (the
 * training loss and accuracy's sums), and the gradient norm (NaN unless
 * clipping or nan_policy='skip' computed it). */
typedef struct {
    double loss, grad_norm;
    ft_tally tally;
    bool skipped;
} step_result;

/* (loss, weight, correct, labelled): a tally as Python sums it (see ft_tally). */
static PyObject *tally_tuple(const ft_tally *t) {
    return Py_BuildValue("(ddLL)", t->loss, t->weight, (long long)t->correct, (long long)t->labelled);
}

static void tally_add(ft_tally *sum, const ft_tally *t) {
    *sum = (ft_tally){sum->loss + t->loss, sum->weight + t->weight, sum->correct + t->correct,
                      sum->labelled + t->labelled};
}

/* A step whose loss or gradients are not finite (on any rank), skipped:
 * the batch-norm statistics and dropout stream its forward moved are put back, and a scaling
 * program backs off. */
static ft_status skip_step(ft_program *prog, loss_scaler *ls, step_result *r) {
    FT_TRY(ft_program_undo(prog));
    if (ls)
        scaler_update(ls, true);
    r->skipped = true;
    return FT_OK;
}

/* backward + the optimizer update, without the GIL. r->skipped is set when
 * a step with a non-finite loss or gradient was skipped instead of refused;
 * either way the model is left as it was. */
static ft_status train_step(ft_program *prog, ft_optimizer *opt, const ft_tensor *x, const ft_tensor *y,
                            const step_options *o, step_result *r) {
    *r = (step_result){.grad_norm = NAN};
    if (o->rank_grads) {
        /* Every rank takes the step or none does: a rank that refused its
         * batch alone would leave the others waiting in the step's sums, or
         * (its exception caught) pair its next step's sums with theirs. */
        ft_status own = ft_program_check_batch(prog, x, y);
        double refused = own != FT_OK;
        ft_error kept;
        ft_error_keep(&kept, own);
        FT_TRY(ft_dist_allreduce_sum_f64(&refused, 1));
        if (own != FT_OK)
            return ft_error_first(&kept, 1);
        if (refused > 0)
            return ft_fail(FT_ERR_RUNTIME, "train_step: %.0f other rank(s) refused their batch (see their error); no "
                                           "rank took this step",
                           refused);
    }
    if (o->reducer)
        ft_reducer_begin(o->reducer);
    loss_scaler *ls = o->scaler;
    ft_status b = ft_program_set_loss_scale(prog, ls ? (float)ls->scale : 1.0f);
    if (b == FT_OK)
        b = ft_program_backward(prog, x, y, false, &r->loss, &r->tally);
    (void)ft_program_set_loss_scale(prog, 1.0f); /* 1 is always taken */
    if (o->reducer) { /* even after a failed backward: leave no sum it started pending */
        ft_status f = ft_reducer_finish(o->reducer);
        b = b == FT_OK ? f : b;
    }
    FT_TRY(b);
    if (o->rank_grads) {
        FT_TRY(average_over_ranks(o->rank_grads, o->nccl, &r->loss));
        /* the mean of the ranks' means, weighing each rank's samples alike (DistributedDataParallel's) */
        r->tally.weight = (double)x->shape[0];
        r->tally.loss = r->loss * r->tally.weight;
    }
    if (!isfinite(r->loss)) { /* a rank whose own loss was finite has not put its statistics back */
        if (o->skip_nonfinite || ls)
            return skip_step(prog, ls, r);
        FT_TRY(ft_program_undo(prog));
        return ft_fail(FT_ERR_VALUE, "the loss is %g: no update was applied (pass nan_policy='skip' to skip such "
                                     "steps, or lower the learning rate)",
                       isnan(r->loss) ? NAN : r->loss); /* "nan", not the sign bit's "-nan" */
    }
    /* The optimizer computes the gradient norm first and refuses a
     * non-finite one, leaving params and state unchanged: a finite loss does
     * not make finite gradients (a oneDNN ReLU post-op turns NaN into 0 in
     * the forward, not in the backward). */
    ft_status s = ft_optimizer_step(opt, ls ? (float)(1.0 / ls->scale) : 1.0f, o->max_grad_norm, &r->grad_norm);
    if (s == FT_OK) {
        if (ls)
            scaler_update(ls, false);
        const ft_tensor *low = ft_program_low_params(prog);
        if (low && ft_op_device(low).type != FT_DEV_CPU) /* the update did not write the copy: convert again */
            ft_program_params_changed(prog);
        return FT_OK;
    }
    if ((o->skip_nonfinite || ls) && !isfinite(r->grad_norm))
        return skip_step(prog, ls, r);
    FT_TRY(ft_program_undo(prog));
    return s;
}

/* The C optimizer of opt_obj, synchronised with its param_groups, each
 * segment's gradient pointed at the matching place of the flat gradient
 * buffer; a parameter the program computes no gradient for (frozen, or
 * unused) gets none and is skipped, as torch.optim skips a None .grad. In
 * mixed precision on the CPU its update also writes the program's
 * low-precision copy of the params (ft_optimizer_set_copies), until
 * release_optimizer. Needs the GIL. */
static ft_optimizer *program_optimizer(program_object *self, PyObject *opt_obj) {
    ft_optimizer *opt = ft_py_optimizer_of(opt_obj);
    if (!opt)
        return NULL;
    int n = ft_optimizer_num_segments(opt);
    const ft_tensor *low = ft_program_low_params(self->prog);
    bool copies = low && ft_op_device(low).type == FT_DEV_CPU;
    const float **grads = PyMem_Malloc((size_t)(n ? n : 1) * sizeof *grads);
    void **to = copies ? PyMem_Malloc((size_t)(n ? n : 1) * sizeof *to) : NULL;
    if (!grads || (copies && !to)) {
        PyMem_Free(grads);
        PyMem_Free(to);
        PyErr_NoMemory();
        return NULL;
    }
    const float *p0 = (const float *)ft_tensor_data(&self->params), *g0 = (const float *)ft_tensor_data(&self->grads);
    int64_t total = self->params.shape[0];
    for (int i = 0; i < n; i++) {
        const ft_optim_segment *seg = ft_optimizer_segment(opt, i);
        int64_t at = seg->param - p0;
        if (at < 0 || at + seg->numel > total) {
            PyMem_Free(grads);
            PyMem_Free(to);
            PyErr_SetString(PyExc_ValueError, "the optimizer holds a parameter that is not in this model's flat "
                                              "buffer (an optimizer of another model?)");
            return NULL;
        }
        bool trained = bsearch(&at, self->trained, (size_t)self->ntrained, sizeof at, compare_offsets) != NULL;
        grads[i] = trained ? g0 + at : NULL;
        if (to)
            to[i] = (char *)ft_tensor_data(low) + at * (int64_t)ft_dtype_get(low->dtype)->itemsize;
    }
    ft_status s = ft_optimizer_set_grads(opt, grads);
    if (s == FT_OK && to)
        s = ft_optimizer_set_copies(opt, low->dtype, to);
    PyMem_Free(grads);
    PyMem_Free(to);
    return s == FT_OK ? opt : (ft_py_raise(s), NULL);
}

/* Ends what program_optimizer began: the optimizer may outlive the program
 * (or step on its own), and must not write the program's copy then. */
static void release_optimizer(ft_optimizer *opt) { ft_optimizer_set_copies(opt, FT_FLOAT32, NULL); }

/* The program of a call from Python: Python code may have written the
 * params since the last call, so a mixed-precision program converts them
 * again before it reads them. */
static ft_program *entered(PyObject *self) {
    ft_program *prog = ((program_object *)self)->prog;
    ft_program_params_changed(prog);
    return prog;
}

static int parse_step_options(PyObject *max_norm, const char *policy, step_options *o) {
    o->max_grad_norm = max_norm == Py_None ? 0.0 : PyFloat_AsDouble(max_norm);
    if (o->max_grad_norm == -1.0 && PyErr_Occurred())
        return -1;
    if (!(o->max_grad_norm >= 0)) {
        PyErr_SetString(PyExc_ValueError, "clip_grad_norm must be positive");
        return -1;
    }
    if (strcmp(policy, "raise") && strcmp(policy, "skip")) {
        PyErr_Format(PyExc_ValueError, "nan_policy must be 'raise' or 'skip', got '%s'", policy);
        return -1;
    }
    o->skip_nonfinite = strcmp(policy, "skip") == 0;
    return 0;
}

static PyObject *run_train_step(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"x", "y", "optimizer", "clip_grad_norm", "nan_policy", NULL};
    PyObject *xo, *yo, *opt_obj, *max_norm = Py_None;
    const char *policy = "raise";
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOO|Os:train_step", kwlist, &xo, &yo, &opt_obj, &max_norm,
                                     &policy))
        return NULL;
    ft_tensor x[FT_PROGRAM_MAX_INPUTS], ys[FT_PROGRAM_MAX_TARGETS];
    const ft_tensor *y;
    step_options o;
    if (unwrap_xy(self, xo, yo, x, ys, &y) < 0 || parse_step_options(max_norm, policy, &o) < 0)
        return NULL;
    set_program_options(&o, (program_object *)self);
    ft_optimizer *opt = program_optimizer((program_object *)self, opt_obj);
    if (!opt)
        return NULL;
    step_result r;
    ft_status s;
    Py_BEGIN_ALLOW_THREADS
    s = train_step(entered(self), opt, x, y, &o, &r);
    Py_END_ALLOW_THREADS
    release_optimizer(opt);
    if (s != FT_OK)
        return ft_py_raise(s);
    ((program_object *)self)->last_grad_norm = r.grad_norm;
    return Py_BuildValue("(dON)", r.loss, r.skipped ? Py_True : Py_False, tally_tuple(&r.tally));
}

/* backward(x, y, accumulate=False) -> loss: the gradients into the flat
 * buffer (each parameter's .grad), written or added to, without an
 * optimizer update. */
static PyObject *run_backward(PyObject *self, PyObject *args) {
    PyObject *xo, *yo;
    ft_tensor x[FT_PROGRAM_MAX_INPUTS], ys[FT_PROGRAM_MAX_TARGETS];
    const ft_tensor *y;
    int accumulate = 0;
    if (!PyArg_ParseTuple(args, "OO|p:backward", &xo, &yo, &accumulate) || unwrap_xy(self, xo, yo, x, ys, &y) < 0)
        return NULL;
    double loss = 0;
    ft_status s;
    Py_BEGIN_ALLOW_THREADS
    s = ft_program_backward(entered(self), x, y, accumulate, &loss, NULL);
    Py_END_ALLOW_THREADS
    if (s == FT_OK && !isfinite(loss)) /* as train_step refuses it: the program left no trace of the batch */
        return PyErr_Format(PyExc_ValueError, "backward: the loss is %s: no gradient of this batch was kept",
                            isnan(loss) ? "nan" : loss > 0 ? "inf" : "-inf");
    return s == FT_OK ? PyFloat_FromDouble(loss) : ft_py_raise(s);
}

/* _set_distributed(bucket_bytes): steps average gradients and loss over the
 * ranks, on the CPU in buckets of bucket_bytes summed during the backward. */
static PyObject *program_set_distributed(PyObject *self, PyObject *arg) {
    long long bucket_bytes = PyLong_AsLongLong(arg);
    if (bucket_bytes == -1 && PyErr_Occurred())
        return NULL;
    program_object *po = (program_object *)self;
    if (po->distributed)
        return PyErr_Format(PyExc_RuntimeError, "the program is distributed already");
    if (!ft_dist_ready())
        return PyErr_Format(PyExc_RuntimeError, "a distributed program needs ft.distributed.init() first");
    ft_device dev = ft_op_device(&po->grads);
    if (dev.type == FT_DEV_CPU) {
        ft_status s = ft_reducer_create(&po->reducer, po->prog, &po->grads, bucket_bytes);
        if (s != FT_OK)
            return ft_py_raise(s);
    } else { /* rank 0's NCCL id reaches every rank through MPI */
        char id[FT_NCCL_ID_BYTES];
        ft_status s;
        Py_BEGIN_ALLOW_THREADS
        s = ft_dist_rank() == 0 ? ft_cuda()->nccl_unique_id(id) : FT_OK;
        if (s == FT_OK)
            s = ft_dist_bcast(id, sizeof id, 0);
        if (s == FT_OK)
            s = ft_cuda()->nccl_init(&po->nccl, id, ft_dist_rank(), ft_dist_world_size(), dev.index);
        Py_END_ALLOW_THREADS
        if (s != FT_OK)
            return ft_py_raise(s);
    }
    po->distributed = true;
    ft_program_set_rank(po->prog, ft_dist_rank());
    Py_RETURN_NONE;
}

static PyObject *program_get_gradient_buckets(PyObject *self, void *closure) {
    (void)closure;
    const ft_reducer *r = ((program_object *)self)->reducer;
    if (!r)
        Py_RETURN_NONE;
    return Py_BuildValue("(iid)", ft_reducer_num_buckets(r), ft_reducer_started_early(r), ft_reducer_wait_seconds(r));
}

static PyObject *run_forward(PyObject *self, PyObject *xo) {
    ft_module_state *st = ft_py_state_of_type(Py_TYPE(self));
    ft_tensor x[FT_PROGRAM_MAX_INPUTS];
    if (unwrap_x(self, xo, x) < 0)
        return NULL;
    ft_program *prog = entered(self);
    int64_t shape[FT_MAX_DIMS] = {x->ndim ? x->shape[0] : 0};
    int ndim = ft_program_output_shape(prog, shape + 1) + 1;
    ft_tensor out;
    ft_status s =
        ft_tensor_empty(&out, ndim, shape, FT_FLOAT32, ft_op_device(&((program_object *)self)->params), false);
    if (s != FT_OK)
        return ft_py_raise(s);
    Py_BEGIN_ALLOW_THREADS
    s = ft_program_forward(prog, x, &out);
    Py_END_ALLOW_THREADS
    if (s != FT_OK) {
        ft_tensor_release(&out);
        return ft_py_raise(s);
    }
    return ft_py_wrap(st, &out);
}

static PyObject *run_evaluate(PyObject *self, PyObject *args) {
    PyObject *xo, *yo;
    int tta = 0;
    ft_tensor x[FT_PROGRAM_MAX_INPUTS], ys[FT_PROGRAM_MAX_TARGETS];
    const ft_tensor *y;
    if (!PyArg_ParseTuple(args, "OO|p:evaluate", &xo, &yo, &tta) || unwrap_xy(self, xo, yo, x, ys, &y) < 0)
        return NULL;
    ft_tally tally = {0};
    ft_status s;
    Py_BEGIN_ALLOW_THREADS
    s = ft_program_evaluate(entered(self), x, y, tta, &tally);
    Py_END_ALLOW_THREADS
    return s == FT_OK ? tally_tuple(&tally) : ft_py_raise(s);
}

/* Calls callback(steps, loss, samples) with the GIL; -1 with an exception
 * set, 1 when it asked to stop (returned True), else 0. */
static int report(PyObject *callback, int64_t steps, double loss, int64_t samples) {
    PyObject *r = PyObject_CallFunction(callback, "LdL", (long long)steps, loss, (long long)samples);
    if (!r)
        return -1;
    int stop = PyObject_IsTrue(r);
    Py_DECREF(r);
    return stop;
}

/* The next batch of an epoch, for a loop that runs without the GIL (*ts
 * holds the thread state): 1 with a batch, 0 at the end of the epoch, -1
 * after a failure (*s), Ctrl-C (a Python exception) or a close() of the
 * loader (neither: ft_py_loader_end says it), noticed while waiting for data. */
static int next_batch(PyObject *loader_obj, ft_loader *l, ft_batch *b, PyThreadState **ts, ft_status *s) {
    for (;;) {
        bool done = false, timed_out = false;
        if (ft_py_loader_stopping(loader_obj))
            return -1;
        *s = ft_loader_next_wait(l, b, &done, 100, &timed_out);
        if (*s != FT_OK)
            return -1;
        if (!timed_out)
            return done ? 0 : 1;
        PyEval_RestoreThread(*ts);
        int interrupted = PyErr_CheckSignals() < 0;
        *ts = PyEval_SaveThread();
        if (interrupted)
            return -1;
    }
}

/* schedule[k][g] (a sequence of per-step sequences of the optimizer's group
 * tuples, one per parameter group) as a flat (steps, groups) array the
 * caller frees. */
static int parse_schedule(PyObject *obj, int ngroups, ft_optim_group **out, Py_ssize_t *nsteps) {
    PyObject *seq = PySequence_Fast(obj, "schedule must be a sequence of per-step parameter groups");
    if (!seq)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    ft_optim_group *groups = PyMem_Malloc((size_t)(n ? n : 1) * (size_t)(ngroups ? ngroups : 1) * sizeof *groups);
    if (!groups)
        PyErr_NoMemory();
    for (Py_ssize_t k = 0; groups && k < n; k++) {
        PyObject *row = PySequence_Fast(PySequence_Fast_GET_ITEM(seq, k), "each step's groups must be a sequence");
        if (row && PySequence_Fast_GET_SIZE(row) != ngroups)
            PyErr_Format(PyExc_ValueError, "step %zd gives %zd groups for %d parameter groups", k,
                         PySequence_Fast_GET_SIZE(row), ngroups);
        for (int g = 0; row && !PyErr_Occurred() && g < ngroups; g++)
            ft_py_parse_optim_group(PySequence_Fast_GET_ITEM(row, g), &groups[k * ngroups + g]);
        Py_XDECREF(row);
        if (PyErr_Occurred()) {
            PyMem_Free(groups);
            groups = NULL;
        }
    }
    Py_DECREF(seq);
    if (!groups)
        return -1;
    *out = groups;
    *nsteps = n;
    return 0;
}

/* Calls step_callback(steps, loss, grad_norm or None, the tally so far) with the GIL; as report. */
static int report_step(PyObject *callback, int64_t steps, const step_result *r, const ft_tally *tally) {
    PyObject *norm = isnan(r->grad_norm) ? Py_NewRef(Py_None) : PyFloat_FromDouble(r->grad_norm);
    PyObject *t = norm ? tally_tuple(tally) : NULL;
    PyObject *res = t ? PyObject_CallFunction(callback, "LdNN", (long long)steps, r->loss, norm, t) : NULL;
    if (!t)
        Py_XDECREF(norm);
    if (!res)
        return -1;
    int stop = PyObject_IsTrue(res);
    Py_DECREF(res);
    return stop;
}

/* fit_epoch(loader, optimizer, schedule=None, callback=None, interval=0.25, clip_grad_norm=None,
 * nan_policy="raise", step_callback=None, every=0, first_step=0, ema=None, ema_decay=0) -> (tally, samples, steps,
 * skipped, stopped):
 * one epoch of a fasttrain loader in C. Python runs only for the progress callback, every `interval`
 * seconds, and for step_callback(steps, loss, grad_norm, tally so far) after every step whose number counted from
 * first_step + 1 is a multiple of `every` (either stops the epoch by returning True); schedule[k] gives every
 * parameter group's hyperparameters at step k (the learning rate and whatever else a scheduler moves, such as
 * OneCycleLR's momentum or betas), as the tuples of Optimizer._group_tuple. The tally (tally_tuple) sums the steps
 * not skipped, the accuracy's counts from their training-mode predictions. ema, a _C.EMA, moves its averages
 * towards the params with ema_decay after every step. */
static PyObject *run_fit_epoch(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"loader", "optimizer", "schedule", "callback", "interval", "clip_grad_norm",
                             "nan_policy", "step_callback", "every", "first_step", "ema", "ema_decay", NULL};
    PyObject *loader_obj, *opt_obj, *schedule_obj = Py_None, *callback = Py_None, *max_norm = Py_None;
    PyObject *step_callback = Py_None, *ema_obj = Py_None;
    double interval = 0.25, ema_decay = 0;
    const char *policy = "raise";
    long long every = 0, first_step = 0;
    program_object *po = (program_object *)self;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO|OOdOsOLLOd:fit_epoch", kwlist, &loader_obj, &opt_obj,
                                     &schedule_obj, &callback, &interval, &max_norm, &policy, &step_callback, &every,
                                     &first_step, &ema_obj, &ema_decay))
        return NULL;
    if (every < 0 || first_step < 0)
        return PyErr_Format(PyExc_ValueError, "fit_epoch: every and first_step must be >= 0");
    if (loader_fits(self) < 0)
        return NULL;
    step_options o;
    set_program_options(&o, po);
    if (parse_step_options(max_norm, policy, &o) < 0)
        return NULL;
    ft_ema *ema = NULL;
    if (ema_obj != Py_None && !(ema = ft_py_ema_begin(ema_obj)))
        return NULL;
    ft_optimizer *opt = program_optimizer(po, opt_obj);
    int ngroups = opt ? ft_optimizer_num_groups(opt) : 0;
    Py_ssize_t nscheduled = 0;
    ft_optim_group *schedule = NULL;
    bool scheduled = opt && (schedule_obj == Py_None || parse_schedule(schedule_obj, ngroups, &schedule,
                                                                        &nscheduled) == 0);
    ft_loader *l = scheduled ? ft_py_loader_begin(loader_obj) : NULL;
    if (!l) {
        if (opt)
            release_optimizer(opt);
        PyMem_Free(schedule);
        if (ema)
            ft_py_ema_end(ema_obj);
        return NULL;
    }
    entered(self);
    po->fit_calls++; /* from here the call runs steps: fit_record says how many */
    po->fit_steps = po->fit_skipped = 0;
    po->fit_tally = (ft_tally){0};
    Py_INCREF(loader_obj); /* the C loader lives as long as this object */
    double last_report = omp_get_wtime();
    ft_tally tally = {0};
    int64_t samples = 0, steps = 0, skipped_steps = 0;
    step_result r = {.grad_norm = po->last_grad_norm};
    ft_status s = FT_OK;
    int stop = 0;
    PyThreadState *ts = PyEval_SaveThread();
    for (;;) {
        ft_batch b;
        int got = next_batch(loader_obj, l, &b, &ts, &s);
        if (got <= 0) {
            stop = got < 0 && s == FT_OK ? -1 : 0;
            break;
        }
        for (int g = 0; s == FT_OK && steps < nscheduled && g < ngroups; g++)
            s = ft_optimizer_set_group(opt, g, &schedule[steps * ngroups + g]);
        if (s == FT_OK)
            s = train_step(po->prog, opt, &b.images, &b.labels, &o, &r);
        int64_t n = b.size;
        ft_loader_release(l, &b);
        if (s == FT_OK && ema) /* after every step, as a Python loop's ema.update() after optimizer.step() */
            s = ft_ema_update(ema, ema_decay);
        if (s != FT_OK)
            break;
        if (!r.skipped) /* a skipped step's loss is not finite: it says nothing about the epoch */
            tally_add(&tally, &r.tally);
        samples += n;
        steps++;
        skipped_steps += r.skipped;
        double now = omp_get_wtime();
        bool step_due = step_callback != Py_None && every > 0 && (first_step + steps) % every == 0;
        bool report_due = now - last_report >= interval;
        if (step_due || report_due) {
            PyEval_RestoreThread(ts);
            po->fit_steps = steps, po->fit_skipped = skipped_steps, po->fit_tally = tally;
            po->last_grad_norm = r.grad_norm;
            stop = PyErr_CheckSignals() < 0 ? -1 : 0;
            if (!stop && step_due)
                stop = report_step(step_callback, steps, &r, &tally);
            if (!stop && report_due && callback != Py_None)
                stop = report(callback, steps, r.loss, samples);
            if (report_due)
                last_report = now;
            entered(self); /* a callback may have written the params */
            ts = PyEval_SaveThread();
            if (stop)
                break;
        }
    }
    PyEval_RestoreThread(ts);
    po->fit_steps = steps, po->fit_skipped = skipped_steps, po->fit_tally = tally;
    po->last_grad_norm = r.grad_norm;
    if (ema)
        ft_py_ema_end(ema_obj);
    if (!stop && s == FT_OK && PyErr_CheckSignals() < 0) /* Ctrl-C during the last steps: raised with their count */
        stop = -1;
    release_optimizer(opt);
    int closed = ft_py_loader_end(loader_obj) < 0;
    Py_DECREF(loader_obj);
    PyMem_Free(schedule);
    if (stop < 0 || closed || s != FT_OK) {
        if (!PyErr_Occurred()) { /* say where in the epoch it happened */
            char message[1024];
            snprintf(message, sizeof message, "%s", ft_last_error());
            ft_py_raise(ft_fail(s, "step %lld of the epoch: %s", (long long)steps + 1, message));
        }
        return NULL;
    }
    return Py_BuildValue("(NLLLO)", tally_tuple(&tally), (long long)samples, (long long)steps,
                         (long long)skipped_steps, stop ? Py_True : Py_False);
}

/* eval_epoch(loader, tta_flip=False) -> (tally, samples), in eval mode, in C. */
static PyObject *run_eval_epoch(PyObject *self, PyObject *args) {
    PyObject *loader_obj;
    int tta = 0;
    if (!PyArg_ParseTuple(args, "O|p:eval_epoch", &loader_obj, &tta) || loader_fits(self) < 0)
        return NULL;
    ft_loader *l = ft_py_loader_begin(loader_obj);
    if (!l)
        return NULL;
    ft_program *prog = entered(self);
    Py_INCREF(loader_obj);
    ft_tally tally = {0};
    int64_t count = 0, left = ft_loader_unique_samples(l);
    ft_status s = FT_OK;
    int stop = 0;
    PyThreadState *ts = PyEval_SaveThread();
    for (;;) {
        ft_batch b;
        int got = next_batch(loader_obj, l, &b, &ts, &s);
        if (got <= 0) {
            stop = got < 0 && s == FT_OK;
            break;
        }
        /* the samples a distributed loader repeats at its end to even out the ranks count once, on their rank */
        int64_t n = b.size < left ? b.size : left;
        ft_tensor x = b.images, y = b.labels;
        x.shape[0] = y.shape[0] = n;
        if (n > 0)
            s = ft_program_evaluate(prog, &x, &y, tta, &tally);
        count += n;
        left -= n;
        ft_loader_release(l, &b);
        if (s != FT_OK)
            break;
    }
    PyEval_RestoreThread(ts);
    int closed = ft_py_loader_end(loader_obj) < 0;
    Py_DECREF(loader_obj);
    if (stop || closed)
        return NULL;
    return s == FT_OK ? Py_BuildValue("(NL)", tally_tuple(&tally), (long long)count) : ft_py_raise(s);
}

static PyObject *program_get_dropout_state(PyObject *self, PyObject *unused) {
    (void)unused;
    uint64_t seed, offset;
    ft_program_dropout_state(((program_object *)self)->prog, &seed, &offset);
    return Py_BuildValue("(KK)", (unsigned long long)seed, (unsigned long long)offset);
}

static PyObject *program_set_dropout_state(PyObject *self, PyObject *args) {
    unsigned long long seed, offset;
    if (!PyArg_ParseTuple(args, "KK:set_dropout_state", &seed, &offset))
        return NULL;
    ft_program_set_dropout_state(((program_object *)self)->prog, seed, offset);
    Py_RETURN_NONE;
}

static PyObject *program_memory(PyObject *self, PyObject *unused) {
    (void)unused;
    int64_t train, eval, copy;
    ft_program_memory(((program_object *)self)->prog, &train, &eval, &copy);
    return Py_BuildValue("(LLL)", (long long)train, (long long)eval, (long long)copy);
}

/* A list of one item per node, item(prog, i) each (a new reference, or NULL
 * with an exception set). */
static PyObject *per_node(PyObject *self, PyObject *(*item)(const ft_program *prog, int i)) {
    ft_program *prog = ((program_object *)self)->prog;
    Py_ssize_t n = PyList_GET_SIZE(PyTuple_GET_ITEM(((program_object *)self)->keep, 0));
    PyObject *list = PyList_New(n);
    for (Py_ssize_t i = 0; list && i < n; i++) {
        PyObject *x = item(prog, (int)i);
        if (!x) {
            Py_CLEAR(list);
            break;
        }
        PyList_SET_ITEM(list, i, x);
    }
    return list;
}

static PyObject *node_bytes(const ft_program *prog, int i) {
    int64_t b[3];
    ft_program_node_bytes(prog, i, b);
    return Py_BuildValue("(LLL)", (long long)b[0], (long long)b[1], (long long)b[2]);
}

static PyObject *node_dtype(const ft_program *prog, int i) {
    return PyUnicode_FromString(ft_dtype_get(ft_program_node_dtype(prog, i))->name);
}

static PyObject *node_seconds(const ft_program *prog, int i) {
    const double *sec = ft_program_seconds(prog);
    return Py_BuildValue("(dd)", sec[2 * i], sec[2 * i + 1]);
}

static PyObject *node_recomputed(const ft_program *prog, int i) {
    return PyBool_FromLong(ft_program_recomputed(prog, i));
}

static PyObject *program_node_bytes(PyObject *self, PyObject *unused) { return per_node(self, node_bytes); }

static PyObject *program_recomputed(PyObject *self, PyObject *unused) { return per_node(self, node_recomputed); }

static PyObject *program_sums_loss(PyObject *self, PyObject *unused) {
    (void)unused;
    return PyBool_FromLong(ft_program_sums_loss(((program_object *)self)->prog));
}

static PyObject *program_node_dtypes(PyObject *self, PyObject *unused) { return per_node(self, node_dtype); }

static PyObject *program_profile(PyObject *self, PyObject *unused) { return per_node(self, node_seconds); }

/* Claims the program for a call that runs without the GIL: a call from
 * another thread meanwhile would share its arenas and batch buffers (each
 * returning the other's results), so it is refused. A callback of the call,
 * on its own thread between steps, may still call it (a step callback that
 * predicts). 1: claimed, 0: already this thread's, -1: refused. */
static int claim(PyObject *self) {
    program_object *po = (program_object *)self;
    unsigned long me = PyThread_get_thread_ident();
    if (po->busy && po->owner != me) {
        PyErr_SetString(PyExc_RuntimeError, "the program is running a call in another thread (train_step, predict, "
                                            "evaluate and fit share its memory): call it from one thread at a "
                                            "time, or compile a program for each thread");
        return -1;
    }
    if (po->busy)
        return 0;
    po->busy = true, po->owner = me;
    return 1;
}

static PyObject *claimed(PyObject *self, int claim_result, PyObject *result) {
    if (claim_result == 1)
        ((program_object *)self)->busy = false;
    return result;
}

/* _check_free(): None, or RuntimeError while another thread runs a call (ft.save and ft.load read and write what
 * that call changes). */
static PyObject *program_check_free(PyObject *self, PyObject *unused) {
    (void)unused;
    int c = claim(self);
    return c < 0 ? NULL : claimed(self, c, Py_NewRef(Py_None));
}

static PyObject *program_train_step(PyObject *self, PyObject *args, PyObject *kwargs) {
    int c = claim(self);
    return c < 0 ? NULL : claimed(self, c, run_train_step(self, args, kwargs));
}

static PyObject *program_backward(PyObject *self, PyObject *args) {
    int c = claim(self);
    return c < 0 ? NULL : claimed(self, c, run_backward(self, args));
}

static PyObject *program_forward(PyObject *self, PyObject *xo) {
    int c = claim(self);
    return c < 0 ? NULL : claimed(self, c, run_forward(self, xo));
}

static PyObject *program_evaluate(PyObject *self, PyObject *args) {
    int c = claim(self);
    return c < 0 ? NULL : claimed(self, c, run_evaluate(self, args));
}

static PyObject *program_fit_epoch(PyObject *self, PyObject *args, PyObject *kwargs) {
    int c = claim(self);
    return c < 0 ? NULL : claimed(self, c, run_fit_epoch(self, args, kwargs));
}

static PyObject *program_eval_epoch(PyObject *self, PyObject *args) {
    int c = claim(self);
    return c < 0 ? NULL : claimed(self, c, run_eval_epoch(self, args));
}

static PyMethodDef program_methods[] = {
    {"profile", program_profile, METH_NOARGS, "[(forward seconds, backward seconds)] per node since creation"},
    {"node_dtypes", program_node_dtypes, METH_NOARGS, "node_dtypes() -> [each node's output dtype name]"},
    {"train_step", (PyCFunction)(void (*)(void))program_train_step, METH_VARARGS | METH_KEYWORDS,
     "train_step(x, y, optimizer, clip_grad_norm=None, nan_policy='raise') -> (loss, skipped, (loss * weight, weight, "
     "correct, labelled))"},
    {"forward", program_forward, METH_O, "forward(x) -> logits, in eval mode"},
    {"backward", program_backward, METH_VARARGS,
     "backward(x, y, accumulate=False) -> loss; the gradients written (or added to), without an update"},
    {"evaluate", program_evaluate, METH_VARARGS,
     "evaluate(x, y, tta_flip=False) -> (loss * weight, weight, correct, labelled)"},
    {"memory", program_memory, METH_NOARGS,
     "(training arena bytes, evaluation arena bytes, low-precision weight copy bytes)"},
    {"node_bytes", program_node_bytes, METH_NOARGS,
     "node_bytes() -> [(output, saved, gradient) bytes of each node in the training arena]"},
    {"recomputed", program_recomputed, METH_NOARGS,
     "recomputed() -> [whether each node's output is recomputed in the backward instead of kept]"},
    {"sums_loss", program_sums_loss, METH_NOARGS, "sums_loss() -> whether the loss sums over the batch"},
    {"get_dropout_state", program_get_dropout_state, METH_NOARGS, "(seed, offset) of the next dropout mask"},
    {"set_dropout_state", program_set_dropout_state, METH_VARARGS, "set_dropout_state(seed, offset)"},
    {"_set_distributed", program_set_distributed, METH_O, NULL},
    {"_check_loader", program_check_loader, METH_NOARGS, NULL},
    {"_check_free", program_check_free, METH_NOARGS, NULL},
    {"_move_weight", program_move_weight, METH_VARARGS, NULL},
    {"fit_epoch", (PyCFunction)(void (*)(void))program_fit_epoch, METH_VARARGS | METH_KEYWORDS,
     "fit_epoch(loader, optimizer, schedule=None, callback=None, interval=0.25, clip_grad_norm=None, "
     "nan_policy='raise', step_callback=None, every=0, first_step=0, ema=None, ema_decay=0) -> (tally, samples, "
     "steps, skipped, stopped): the tally (as evaluate's) of the steps not skipped; a _C.EMA updated after each step"},
    {"eval_epoch", program_eval_epoch, METH_VARARGS,
     "eval_epoch(loader, tta_flip=False) -> (tally, samples): the tally as evaluate's"},
    {NULL, NULL, 0, NULL},
};

static PyObject *program_get_last_grad_norm(PyObject *self, void *closure) {
    (void)closure;
    double norm = ((program_object *)self)->last_grad_norm;
    return isnan(norm) ? Py_NewRef(Py_None) : PyFloat_FromDouble(norm);
}

static PyObject *program_get_fit_record(PyObject *self, void *closure) {
    (void)closure;
    const program_object *po = (const program_object *)self;
    return Py_BuildValue("(LLLN)", (long long)po->fit_calls, (long long)po->fit_steps, (long long)po->fit_skipped,
                         tally_tuple(&po->fit_tally));
}

static PyObject *program_get_loss_scaler(PyObject *self, void *closure) {
    const loss_scaler *ls = &((program_object *)self)->scaler;
    if (!(ls->scale > 0))
        Py_RETURN_NONE;
    return Py_BuildValue("(dddLL)", ls->scale, ls->growth, ls->backoff, (long long)ls->interval, (long long)ls->good);
}

static int program_set_loss_scaler(PyObject *self, PyObject *value, void *closure) {
    loss_scaler ls = {0};
    if (!value) {
        PyErr_SetString(PyExc_TypeError, "loss_scaler cannot be deleted (set None to turn it off)");
        return -1;
    }
    if (value != Py_None) {
        long long interval, good;
        if (!PyArg_ParseTuple(value, "dddLL:loss_scaler", &ls.scale, &ls.growth, &ls.backoff, &interval, &good))
            return -1;
        ls.interval = interval, ls.good = good;
        /* finite, and 1 / scale a finite float */
        if (!(ls.scale >= 0x1p-126 && ls.scale <= 0x1p127 && ls.growth >= 1 && isfinite(ls.growth) &&
              ls.backoff > 0 && ls.backoff < 1 && ls.interval >= 1 && ls.good >= 0 && ls.good < ls.interval)) {
            PyErr_SetString(PyExc_ValueError, "loss_scaler: scale in [2**-126, 2**127], growth >= 1, 0 < backoff "
                                              "< 1, interval >= 1 and 0 <= good < interval");
            return -1;
        }
    }
    ((program_object *)self)->scaler = ls;
    return 0;
}

static PyGetSetDef program_getset[] = {
    {"loss_scaler", program_get_loss_scaler, program_set_loss_scaler,
     "dynamic loss scaling: (scale, growth, backoff, interval, good steps since the last change), or None", NULL},
    {"fit_record", program_get_fit_record, NULL,
     "(calls of fit_epoch, and the steps its last call applied, skipped and tallied): what a call that raised did",
     NULL},
    {"last_grad_norm", program_get_last_grad_norm, NULL,
     "the gradient norm of the last step that computed it (with clipping or nan_policy='skip'), else None", NULL},
    {"gradient_buckets", program_get_gradient_buckets, NULL,
     "a distributed CPU program's (buckets, how many the last step started within its backward, the seconds it "
     "then waited for the sums), else None",
     NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot program_slots[] = {
    {Py_tp_getset, program_getset},
    {Py_tp_new, program_new},
    {Py_tp_dealloc, program_dealloc},
    {Py_tp_traverse, program_traverse},
    {Py_tp_clear, program_clear},
    {Py_tp_methods, program_methods},
    {Py_tp_doc, "A model compiled to a C training program."},
    {0, NULL},
};

static PyType_Spec program_spec = {
    .name = "fasttrain._C.Program",
    .basicsize = sizeof(program_object),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .slots = program_slots,
};

static const char *node_kind_name(int k) { return ft_node_kinds[k].name; }

static const char *act_name(int k) { return ft_act_name((ft_act_kind)k); }

/* PyTorch's names of the reductions a loss node does. */
static const char *reduction_name(int k) {
    static const char *names[] = {[FT_NODE_REDUCE_NONE] = "none", [FT_NODE_REDUCE_MEAN] = "mean",
                                  [FT_NODE_REDUCE_SUM] = "sum", [FT_NODE_REDUCE_BATCHMEAN] = "batchmean",
                                  [FT_NODE_REDUCE_RATIO] = "ratio"};
    return names[k];
}

int ft_py_bind_nn(PyObject *module) {
    if (ft_py_add_type(module, &program_spec) < 0 ||
        ft_py_add_enum(module, "NODE_KINDS", FT_NODE_NKINDS, node_kind_name) < 0 ||
        ft_py_add_enum(module, "ACTIVATIONS", FT_NUM_ACTS, act_name) < 0 ||
        PyModule_AddIntConstant(module, "NODE_MAX_INPUTS", FT_NODE_MAX_INPUTS) < 0)
        return -1;
    return ft_py_add_enum(module, "REDUCTIONS", FT_NODE_REDUCE_RATIO + 1, reduction_name);
}
