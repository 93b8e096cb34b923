/* Python bindings of the ops in csrc/ops/: one function of fasttrain._C per C
 * entry point, named like it without the ft_ prefix (ft_softmax_forward ->
 * _C.softmax_forward), re-exported as ft.ops.<name>.
 *
 * The convention every function here follows:
 *
 *  1. Positional arguments mirror the C entry point: first its outputs, then
 *     its inputs and saved tensors, in the C order; then its parameters,
 *     which may also be given by keyword and have defaults where the C op
 *     has an obvious one (PyTorch's).
 *  2. Each output argument is
 *       - a Tensor: the op writes into it (it may be an input itself where
 *         the C header allows: in-place ops, accumulation with accumulate=True),
 *       - None: the binding allocates it, with the dtype of the op's
 *         reference input and its memory format (a channels_last input gives
 *         a channels_last output), or
 *       - False: only for outputs the C header marks optional (may be NULL):
 *         not computed.
 *     Optional inputs (weight=, the saved inp/out of an activation, ...) are
 *     None for NULL.
 *  3. The function returns its outputs: the tensor for a single output, else
 *     a tuple in C order (None for an output passed as False).
 *  4. The GIL is released around the C call when the op touches
 *     FT_GIL_FREE_BYTES or more. A failed C call raises the exception of its
 *     status (bind/module.c: ft_py_raise) with the C message, which names the op,
 *     the argument, and the expected and actual shapes.
 *
 * The helpers below (out_arg, parse_in, parse_out, alloc_out, finish, the
 * parameter parsers) are for every family; add a family as a new section. */
#include "bind/bind.h"

#include <string.h>

#include "ops/activation.h"
#include "ops/check.h"
#include "ops/attention.h"
#include "ops/batchnorm.h"
#include "ops/conv2d.h"
#include "ops/layernorm.h"
#include "ops/linear.h"
#include "ops/dropout.h"
#include "ops/elementwise.h"
#include "ops/embedding.h"
#include "ops/groupnorm.h"
#include "ops/loss.h"
#include "ops/math.h"
#include "ops/pool.h"
#include "ops/rnn.h"
#include "ops/softmax.h"
#include "ops/upsample.h"

/* ======================= shared helpers ======================= */

/* An output argument: what the caller passed and, once resolved, the tensor. */
typedef struct {
    const char *name;
    PyObject *obj; /* the caller's tensor (borrowed) or an allocated one (owned) */
    bool owned;    /* allocated here */
    bool skip;     /* passed as False */
    ft_tensor *t;  /* NULL until resolved, and for skipped outputs */
} out_arg;

/* An input tensor, or NULL for None when `optional`. */
static int parse_in(ft_module_state *st, PyObject *obj, const char *name, bool optional, const ft_tensor **out) {
    if (obj == Py_None && optional) {
        *out = NULL;
        return 0;
    }
    *out = ft_py_unwrap(st, obj, name);
    return *out ? 0 : -1;
}

/* An output argument: a Tensor, None (allocate later) or, when `optional`, False (skip). */
static int parse_out(ft_module_state *st, PyObject *obj, const char *name, bool optional, out_arg *o) {
    *o = (out_arg){.name = name};
    if (obj == Py_None)
        return 0;
    if (obj == Py_False) {
        if (!optional) {
            PyErr_Format(PyExc_TypeError, "%s cannot be skipped (False): pass a Tensor or None", name);
            return -1;
        }
        o->skip = true;
        return 0;
    }
    o->t = ft_py_unwrap(st, obj, name);
    if (!o->t)
        return -1;
    o->obj = obj;
    return 0;
}

/* accumulate=True: every gradient output of the op adds. */
#define ALL_ACC(a) ((ft_grad_acc){(a), (a), (a)})

/* accumulate=True adds into the caller's tensors: a gradient the binding
 * allocated would add to uninitialised memory. */
static int check_accumulate(const out_arg *o, int n, bool accumulate, const char *op) {
    for (int k = 0; accumulate && k < n; k++)
        if (o[k].owned) {
            PyErr_Format(PyExc_ValueError, "%s: accumulate=True adds into the gradient tensors given; pass every "
                                           "gradient to compute (False to skip one)", op);
            return -1;
        }
    return 0;
}

static bool needs_alloc(const out_arg *o) { return !o->skip && !o->t; }

/* Allocates o (if the caller passed None) with `shape` and `dtype` on ref's
 * device (the CPU without ref), its dimensions ordered in memory like ref's
 * when `follow` and ref has the same number of dimensions (NCHW stays NCHW,
 * NHWC stays NHWC), else contiguous. */
static int alloc_layout(ft_module_state *st, out_arg *o, const ft_tensor *ref, bool follow, int ndim,
                        const int64_t *shape, ft_dtype dtype) {
    if (!needs_alloc(o))
        return 0;
    ft_tensor t;
    ft_device dev = ref ? ft_op_device(ref) : FT_CPU;
    ft_status s = ref && follow && ref->ndim == ndim ? ft_tensor_empty_like(&t, ref, ndim, shape, dtype, dev)
                                                    : ft_tensor_empty(&t, ndim, shape, dtype, dev, false);
    if (s != FT_OK) {
        ft_py_raise(s);
        return -1;
    }
    o->obj = ft_py_wrap(st, &t);
    if (!o->obj)
        return -1;
    o->owned = true;
    o->t = &((ft_tensor_object *)o->obj)->t;
    return 0;
}

/* Allocates o in ref's memory order (see alloc_layout). */
static int alloc_out(ft_module_state *st, out_arg *o, const ft_tensor *ref, int ndim, const int64_t *shape,
                     ft_dtype dtype) {
    return alloc_layout(st, o, ref, true, ndim, shape, dtype);
}

/* Allocates o contiguous, on ref's device. */
static int alloc_on(ft_module_state *st, out_arg *o, const ft_tensor *ref, int ndim, const int64_t *shape,
                    ft_dtype dtype) {
    return alloc_layout(st, o, ref, false, ndim, shape, dtype);
}

/* Allocates o like ref: same shape and dtype. */
static int alloc_like(ft_module_state *st, out_arg *o, const ft_tensor *ref) {
    return alloc_out(st, o, ref, ref->ndim, ref->shape, ref->dtype);
}

static void drop_outs(out_arg *o, int n) {
    for (int i = 0; i < n; i++)
        if (o[i].owned)
            Py_CLEAR(o[i].obj);
}

/* The return value after the C call: raises for a failed status (dropping
 * what was allocated), else the outputs (rule 3). */
static PyObject *finish(ft_status s, out_arg *o, int n) {
    if (s != FT_OK) {
        drop_outs(o, n);
        return ft_py_raise(s);
    }
    if (n == 1)
        return o[0].skip ? Py_NewRef(Py_None) : o[0].owned ? o[0].obj : Py_NewRef(o[0].obj);
    PyObject *tuple = PyTuple_New(n);
    if (!tuple) {
        drop_outs(o, n);
        return NULL;
    }
    for (int i = 0; i < n; i++)
        PyTuple_SET_ITEM(tuple, i, o[i].skip ? Py_NewRef(Py_None) : o[i].owned ? o[i].obj : Py_NewRef(o[i].obj));
    return tuple;
}

/* Whether an op over t is worth releasing the GIL for. */
static bool big(const ft_tensor *t) {
    return t && (size_t)ft_tensor_numel(t) * ft_dtype_get(t->dtype)->itemsize >= FT_GIL_FREE_BYTES;
}

/* s = expr, with the GIL released when `release`. */
#define CALL(s, release, expr)          \
    do {                                \
        if (release) {                  \
            Py_BEGIN_ALLOW_THREADS      \
            s = (expr);                 \
            Py_END_ALLOW_THREADS        \
        } else {                        \
            s = (expr);                 \
        }                               \
    } while (0)

/* "relu", "leaky_relu", "gelu" (erf), "gelu_tanh", "silu", "sigmoid", "tanh",
 * "identity" / "none" / None; alpha is leaky_relu's negative slope. */
static int parse_act(PyObject *obj, double alpha, ft_act *act) {
    *act = (ft_act){FT_ACT_NONE, (float)alpha};
    if (obj == Py_None)
        return 0;
    const char *name = PyUnicode_Check(obj) ? PyUnicode_AsUTF8(obj) : NULL;
    if (!name) {
        if (!PyErr_Occurred())
            PyErr_Format(PyExc_TypeError, "an activation is given by name (str), not %.100s", Py_TYPE(obj)->tp_name);
        return -1;
    }
    if (!strcmp(name, "none") || !strcmp(name, "identity"))
        return 0;
    for (int k = 1; k < FT_NUM_ACTS; k++)
        if (!strcmp(name, ft_act_name((ft_act_kind)k))) {
            act->kind = (ft_act_kind)k;
            return 0;
        }
    PyErr_Format(PyExc_ValueError, "unknown activation '%s' (expected relu, leaky_relu, gelu, gelu_tanh, silu, "
                                   "sigmoid, tanh or identity)",
                 name);
    return -1;
}

/* "none", "mean" or "sum". */
static int parse_reduction(PyObject *obj, ft_reduction *r) {
    const char *name = PyUnicode_Check(obj) ? PyUnicode_AsUTF8(obj) : NULL;
    if (name && !strcmp(name, "none"))
        *r = FT_REDUCTION_NONE;
    else if (name && !strcmp(name, "mean"))
        *r = FT_REDUCTION_MEAN;
    else if (name && !strcmp(name, "sum"))
        *r = FT_REDUCTION_SUM;
    else {
        if (!PyErr_Occurred())
            PyErr_Format(PyExc_ValueError, "reduction must be 'none', 'mean' or 'sum', got %R", obj);
        return -1;
    }
    return 0;
}

/* An int or a sequence of 1 or 2 ints (PyTorch's _pair); `dflt` (may be
 * NULL) when obj is None or an empty sequence. */
static int parse_pair(PyObject *obj, const char *name, const int64_t *dflt, int64_t v[2]) {
    if (obj == Py_None && dflt) {
        v[0] = dflt[0], v[1] = dflt[1];
        return 0;
    }
    int64_t shape[FT_MAX_DIMS];
    int n;
    if (PyBool_Check(obj) || ft_py_parse_shape(obj, shape, &n) < 0) {
        if (!PyErr_Occurred() || PyErr_ExceptionMatches(PyExc_TypeError)) {
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError, "%s must be an int or a pair of ints, got %R", name, obj);
        }
        return -1;
    }
    if (n == 0 && dflt) {
        v[0] = dflt[0], v[1] = dflt[1];
    } else if (n == 1 || n == 2) {
        v[0] = shape[0], v[1] = shape[n - 1];
    } else {
        PyErr_Format(PyExc_ValueError, "%s must be an int or a pair of ints, got %R", name, obj);
        return -1;
    }
    return 0;
}

/* A shape argument (int or sequence of ints). */
static int parse_shape_arg(PyObject *obj, const char *name, int64_t *shape, int *ndim) {
    if (ft_py_parse_shape(obj, shape, ndim) < 0) {
        if (PyErr_ExceptionMatches(PyExc_TypeError)) {
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError, "%s must be a sequence of ints, got %R", name, obj);
        }
        return -1;
    }
    return 0;
}

#define KW(...) (char *[]){__VA_ARGS__, NULL}
#define FN(name) (PyCFunction)(void (*)(void))(name)

/* ======================= activations ======================= */

static PyObject *py_activation_forward(PyObject *m, PyObject *args, PyObject *kw) {
    PyObject *o_out, *o_inp, *o_act;
    double alpha = 0.0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOO|d:activation_forward", KW("out", "inp", "act", "alpha"), &o_out,
                                     &o_inp, &o_act, &alpha))
        return NULL;
    ft_module_state *st = ft_py_state(m);
    const ft_tensor *inp;
    out_arg out;
    ft_act act;
    if (parse_act(o_act, alpha, &act) < 0 || parse_in(st, o_inp, "inp", false, &inp) < 0 ||
        parse_out(st, o_out, "out", false, &out) < 0 || alloc_like(st, &out, inp) < 0)
        return NULL;
    ft_status s;
    CALL(s, big(inp), ft_activation_forward(out.t, inp, act));
    return finish(s, &out, 1);
}

static PyObject *py_activation_backward(PyObject *m, PyObject *args, PyObject *kw) {
    PyObject *o_dinp, *o_dout, *o_inp, *o_out, *o_act;
    double alpha = 0.0;
    int accumulate = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOOO|dp:activation_backward",
                                     KW("dinp", "dout", "inp", "out", "act", "alpha", "accumulate"), &o_dinp, &o_dout,
                                     &o_inp, &o_out, &o_act, &alpha, &accumulate))
        return NULL;
    ft_module_state *st = ft_py_state(m);
    const ft_tensor *dout, *inp, *out;
    out_arg dinp;
    ft_act act;
    if (parse_act(o_act, alpha, &act) < 0 || parse_in(st, o_dout, "dout", false, &dout) < 0 ||
        parse_in(st, o_inp, "inp", true, &inp) < 0 || parse_in(st, o_out, "out", true, &out) < 0 ||
        parse_out(st, o_dinp, "dinp", false, &dinp) < 0 || alloc_like(st, &dinp, dout) < 0)
        return NULL;
    ft_status s;
    CALL(s, big(dout), ft_activation_backward(dinp.t, dout, inp, out, act, accumulate));
    return finish(s, &dinp, 1);
}

/* ======================= elementwise ======================= */

static PyObject *py_add_forward(PyObject *m, PyObject *args, PyObject *kw) {
    PyObject *o_out, *o_a, *o_b, *o_act = Py_None;
    double alpha = 0.0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOO|Od:add_forward", KW("out", "a", "b", "act", "alpha"), &o_out,
                                     &o_a, &o_b, &o_act, &alpha))
        return NULL;
    ft_module_state *st = ft_py_state(m);
    const ft_tensor *a, *b;
    out_arg out;
    ft_act act;
    if (parse_act(o_act, alpha, &act) < 0 || parse_in(st, o_a, "a", false, &a) < 0 ||
        parse_in(st, o_b, "b", false, &b) < 0 || parse_out(st, o_out, "out", false, &out) < 0 ||
        alloc_like(st, &out, a) < 0)
        return NULL;
    ft_status s;
    CALL(s, big(a), ft_add_forward(out.t, a, b, act));
    return finish(s, &out, 1);
}

static PyObject *py_add_backward(PyObject *m, PyObject *args, PyObject *kw) {
    PyObject *o_da, *o_db, *o_dout, *o_a = Py_None, *o_b = Py_None, *o_out = Py_None, *o_act = Py_None;
    double alpha = 0.0;
    int acc_a = 0, acc_b = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOO|OOOOdpp:add_backward",
                                     KW("da", "db", "dout", "a", "b", "out", "act", "alpha", "accumulate_a",
                                        "accumulate_b"),
                                     &o_da, &o_db, &o_dout, &o_a, &o_b, &o_out, &o_act, &alpha, &acc_a, &acc_b))
        return NULL;
    ft_module_state *st = ft_py_state(m);
    const ft_tensor *dout, *a, *b, *out;
    out_arg d[2];
    ft_act act;
    if (parse_act(o_act, alpha, &act) < 0 || parse_in(st, o_dout, "dout", false, &dout) < 0 ||
        parse_in(st, o_a, "a", true, &a) < 0 || parse_in(st, o_b, "b", true, &b) < 0 ||
        parse_in(st, o_out, "out", true, &out) < 0 || parse_out(st, o_da, "da", true, &d[0]) < 0 ||
        parse_out(st, o_db, "db", true, &d[1]) < 0)
        return NULL;
    if (alloc_like(st, &d[0], dout) < 0 || alloc_like(st, &d[1], dout) < 0) {
        drop_outs(d, 2);
        return NULL;
    }
    ft_status s;
    CALL(s, big(dout), ft_add_backward(d[0].t, d[1].t, dout, a, b, out, act, acc_a, acc_b));
    return finish(s, d, 2);
}

static PyObject *py_mul_forward(PyObject *m, PyObject *args, PyObject *kw) {
    PyObject *o_out, *o_a, *o_b;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOO:mul_forward", KW("out", "a", "b"), &o_out, &o_a, &o_b))
        return NULL;
    ft_module_state *st = ft_py_state(m);
    const ft_tensor *a, *b;
    out_arg out;
    if (parse_in(st, o_a, "a", false, &a) < 0 || parse_in(st, o_b, "b", false, &b) < 0 ||
        parse_out(st, o_out, "out", false, &out) < 0 || alloc_like(st, &out, a) < 0)
        return NULL;
    ft_status s;
    CALL(s, big(a), ft_mul_forward(out.t, a, b));
    return finish(s, &out, 1);
}

static PyObject *py_mul_backward(PyObject *m, PyObject *args, PyObject *kw) {
    PyObject *o_da, *o_db, *o_dout, *o_a, *o_b;
    int acc_a = 0, acc_b = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOOO|pp:mul_backward",
                                     KW("da", "db", "dout", "a", "b", "accumulate_a", "accumulate_b"), &o_da, &o_db,
                                     &o_dout, &o_a, &o_b, &acc_a, &acc_b))
        return NULL;
    ft_module_state *st = ft_py_state(m);
    const ft_tensor *dout, *a, *b;
    out_arg d[2];
    if (parse_in(st, o_dout, "dout", false, &dout) < 0 || parse_in(st, o_a, "a", true, &a) < 0 ||
        parse_in(st, o_b, "b", true, &b) < 0 || parse_out(st, o_da, "da", true, &d[0]) < 0 ||
        parse_out(st, o_db, "db", true, &d[1]) < 0)
        return NULL;
    if (alloc_like(st, &d[0], dout) < 0 || alloc_like(st, &d[1], dout) < 0) {
        drop_outs(d, 2);
        return NULL;
    }
    ft_status s;
    CALL(s, big(dout), ft_mul_backward(d[0].t, d[1].t, dout, a, b, acc_a, acc_b));
    return finish(s, d, 2);
}

/* ======================= LSTM cell ======================= */


static PyObject *py_lstm_cell_forward(PyObject *m, PyObject *args, PyObject *kw) {
    PyObject *o_c, *o_gates, *o_prev = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|O:lstm_cell_forward", KW("c", "gates", "c_prev"), &o_c, &o_gates,
                                     &o_prev))
        return NULL;
    ft_module_state *st = ft_py_state(m);
    const ft_tensor *gates, *prev;
    out_arg c;
    if (parse_in(st, o_gates, "gates", false, &gates) < 0 || parse_in(st, o_prev, "c_prev", true, &prev) < 0 ||
        parse_out(st, o_c, "c", false, &c) < 0)
        return NULL;
    /* gates of another rank get no c: the op then names what is wrong with them */
    int64_t shape[2] = {gates->shape[0], gates->ndim == 2 ? gates->shape[1] / 4 : 0};
    if (gates->ndim == 2 && alloc_on(st, &c, gates, 2, shape, gates->dtype) < 0)
        return NULL;
    ft_status s;
    CALL(s, big(gates), ft_lstm_cell_forward(c.t, gates, prev));
    return finish(s, &c, 1);
}

/* The two LSTM backwards share one form: the gates' gradient and a state's (each Tensor / None / False) from a
 * gradient, the gates and a state (c_prev: optional, and without it no gradient of it unless one is passed). */
typedef ft_status (*lstm_backward_fn)(const ft_tensor *dgates, const ft_tensor *dstate, const ft_tensor *dy,
                                      const ft_tensor *gates, const ft_tensor *state, bool accumulate_gates,
                                      bool accumulate_state);

static PyObject *lstm_backward(PyObject *m, PyObject *args, PyObject *kw, const char *fmt, char **names,
                               bool state_optional, lstm_backward_fn fn) {
    PyObject *o_dgates, *o_dstate, *o_dy, *o_gates, *o_state;
    int acc_gates = 0, acc_state = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, fmt, names, &o_dgates, &o_dstate, &o_dy, &o_gates, &o_state,
                                     &acc_gates, &acc_state))
        return NULL;
    const char *op = strchr(fmt, ':') + 1;
    ft_module_state *st = ft_py_state(m);
    const ft_tensor *dy, *gates, *state;
    out_arg d[2];
    if (parse_in(st, o_dy, names[2], false, &dy) < 0 || parse_in(st, o_gates, "gates", false, &gates) < 0 ||
        parse_in(st, o_state, names[4], state_optional, &state) < 0 ||
        parse_out(st, o_dgates, "dgates", true, &d[0]) < 0 || parse_out(st, o_dstate, names[1], true, &d[1]) < 0)
        return NULL;
    if (!state && !d[1].t) /* no c_prev: no gradient of it */
        d[1].skip = true;
    if (alloc_like(st, &d[0], gates) < 0 || alloc_like(st, &d[1], dy) < 0 ||
        check_accumulate(&d[0], 1, acc_gates, op) < 0 || check_accumulate(&d[1], 1, acc_state, op) < 0) {
        drop_outs(d, 2);
        return NULL;
    }
    ft_status s = d[0].owned ? ft_tensor_zero(d[0].t) : FT_OK; /* the columns the op leaves */
    if (s == FT_OK)
        CALL(s, big(gates), fn(d[0].t, d[1].t, dy, gates, state, acc_gates, acc_state));
    return finish(s, d, 2);
}

static PyObject *py_lstm_cell_backward(PyObject *m, PyObject *args, PyObject *kw) {
    return lstm_backward(m, args, kw, "OOOOO|pp:lstm_cell_backward",
                         KW("dgates", "dc_prev", "dc", "gates", "c_prev", "accumulate_gates", "accumulate_c_prev"),
                         true, ft_lstm_cell_backward);
}

static PyObject *py_lstm_hidden_forward(PyObject *m, PyObject *args, PyObject *kw) {
    PyObject *o_h, *o_gates, *o_c;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOO:lstm_hidden_forward", KW("h", "gates", "c"), &o_h, &o_gates, &o_c))
        return NULL;
    ft_module_state *st = ft_py_state(m);
    const ft_tensor *gates, *c;
    out_arg h;
    if (parse_in(st, o_gates, "gates", false, &gates) < 0 || parse_in(st, o_c, "c", false, &c) < 0 ||
        parse_out(st, o_h, "h", false, &h) < 0 || alloc_out(st, &h, c, c->ndim, c->shape, gates->dtype) < 0)
        return NULL;
    ft_status s;
    CALL(s, big(gates), ft_lstm_hidden_forward(h.t, gates, c));
    return finish(s, &h, 1);
}

static PyObject *py_lstm_hidden_backward(PyObject *m, PyObject *args, PyObject *kw) {
    return lstm_backward(m, args, kw, "OOOOO|pp:lstm_hidden_backward",
                         KW("dgates", "dc", "dh", "gates", "c", "accumulate_gates", "accumulate_c"), false,
                         ft_lstm_hidden_backward);
}

/* concat takes a sequence of inputs; its backward a sequence of gradient
 * outputs (each Tensor / None / False, or None for all allocated) and returns
 * a list of them. */
static PyObject *py_concat_forward(PyObject *m, PyObject *args, PyObject *kw) {
    PyObject *o_out, *o_inps;
    int dim = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|i:concat_forward", KW("out", "inputs", "dim"), &o_out, &o_inps,
                                     &dim))
        return NULL;
    ft_module_state *st = ft_py_state(m);
    PyObject *seq = PySequence_Fast(o_inps, "concat_forward: inputs must be a sequence of tensors");
    if (!seq)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    const ft_tensor **inps = PyMem_Calloc((size_t)n + 1, sizeof *inps);
    out_arg out = {0};
    PyObject *result = NULL;
    if (!inps) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++)
        if (parse_in(st, PySequence_Fast_GET_ITEM(seq, i), "concat_forward: inputs[i]", false, &inps[i]) < 0)
            goto done;
    if (parse_out(st, o_out, "out", false, &out) < 0)
        goto done;
    if (needs_alloc(&out)) {
        if (n == 0 || n > INT_MAX) {
            PyErr_SetString(PyExc_ValueError, "concat_forward: needs at least one tensor");
            goto done;
        }
        const ft_tensor *r = inps[0];
        int d = dim < 0 ? dim + r->ndim : dim;
        if (d < 0 || d >= r->ndim) {
            PyErr_Format(PyExc_IndexError, "concat_forward: dim %d is out of range for %d-d tensors", dim, r->ndim);
            goto done;
        }
        int64_t shape[FT_MAX_DIMS];
        memcpy(shape, r->shape, sizeof shape);
        shape[d] = 0;
        for (Py_ssize_t i = 0; i < n; i++)
            shape[d] += inps[i]->ndim == r->ndim ? inps[i]->shape[d] : 0;
        if (alloc_out(st, &out, r, r->ndim, shape, r->dtype) < 0)
            goto done;
    }
    ft_status s;
    CALL(s, big(out.t), ft_concat_forward(out.t, inps, (int)n, dim));
    result = finish(s, &out, 1);
    out.owned = false;
done:
    drop_outs(&out, 1);
    PyMem_Free(inps);
    Py_DECREF(seq);
    return result;
}

static PyObject *py_concat_backward(PyObject *m, PyObject *args, PyObject *kw) {
    PyObject *o_grads, *o_dout, *o_sizes;
    int dim = 1, accumulate = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOO|ip:concat_backward",
                                     KW("grads", "dout", "sizes", "dim", "accumulate"), &o_grads, &o_dout, &o_sizes,
                                     &dim, &accumulate))
        return NULL;
    ft_module_state *st = ft_py_state(m);
    const ft_tensor *dout;
    int64_t sizes[1024];
    int n;
    if (parse_in(st, o_dout, "dout", false, &dout) < 0)
        return NULL;
    PyObject *sizes_seq = PySequence_Fast(o_sizes, "concat_backward: sizes must be a sequence of ints");
    if (!sizes_seq)
        return NULL;
    n = (int)PySequence_Fast_GET_SIZE(sizes_seq);
    if (n > 1024 || n < 1) {
        Py_DECREF(sizes_seq);
        return PyErr_Format(PyExc_ValueError, "concat_backward: between 1 and 1024 parts, got %d", n);
    }
    for (int i = 0; i < n; i++) {
        sizes[i] = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(sizes_seq, i));
        if (sizes[i] == -1 && PyErr_Occurred()) {
            Py_DECREF(sizes_seq);
            return NULL;
        }
    }
    Py_DECREF(sizes_seq);
    PyObject *grads_seq = NULL;
    if (o_grads != Py_None) {
        grads_seq = PySequence_Fast(o_grads, "concat_backward: grads must be a sequence or None");
        if (!grads_seq)
            return NULL;
        if (PySequence_Fast_GET_SIZE(grads_seq) != n) {
            Py_DECREF(grads_seq);
            return PyErr_Format(PyExc_ValueError, "concat_backward: %zd grads for %d sizes",
                                PySequence_Fast_GET_SIZE(grads_seq), n);
        }
    }
    out_arg *g = PyMem_Calloc((size_t)n, sizeof *g);
    const ft_tensor **gt = PyMem_Calloc((size_t)n, sizeof *gt);
    PyObject *result = NULL;
    int parsed = 0;
    if (!g || !gt) {
        PyErr_NoMemory();
        goto done;
    }
    int d = dim < 0 ? dim + dout->ndim : dim;
    for (; parsed < n; parsed++) {
        int i = parsed;
        if (parse_out(st, grads_seq ? PySequence_Fast_GET_ITEM(grads_seq, i) : Py_None, "concat_backward: grads[i]",
                      true, &g[i]) < 0)
            goto done;
        if (needs_alloc(&g[i])) {
            if (d < 0 || d >= dout->ndim) {
                PyErr_Format(PyExc_IndexError, "concat_backward: dim %d is out of range for %d-d tensors", dim,
                             dout->ndim);
                goto done;
            }
            if (sizes[i] < 0) {
                PyErr_Format(PyExc_ValueError, "concat_backward: sizes[%d] is negative (%lld)", i,
                             (long long)sizes[i]);
                goto done;
            }
            int64_t shape[FT_MAX_DIMS];
            memcpy(shape, dout->shape, sizeof shape);
            shape[d] = sizes[i];
            if (alloc_out(st, &g[i], dout, dout->ndim, shape, dout->dtype) < 0)
                goto done;
        }
        gt[i] = g[i].t;
    }
    ft_status s;
    CALL(s, big(dout), ft_concat_backward(gt, sizes, n, dout, dim, accumulate));
    if (s != FT_OK) {
        ft_py_raise(s);
        goto done;
    }
    result = PyList_New(n);
    for (int i = 0; result && i < n; i++) {
        PyList_SET_ITEM(result, i, g[i].skip ? Py_NewRef(Py_None) : Py_NewRef(g[i].obj));
    }
done:
    if (g)
        drop_outs(g, n);
    PyMem_Free(g);
    PyMem_Free(gt);
    Py_XDECREF(grads_seq);
    return result;
}

/* ======================= dropout ======================= */

static int parse_dropout(double p, PyObject *seed, PyObject *offset, long long span, ft_dropout_params *dp) {
    dp->p = p;
    dp->span = span;
    dp->seed = PyLong_AsUnsignedLongLongMask(seed);
    if (PyErr_Occurred())
        return -1;
    dp->offset = PyLong_AsUnsignedLongLong(offset);
    return PyErr_Occurred() ? -1 : 0;
}

static PyObject *py_dropout_forward(PyObject *m, PyObject *args, PyObject *kw) {
    PyObject *o_out, *o_inp, *o_seed, *o_offset;
    double p;
    long long span = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOdOO|L:dropout_forward",
                                     KW("out", "inp", "p", "seed", "offset", "span"), &o_out, &o_inp, &p, &o_seed,
                                     &o_offset, &span))
        return NULL;
    ft_module_state *st = ft_py_state(m);
    const ft_tensor *inp;
    out_arg out;
    ft_dropout_params dp;
    if (parse_dropout(p, o_seed, o_offset, span, &dp) < 0 || parse_in(st, o_inp, "inp", false, &inp) < 0 ||
        parse_out(st, o_out, "out", false, &out) < 0 || alloc_like(st, &out, inp) < 0)
        return NULL;
    ft_status s;
    CALL(s, big(inp), ft_dropout_forward(out.t, inp, &dp));
    return finish(s, &out, 1);
}

static PyObject *py_dropout_backward(PyObject *m, PyObject *args, PyObject *kw) {
    PyObject *o_dinp, *o_dout, *o_seed, *o_offset;
    double p;
    int accumulate = 0;
    long long span = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOdOO|pL:dropout_backward",
                                     KW("dinp", "dout", "p", "seed", "offset", "accumulate", "span"), &o_dinp, &o_dout,
                                     &p, &o_seed, &o_offset, &accumulate, &span))
        return NULL;
    ft_module_state *st = ft_py_state(m);
    const ft_tensor *dout;
    out_arg dinp;
    ft_dropout_params dp;
    if (parse_dropout(p, o_seed, o_offset, span, &dp) < 0 || parse_in(st, o_dout, "dout", false, &dout) < 0 ||
        parse_out(st, o_dinp, "dinp", false, &dinp) < 0 || alloc_like(st, &dinp, dout) < 0)
        return NULL;
    ft_status s;
    CALL(s, big(dout), ft_dropout_backward(dinp.t, dout, &dp, accumulate));
    return finish(s, &dinp, 1);
}

static PyObject *py_dropout_blocks(PyObject *m, PyObject *arg) {
    long long n = PyLong_AsLongLong(arg);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    return PyLong_FromUnsignedLongLong(ft_dropout_blocks(n));
}

/* ======================= pooling ======================= */

/* kernel_size, stride (None: kernel_size), padding, dilation, ceil_mode,
 * count_include_pad, divisor_override (None or 0: none). */
static int parse_pool(PyObject *kernel, PyObject *stride, PyObject *padding, PyObject *dilation, int ceil_mode,
                      int count_include_pad, PyObject *divisor, ft_pool2d_params *p) {
    static const int64_t zero[2] = {0, 0}, one[2] = {1, 1};
    memset(p, 0, sizeof *p);
    if (parse_pair(kernel, "kernel_size", NULL, p->kernel) < 0 ||
        parse_pair(stride, "stride", p->kernel, p->stride) < 0 ||
        parse_pair(padding, "padding", zero, p->padding) < 0 ||
        parse_pair(dilation, "dilation", one, p->dilation) < 0)
        return -1;
    p->ceil_mode = ceil_mode;
    p->count_include_pad = count_include_pad;
    if (divisor && divisor != Py_None) {
        p->divisor_override = PyLong_AsLongLong(divisor);
        if (p->divisor_override == -1 && PyErr_Occurred())
            return -1;
        if (p->divisor_override <= 0) {
            PyErr_SetString(PyExc_ValueError, "divisor_override must be positive");
            return -1;
        }
    }
    return 0;
}

/* The (N, C, H, W) of a backward's dinp when it is allocated: input_size
 * ((H, W) or (N, C, H, W)), with N and C from dout. */
static int input_shape(PyObject *obj, const char *op, const ft_tensor *dout, int64_t *shape) {
    if (obj == Py_None) {
        PyErr_Format(PyExc_ValueError, "%s: input_size is needed to allocate dinp", op);
        return -1;
    }
    int64_t v[FT_MAX_DIMS];
    int n;
    if (parse_shape_arg(obj, "input_size", v, &n) < 0)
        return -1;
    if ((n != 2 && n != 4) || dout->ndim != 4) {
        PyErr_Format(PyExc_ValueError, "%s: input_size must be (H, W) or (N, C, H, W) for a 4-d dout", op);
        return -1;
    }
    shape[0] = dout->shape[0], shape[1] = dout->shape[1];
    shape[2] = v[n - 2], shape[3] = v[n - 1];
    return 0;
}

static PyObject *py_max_pool2d_forward(PyObject *m, PyObject *args, PyObject *kw) {
    PyObject *o_out, *o_ind, *o_inp, *kernel, *stride = Py_None, *padding = Py_None, *dilation = Py_None;
    int ceil_mode = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOO|OOOp:max_pool2d_forward",
                                     KW("out", "indices", "inp", "kernel_size", "stride", "padding", "dilation",
                                        "ceil_mode"),
                                     &o_out, &o_ind, &o_inp, &kernel, &stride, &padding, &dilation, &ceil_mode))
        return NULL;
    ft_module_state *st = ft_py_state(m);
    const ft_tensor *inp;
    out_arg o[2];
    ft_pool2d_params p;
    if (parse_pool(kernel, stride, padding, dilation, ceil_mode, 1, NULL, &p) < 0 ||
        parse_in(st, o_inp, "inp", false, &inp) < 0 || parse_out(st, o_out, "out", false, &o[0]) < 0 ||
        parse_out(st, o_ind, "indices", true, &o[1]) < 0)
        return NULL;
    if ((needs_alloc(&o[0]) || needs_alloc(&o[1])) && inp->ndim == 4) {
        int64_t shape[4] = {inp->shape[0], inp->shape[1], 0, 0};
        ft_status s = ft_pool2d_out_size(&shape[2], &shape[3], inp->shape[2], inp->shape[3], &p, "max_pool2d");
        if (s != FT_OK)
            return ft_py_raise(s);
        if (alloc_out(st, &o[0], inp, 4, shape, inp->dtype) < 0 || alloc_out(st, &o[1], inp, 4, shape, FT_INT64) < 0) {
            drop_outs(o, 2);
            return NULL;
        }
    } else if (needs_alloc(&o[0]) || needs_alloc(&o[1])) {
        return PyErr_Format(PyExc_ValueError, "max_pool2d: inp should have 4 dimensions (N, C, H, W), got %d",
                            inp->ndim);
    }
    ft_status s;
    CALL(s, big(inp), ft_max_pool2d_forward(o[0].t, o[1].t, inp, &p));
    return finish(s, o, 2);
}

/* The backward of both max poolings: dinp from dout and the saved argmax
 * indices (their C entry points share one signature). */
typedef ft_status (*max_pool_backward_fn)(const ft_tensor *dinp, const ft_tensor *dout, const ft_tensor *indices,
                                          bool accumulate);

static PyObject *max_pool_backward(PyObject *m, PyObject *args, PyObject *kw, const char *name,
                                   max_pool_backward_fn fn) {
    PyObject *o_dinp, *o_dout, *o_ind, *o_size = Py_None;
    int accumulate = 0;
    char format[96];
    snprintf(format, sizeof format, "OOO|Op:%s", name);
    if (!PyArg_ParseTupleAndKeywords(args, kw, format, KW("dinp", "dout", "indices", "input_size", "accumulate"),
                                     &o_dinp, &o_dout, &o_ind, &o_size, &accumulate))
        return NULL;
    ft_module_state *st = ft_py_state(m);
    const ft_tensor *dout, *ind;
    out_arg dinp;
    int64_t shape[4];
    if (parse_in(st, o_dout, "dout", false, &dout) < 0 || parse_in(st, o_ind, "indices", false, &ind) < 0 ||
        parse_out(st, o_dinp, "dinp", false, &dinp) < 0)
        return NULL;
    if (needs_alloc(&dinp) && (input_shape(o_size, name, dout, shape) < 0 ||
                               alloc_out(st, &dinp, dout, 4, shape, dout->dtype) < 0))
        return NULL;
    ft_status s;
    CALL(s, big(dinp.t), fn(dinp.t, dout, ind, accumulate));
    return finish(s, &dinp, 1);
}

static PyObject *py_max_pool2d_backward(PyObject *m, PyObject *args, PyObject *kw) {
    return max_pool_backward(m, args, kw, "max_pool2d_backward", ft_max_pool2d_backward);
}

static PyObject *py_avg_pool2d_forward(PyObject *m, PyObject *args, PyObject *kw) {
    PyObject *o_out, *o_inp, *kernel, *stride = Py_None, *padding = Py_None, *divisor = Py_None;
    int ceil_mode = 0, cip = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOO|OOppO:avg_pool2d_forward",
                                     KW("out", "inp", "kernel_size", "stride", "padding", "ceil_mode",
                                        "count_include_pad", "divisor_override"),
                                     &o_out, &o_inp, &kernel, &stride, &padding, &ceil_mode, &cip, &divisor))
        return NULL;
    ft_module_state *st = ft_py_state(m);
    const ft_tensor *inp;
    out_arg out;
    ft_pool2d_params p;
    if (parse_pool(kernel, stride, padding, Py_None, ceil_mode, cip, divisor, &p) < 0 ||
        parse_in(st, o_inp, "inp", false, &inp) < 0 || parse_out(st, o_out, "out", false, &out) < 0)
        return NULL;
    if (needs_alloc(&out)) {
        if (inp->ndim != 4)
            return PyErr_Format(PyExc_ValueError, "avg_pool2d: inp should have 4 dimensions (N, C, H, W), got %d",
                                inp->ndim);
        int64_t shape[4] = {inp->shape[0], inp->shape[1], 0, 0};
        ft_status s = ft_pool2d_out_size(&shape[2], &shape[3], inp->shape[2], inp->shape[3], &p, "avg_pool2d");
        if (s != FT_OK)
            return ft_py_raise(s);
        if (alloc_out(st, &out, inp, 4, shape, inp->dtype) < 0)
            return NULL;
    }
    ft_status s;
    CALL(s, big(inp), ft_avg_pool2d_forward(out.t, inp, &p));
    return finish(s, &out, 1);
}

static PyObject *py_avg_pool2d_backward(PyObject *m, PyObject *args, PyObject *kw) {
    PyObject *o_dinp, *o_dout, *o_size, *kernel, *stride = Py_None, *padding = Py_None, *divisor = Py_None;
    int ceil_mode = 0, cip = 1, accumulate = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOO|OOppOp:avg_pool2d_backward",
                                     KW("dinp", "dout", "input_size", "kernel_size", "stride", "padding",
                                        "ceil_mode", "count_include_pad", "divisor_override", "accumulate"),
                                     &o_dinp, &o_dout, &o_size, &kernel, &stride, &padding, &ceil_mode, &cip,
                                     &divisor, &accumulate))
        return NULL;
    ft_module_state *st = ft_py_state(m);
    const ft_tensor *dout;
    out_arg dinp;
    ft_pool2d_params p;
    int64_t shape[4];
    if (parse_pool(kernel, stride, padding, Py_None, ceil_mode, cip, divisor, &p) < 0 ||
        parse_in(st, o_dout, "dout", false, &dout) < 0 || parse_out(st, o_dinp, "dinp", false, &dinp) < 0)
        return NULL;
    if (needs_alloc(&dinp) && (input_shape(o_size, "avg_pool2d_backward", dout, shape) < 0 ||
                               alloc_out(st, &dinp, dout, 4, shape, dout->dtype) < 0))
        return NULL;
    ft_status s;
    CALL(s, big(dinp.t), ft_avg_pool2d_backward(dinp.t, dout, &p, accumulate));
    return finish(s, &dinp, 1);
}

/* output_size: (P, Q) or an int; needed only to allocate out. */
static int adaptive_out_shape(PyObject *obj, const char *op, const ft_tensor *inp, int64_t *shape) {
    if (inp->ndim != 4) {
        PyErr_Format(PyExc_ValueError, "%s: inp should have 4 dimensions (N, C, H, W), got %d", op, inp->ndim);
        return -1;
    }
    if (obj == Py_None) {
        PyErr_Format(PyExc_ValueError, "%s: output_size is needed to allocate out", op);
        return -1;
    }
    int64_t pq[2];
    if (parse_pair(obj, "output_size", NULL, pq) < 0)
        return -1;
    if (pq[0] < 0 || pq[1] < 0) {
        PyErr_Format(PyExc_ValueError, "%s: output_size must be non-negative, got (%lld, %lld)", op,
                     (long long)pq[0], (long long)pq[1]);
        return -1;
    }
    shape[0] = inp->shape[0], shape[1] = inp->shape[1], shape[2] = pq[0], shape[3] = pq[1];
    return 0;
}

static PyObject *py_adaptive_avg_pool2d_forward(PyObject *m, PyObject *args, PyObject *kw) {
    PyObject *o_out, *o_inp, *o_size = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|O:adaptive_avg_pool2d_forward", KW("out", "inp", "output_size"),
                                     &o_out, &o_inp, &o_size))
        return NULL;
    ft_module_state *st = ft_py_state(m);
    const ft_tensor *inp;
    out_arg out;
    int64_t shape[4];
    if (parse_in(st, o_inp, "inp", false, &inp) < 0 || parse_out(st, o_out, "out", false, &out) < 0)
        return NULL;
    if (needs_alloc(&out) && (adaptive_out_shape(o_size, "adaptive_avg_pool2d", inp, shape) < 0 ||
                              alloc_out(st, &out, inp, 4, shape, inp->dtype) < 0))
        return NULL;
    ft_status s;
    CALL(s, big(inp), ft_adaptive_avg_pool2d_forward(out.t, inp));
    return finish(s, &out, 1);
}

static PyObject *py_adaptive_avg_pool2d_backward(PyObject *m, PyObject *args, PyObject *kw) {
    PyObject *o_dinp, *o_dout, *o_size = Py_None;
    int accumulate = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|Op:adaptive_avg_pool2d_backward",
                                     KW("dinp", "dout", "input_size", "accumulate"), &o_dinp, &o_dout, &o_size,
                                     &accumulate))
        return NULL;
    ft_module_state *st = ft_py_state(m);
    const ft_tensor *dout;
    out_arg dinp;
    int64_t shape[4];
    if (parse_in(st, o_dout, "dout", false, &dout) < 0 || parse_out(st, o_dinp, "dinp", false, &dinp) < 0)
        return NULL;
    if (needs_alloc(&dinp) && (input_shape(o_size, "adaptive_avg_pool2d_backward", dout, shape) < 0 ||
                               alloc_out(st, &dinp, dout, 4, shape, dout->dtype) < 0))
        return NULL;
    ft_status s;
    CALL(s, big(dinp.t), ft_adaptive_avg_pool2d_backward(dinp.t, dout, accumulate));
    return finish(s, &dinp, 1);
}

static PyObject *py_adaptive_max_pool2d_forward(PyObject *m, PyObject *args, PyObject *kw) {
    PyObject *o_out, *o_ind, *o_inp, *o_size = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOO|O:adaptive_max_pool2d_forward",
                                     KW("out", "indices", "inp", "output_size"), &o_out, &o_ind, &o_inp, &o_size))
        return NULL;
    ft_module_state *st = ft_py_state(m);
    const ft_tensor *inp;
    out_arg o[2];
    int64_t shape[4];
    if (parse_in(st, o_inp, "inp", false, &inp) < 0 || parse_out(st, o_out, "out", false, &o[0]) < 0 ||
        parse_out(st, o_ind, "indices", true, &o[1]) < 0)
        return NULL;
    if (needs_alloc(&o[0]) || needs_alloc(&o[1])) {
        if (needs_alloc(&o[0]) || o_size != Py_None) {
            if (adaptive_out_shape(o_size, "adaptive_max_pool2d", inp, shape) < 0)
                return NULL;
        } else {
            memcpy(shape, o[0].t->shape, sizeof shape);
        }
        if (alloc_out(st, &o[0], inp, 4, shape, inp->dtype) < 0 || alloc_out(st, &o[1], inp, 4, shape, FT_INT64) < 0) {
            drop_outs(o, 2);
            return NULL;
        }
    }
    ft_status s;
    CALL(s, big(inp), ft_adaptive_max_pool2d_forward(o[0].t, o[1].t, inp));
    return finish(s, o, 2);
}

static PyObject *py_adaptive_max_pool2d_backward(PyObject *m, PyObject *args, PyObject *kw) {
    return max_pool_backward(m, args, kw, "adaptive_max_pool2d_backward", ft_adaptive_max_pool2d_backward);
}

/* ======================= softmax ======================= */

static PyObject *softmax_fwd(PyObject *m, PyObject *args, PyObject *kw, bool log) {
    PyObject *o_out, *o_inp;
    int dim;
    if (!PyArg_ParseTupleAndKeywords(args, kw, log ? "OOi:log_softmax_forward" : "OOi:softmax_forward",
                                     KW("out", "inp", "dim"), &o_out, &o_inp, &dim))
        return NULL;
    ft_module_state *st = ft_py_state(m);
    const ft_tensor *inp;
    out_arg out;
    if (parse_in(st, o_inp, "inp", false, &inp) < 0 || parse_out(st, o_out, "out", false, &out) < 0 ||
        alloc_like(st, &out, inp) < 0)
        return NULL;
    ft_status s;
    CALL(s, big(inp), log ? ft_log_softmax_forward(out.t, inp, dim) : ft_softmax_forward(out.t, inp, dim));
    return finish(s, &out, 1);
}

static PyObject *softmax_bwd(PyObject *m, PyObject *args, PyObject *kw, bool log) {
    PyObject *o_dinp, *o_dout, *o_out;
    int dim, accumulate = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, log ? "OOOi|p:log_softmax_backward" : "OOOi|p:softmax_backward",
                                     KW("dinp", "dout", "out", "dim", "accumulate"), &o_dinp, &o_dout, &o_out, &dim,
                                     &accumulate))
        return NULL;
    ft_module_state *st = ft_py_state(m);
    const ft_tensor *dout, *out;
    out_arg dinp;
    if (parse_in(st, o_dout, "dout", false, &dout) < 0 || parse_in(st, o_out, "out", false, &out) < 0 ||
        parse_out(st, o_dinp, "dinp", false, &dinp) < 0 || alloc_like(st, &dinp, dout) < 0)
        return NULL;
    ft_status s;
    CALL(s, big(dout),
         log ? ft_log_softmax_backward(dinp.t, dout, out, dim, accumulate)
             : ft_softmax_backward(dinp.t, dout, out, dim, accumulate));
    return finish(s, &dinp, 1);
}

static PyObject *py_softmax_forward(PyObject *m, PyObject *a, PyObject *k) { return softmax_fwd(m, a, k, false); }
static PyObject *py_log_softmax_forward(PyObject *m, PyObject *a, PyObject *k) { return softmax_fwd(m, a, k, true); }
static PyObject *py_softmax_backward(PyObject *m, PyObject *a, PyObject *k) { return softmax_bwd(m, a, k, false); }
static PyObject *py_log_softmax_backward(PyObject *m, PyObject *a, PyObject *k) { return softmax_bwd(m, a, k, true); }

/* ======================= losses ======================= */

static int parse_ce(PyObject *reduction, long long ignore_index, double smoothing, ft_cross_entropy_params *p) {
    p->ignore_index = ignore_index;
    p->label_smoothing = smoothing;
    return parse_reduction(reduction, &p->reduction);
}

/* The loss's shape: the target's for 'none', () otherwise. */
static int alloc_loss(ft_module_state *st, out_arg *o, ft_reduction r, const ft_tensor *per_sample,
                      const ft_tensor *dtype_of) {
    if (r == FT_REDUCTION_NONE)
        return alloc_out(st, o, per_sample, per_sample->ndim, per_sample->shape, dtype_of->dtype);
    int64_t scalar[1] = {1};
    return alloc_out(st, o, dtype_of, 0, scalar, dtype_of->dtype);
}

static PyObject *py_cross_entropy_forward(PyObject *m, PyObject *args, PyObject *kw) {
    PyObject *o_loss, *o_dlogits, *o_logits, *o_target, *o_weight = Py_None, *o_red = NULL;
    long long ignore_index = -100;
    double smoothing = 0.0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOO|OOLd:cross_entropy_forward",
                                     KW("loss", "dlogits", "logits", "target", "weight", "reduction", "ignore_index",
                                        "label_smoothing"),
                                     &o_loss, &o_dlogits, &o_logits, &o_target, &o_weight, &o_red, &ignore_index,
                                     &smoothing))
        return NULL;
    ft_module_state *st = ft_py_state(m);
    const ft_tensor *logits, *target, *weight;
    out_arg o[2];
    ft_cross_entropy_params p;
    PyObject *mean = NULL;
    if (!o_red)
        o_red = mean = PyUnicode_FromString("mean");
    int bad = !o_red || parse_ce(o_red, ignore_index, smoothing, &p) < 0;
    Py_XDECREF(mean);
    if (bad || parse_in(st, o_logits, "logits", false, &logits) < 0 ||
        parse_in(st, o_target, "target", false, &target) < 0 || parse_in(st, o_weight, "weight", true, &weight) < 0 ||
        parse_out(st, o_loss, "loss", false, &o[0]) < 0 || parse_out(st, o_dlogits, "dlogits", true, &o[1]) < 0)
        return NULL;
    if (alloc_loss(st, &o[0], p.reduction, target, logits) < 0 || alloc_like(st, &o[1], logits) < 0) {
        drop_outs(o, 2);
        return NULL;
    }
    ft_status s;
    CALL(s, big(logits), ft_cross_entropy_forward(o[0].t, o[1].t, logits, target, weight, &p));
    return finish(s, o, 2);
}

static PyObject *py_cross_entropy_backward(PyObject *m, PyObject *args, PyObject *kw) {
    PyObject *o_dlogits, *o_dloss, *o_logits, *o_target, *o_weight = Py_None, *o_red = NULL;
    long long ignore_index = -100;
    double smoothing = 0.0;
    int accumulate = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOO|OOLdp:cross_entropy_backward",
                                     KW("dlogits", "dloss", "logits", "target", "weight", "reduction", "ignore_index",
                                        "label_smoothing", "accumulate"),
                                     &o_dlogits, &o_dloss, &o_logits, &o_target, &o_weight, &o_red, &ignore_index,
                                     &smoothing, &accumulate))
        return NULL;
    ft_module_state *st = ft_py_state(m);
    const ft_tensor *dloss, *logits, *target, *weight;
    out_arg dlogits;
    ft_cross_entropy_params p;
    PyObject *mean = NULL;
    if (!o_red)
        o_red = mean = PyUnicode_FromString("mean");
    int bad = !o_red || parse_ce(o_red, ignore_index, smoothing, &p) < 0;
    Py_XDECREF(mean);
    if (bad || parse_in(st, o_dloss, "dloss", false, &dloss) < 0 ||
        parse_in(st, o_logits, "logits", false, &logits) < 0 || parse_in(st, o_target, "target", false, &target) < 0 ||
        parse_in(st, o_weight, "weight", true, &weight) < 0 ||
        parse_out(st, o_dlogits, "dlogits", false, &dlogits) < 0 || alloc_like(st, &dlogits, logits) < 0)
        return NULL;
    ft_status s;
    CALL(s, big(logits), ft_cross_entropy_backward(dlogits.t, dloss, logits, target, weight, &p, accumulate));
    return finish(s, &dlogits, 1);
}

static PyObject *py_mse_loss_forward(PyObject *m, PyObject *args, PyObject *kw) {
    PyObject *o_loss, *o_inp, *o_target, *o_red = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOO|O:mse_loss_forward", KW("loss", "inp", "target", "reduction"),
                                     &o_loss, &o_inp, &o_target, &o_red))
        return NULL;
    ft_module_state *st = ft_py_state(m);
    const ft_tensor *inp, *target;
    out_arg loss;
    ft_reduction r = FT_REDUCTION_MEAN;
    if ((o_red && parse_reduction(o_red, &r) < 0) || parse_in(st, o_inp, "inp", false, &inp) < 0 ||
        parse_in(st, o_target, "target", false, &target) < 0 || parse_out(st, o_loss, "loss", false, &loss) < 0 ||
        alloc_loss(st, &loss, r, inp, inp) < 0)
        return NULL;
    ft_status s;
    CALL(s, big(inp), ft_mse_loss_forward(loss.t, inp, target, r));
    return finish(s, &loss, 1);
}

static PyObject *py_mse_loss_backward(PyObject *m, PyObject *args, PyObject *kw) {
    PyObject *o_dinp, *o_dtarget, *o_dloss, *o_inp, *o_target, *o_red = NULL;
    int acc_inp = 0, acc_target = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOOO|Opp:mse_loss_backward",
                                     KW("dinp", "dtarget", "dloss", "inp", "target", "reduction", "accumulate_inp",
                                        "accumulate_target"),
                                     &o_dinp, &o_dtarget, &o_dloss, &o_inp, &o_target, &o_red, &acc_inp, &acc_target))
        return NULL;
    ft_module_state *st = ft_py_state(m);
    const ft_tensor *dloss, *inp, *target;
    out_arg d[2];
    ft_reduction r = FT_REDUCTION_MEAN;
    if ((o_red && parse_reduction(o_red, &r) < 0) || parse_in(st, o_dloss, "dloss", false, &dloss) < 0 ||
        parse_in(st, o_inp, "inp", false, &inp) < 0 || parse_in(st, o_target, "target", false, &target) < 0 ||
        parse_out(st, o_dinp, "dinp", true, &d[0]) < 0 || parse_out(st, o_dtarget, "dtarget", true, &d[1]) < 0)
        return NULL;
    if (alloc_like(st, &d[0], inp) < 0 || alloc_like(st, &d[1], target) < 0) {
        drop_outs(d, 2);
        return NULL;
    }
    ft_status s;
    CALL(s, big(inp), ft_mse_loss_backward(d[0].t, d[1].t, dloss, inp, target, r, acc_inp, acc_target));
    return finish(s, d, 2);
}

/* ======================= registration ======================= */

#define KWFN(name, doc) {#name, FN(py_##name), METH_VARARGS | METH_KEYWORDS, doc}

/* ======================= convolution and linear (oneDNN) ======================= */

static int parse_conv(PyObject *stride, PyObject *padding, PyObject *dilation, long long groups,
                      ft_conv2d_params *p) {
    static const int64_t one[2] = {1, 1}, zero[2] = {0, 0};
    if (parse_pair(stride, "stride", one, p->stride) < 0 || parse_pair(padding, "padding", zero, p->padding) < 0 ||
        parse_pair(dilation, "dilation", one, p->dilation) < 0)
        return -1;
    p->groups = groups;
    return 0;
}

static PyObject *py_conv2d_forward(PyObject *m, PyObject *args, PyObject *kw) {
    PyObject *o_out, *o_inp, *o_w, *o_b = Py_None, *o_stride = Py_None, *o_pad = Py_None, *o_dil = Py_None;
    PyObject *o_act = Py_None;
    long long groups = 1;
    double alpha = 0.0;
    int sum = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOO|OOOOLOdp:conv2d_forward",
                                     KW("out", "inp", "weight", "bias", "stride", "padding", "dilation", "groups",
                                        "act", "alpha", "sum"),
                                     &o_out, &o_inp, &o_w, &o_b, &o_stride, &o_pad, &o_dil, &groups, &o_act, &alpha,
                                     &sum))
        return NULL;
    ft_module_state *st = ft_py_state(m);
    const ft_tensor *inp, *w, *b;
    out_arg out;
    ft_conv2d_params p;
    ft_conv2d_fusion fusion = {.sum = sum};
    if (parse_conv(o_stride, o_pad, o_dil, groups, &p) < 0 || parse_act(o_act, alpha, &fusion.act) < 0 ||
        parse_in(st, o_inp, "inp", false, &inp) < 0 || parse_in(st, o_w, "weight", false, &w) < 0 ||
        parse_in(st, o_b, "bias", true, &b) < 0 || parse_out(st, o_out, "out", false, &out) < 0)
        return NULL;
    if (needs_alloc(&out)) {
        int64_t P = 0, Q = 0;
        ft_status s = inp->ndim == 4 && w->ndim == 4
                          ? ft_conv2d_out_size(&P, &Q, inp->shape[2], inp->shape[3], w->shape[2], w->shape[3], &p)
                          : ft_fail(FT_ERR_SHAPE, "conv2d: input and weight must be 4-d");
        if (s != FT_OK)
            return ft_py_raise(s);
        if (alloc_out(st, &out, inp, 4, (int64_t[]){inp->shape[0], w->shape[0], P, Q}, inp->dtype) < 0)
            return NULL;
    }
    ft_status s;
    CALL(s, true, ft_conv2d_forward(out.t, inp, w, b, &p, &fusion));
    return finish(s, &out, 1);
}

/* conv2d_backward and conv_transpose2d_backward: the same arguments; the bias gradient has the output's
 * channels, the weight's first dimension for a convolution and its second (times groups) for a transposed one. */
static PyObject *conv_backward(PyObject *m, PyObject *args, PyObject *kw, bool transposed) {
    PyObject *o_dinp, *o_dw, *o_db, *o_dout, *o_inp, *o_w, *o_stride = Py_None, *o_pad = Py_None, *o_dil = Py_None;
    long long groups = 1;
    int accumulate = 0;
    const char *op = transposed ? "conv_transpose2d_backward" : "conv2d_backward";
    if (!PyArg_ParseTupleAndKeywords(args, kw, transposed ? "OOOOOO|OOOLp:conv_transpose2d_backward"
                                                          : "OOOOOO|OOOLp:conv2d_backward",
                                     KW("dinp", "dweight", "dbias", "dout", "inp", "weight", "stride", "padding",
                                        "dilation", "groups", "accumulate"),
                                     &o_dinp, &o_dw, &o_db, &o_dout, &o_inp, &o_w, &o_stride, &o_pad, &o_dil, &groups,
                                     &accumulate))
        return NULL;
    ft_module_state *st = ft_py_state(m);
    const ft_tensor *dout, *inp, *w;
    out_arg o[3] = {{0}};
    ft_conv2d_params p;
    if (parse_conv(o_stride, o_pad, o_dil, groups, &p) < 0 || parse_in(st, o_dout, "dout", false, &dout) < 0 ||
        parse_in(st, o_inp, "inp", false, &inp) < 0 || parse_in(st, o_w, "weight", false, &w) < 0 ||
        parse_out(st, o_dinp, "dinp", true, &o[0]) < 0 || parse_out(st, o_dw, "dweight", true, &o[1]) < 0 ||
        parse_out(st, o_db, "dbias", true, &o[2]) < 0 || alloc_like(st, &o[0], inp) < 0 ||
        alloc_out(st, &o[1], w, w->ndim, w->shape, FT_FLOAT32) < 0 ||
        alloc_out(st, &o[2], inp, 1, (int64_t[]){transposed ? (dout->ndim > 1 ? dout->shape[1] : 0) : w->shape[0]},
                  FT_FLOAT32) < 0) {
        drop_outs(o, 3);
        return NULL;
    }
    if (check_accumulate(o, 3, accumulate, op) < 0) {
        drop_outs(o, 3);
        return NULL;
    }
    ft_status s;
    CALL(s, true,
         (transposed ? ft_conv_transpose2d_backward : ft_conv2d_backward)(o[0].t, o[1].t, o[2].t, dout, inp, w, &p,
                                                                          ALL_ACC(accumulate)));
    return finish(s, o, 3);
}

static PyObject *py_conv2d_backward(PyObject *m, PyObject *args, PyObject *kw) {
    return conv_backward(m, args, kw, false);
}

static PyObject *py_conv_transpose2d_forward(PyObject *m, PyObject *args, PyObject *kw) {
    PyObject *o_out, *o_inp, *o_w, *o_b = Py_None, *o_stride = Py_None, *o_pad = Py_None, *o_dil = Py_None;
    PyObject *o_outpad = Py_None;
    long long groups = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOO|OOOOLO:conv_transpose2d_forward",
                                     KW("out", "inp", "weight", "bias", "stride", "padding", "dilation", "groups",
                                        "output_padding"),
                                     &o_out, &o_inp, &o_w, &o_b, &o_stride, &o_pad, &o_dil, &groups, &o_outpad))
        return NULL;
    ft_module_state *st = ft_py_state(m);
    const ft_tensor *inp, *w, *b;
    out_arg out;
    ft_conv2d_params p;
    static const int64_t zero[2] = {0, 0};
    int64_t outpad[2];
    if (parse_conv(o_stride, o_pad, o_dil, groups, &p) < 0 ||
        parse_pair(o_outpad, "output_padding", zero, outpad) < 0 || parse_in(st, o_inp, "inp", false, &inp) < 0 ||
        parse_in(st, o_w, "weight", false, &w) < 0 || parse_in(st, o_b, "bias", true, &b) < 0 ||
        parse_out(st, o_out, "out", false, &out) < 0)
        return NULL;
    if (needs_alloc(&out)) {
        if (inp->ndim != 4 || w->ndim != 4)
            return PyErr_Format(PyExc_ValueError, "conv_transpose2d: input and weight must be 4-d");
        int64_t size[2];
        for (int d = 0; d < 2; d++)
            size[d] = (inp->shape[2 + d] - 1) * p.stride[d] - 2 * p.padding[d] + p.dilation[d] * (w->shape[2 + d] - 1) +
                      outpad[d] + 1;
        if (alloc_out(st, &out, inp, 4, (int64_t[]){inp->shape[0], w->shape[1] * groups, size[0], size[1]},
                      inp->dtype) < 0)
            return NULL;
    }
    ft_status s;
    CALL(s, true, ft_conv_transpose2d_forward(out.t, inp, w, b, &p));
    return finish(s, &out, 1);
}

static PyObject *py_conv_transpose2d_backward(PyObject *m, PyObject *args, PyObject *kw) {
    return conv_backward(m, args, kw, true);
}

static PyObject *py_linear_forward(PyObject *m, PyObject *args, PyObject *kw) {
    PyObject *o_out, *o_inp, *o_w, *o_b = Py_None, *o_act = Py_None;
    double alpha = 0.0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOO|OOd:linear_forward",
                                     KW("out", "inp", "weight", "bias", "act", "alpha"), &o_out, &o_inp, &o_w, &o_b,
                                     &o_act, &alpha))
        return NULL;
    ft_module_state *st = ft_py_state(m);
    const ft_tensor *inp, *w, *b;
    out_arg out;
    ft_act act;
    if (parse_act(o_act, alpha, &act) < 0 || parse_in(st, o_inp, "inp", false, &inp) < 0 ||
        parse_in(st, o_w, "weight", false, &w) < 0 || parse_in(st, o_b, "bias", true, &b) < 0 ||
        parse_out(st, o_out, "out", false, &out) < 0)
        return NULL;
    if (needs_alloc(&out) &&
        alloc_on(st, &out, inp, 2, (int64_t[]){inp->ndim ? inp->shape[0] : 0, w->ndim ? w->shape[0] : 0},
                 inp->dtype) < 0)
        return NULL;
    ft_status s;
    CALL(s, big(inp) || big(w), ft_linear_forward(out.t, inp, w, b, act));
    return finish(s, &out, 1);
}

static PyObject *py_linear_backward(PyObject *m, PyObject *args, PyObject *kw) {
    PyObject *o_dinp, *o_dw, *o_db, *o_dout, *o_inp, *o_w;
    int accumulate = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOOOO|p:linear_backward",
                                     KW("dinp", "dweight", "dbias", "dout", "inp", "weight", "accumulate"), &o_dinp,
                                     &o_dw, &o_db, &o_dout, &o_inp, &o_w, &accumulate))
        return NULL;
    ft_module_state *st = ft_py_state(m);
    const ft_tensor *dout, *inp, *w;
    out_arg o[3] = {{0}};
    if (parse_in(st, o_dout, "dout", false, &dout) < 0 || parse_in(st, o_inp, "inp", false, &inp) < 0 ||
        parse_in(st, o_w, "weight", false, &w) < 0 || parse_out(st, o_dinp, "dinp", true, &o[0]) < 0 ||
        parse_out(st, o_dw, "dweight", true, &o[1]) < 0 || parse_out(st, o_db, "dbias", true, &o[2]) < 0 ||
        alloc_on(st, &o[0], inp, inp->ndim, inp->shape, inp->dtype) < 0 ||
        alloc_on(st, &o[1], w, w->ndim, w->shape, FT_FLOAT32) < 0 ||
        alloc_on(st, &o[2], inp, 1, &w->shape[0], FT_FLOAT32) < 0) {
        drop_outs(o, 3);
        return NULL;
    }
    if (check_accumulate(o, 3, accumulate, "linear_backward") < 0) {
        drop_outs(o, 3);
        return NULL;
    }
    ft_status s;
    CALL(s, big(inp) || big(w), ft_linear_backward(o[0].t, o[1].t, o[2].t, dout, inp, w, ALL_ACC(accumulate)));
    return finish(s, o, 3);
}

/* ======================= normalization ======================= */

static PyObject *py_batch_norm_forward(PyObject *m, PyObject *args, PyObject *kw) {
    PyObject *o_out, *o_mean, *o_invstd, *o_inp, *o_w = Py_None, *o_b = Py_None, *o_rm = Py_None, *o_rv = Py_None;
    PyObject *o_act = Py_None;
    ft_batchnorm_params p = {.training = true, .eps = 1e-5, .momentum = 0.1};
    int training = 1;
    double alpha = 0.0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOO|OOOOpddOd:batch_norm_forward",
                                     KW("out", "save_mean", "save_invstd", "inp", "weight", "bias", "running_mean",
                                        "running_var", "training", "momentum", "eps", "act", "alpha"),
                                     &o_out, &o_mean, &o_invstd, &o_inp, &o_w, &o_b, &o_rm, &o_rv, &training,
                                     &p.momentum, &p.eps, &o_act, &alpha))
        return NULL;
    p.training = training;
    ft_module_state *st = ft_py_state(m);
    const ft_tensor *inp, *w, *b, *rm, *rv;
    out_arg o[3] = {{0}};
    if (parse_act(o_act, alpha, &p.act) < 0 || parse_in(st, o_inp, "inp", false, &inp) < 0 ||
        parse_in(st, o_w, "weight", true, &w) < 0 || parse_in(st, o_b, "bias", true, &b) < 0 ||
        parse_in(st, o_rm, "running_mean", true, &rm) < 0 || parse_in(st, o_rv, "running_var", true, &rv) < 0 ||
        parse_out(st, o_out, "out", false, &o[0]) < 0 || parse_out(st, o_mean, "save_mean", false, &o[1]) < 0 ||
        parse_out(st, o_invstd, "save_invstd", false, &o[2]) < 0)
        return NULL;
    int64_t C = inp->ndim >= 2 ? inp->shape[1] : 0;
    if (alloc_like(st, &o[0], inp) < 0 || alloc_out(st, &o[1], inp, 1, &C, FT_FLOAT32) < 0 ||
        alloc_out(st, &o[2], inp, 1, &C, FT_FLOAT32) < 0) {
        drop_outs(o, 3);
        return NULL;
    }
    ft_status s;
    CALL(s, big(inp), ft_batchnorm_forward(o[0].t, o[1].t, o[2].t, inp, w, b, rm, rv, &p));
    return finish(s, o, 3);
}

static PyObject *py_batch_norm_backward(PyObject *m, PyObject *args, PyObject *kw) {
    PyObject *o_dinp, *o_dw, *o_db, *o_dout, *o_inp, *o_out = Py_None, *o_w = Py_None, *o_b = Py_None, *o_mean;
    PyObject *o_invstd, *o_act = Py_None;
    ft_batchnorm_params p = {.training = true, .eps = 1e-5, .momentum = 0.1};
    int training = 1, accumulate = 0;
    double alpha = 0.0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOOOOOOOO|pOdp:batch_norm_backward",
                                     KW("dinp", "dweight", "dbias", "dout", "inp", "out", "weight", "bias",
                                        "save_mean", "save_invstd", "training", "act", "alpha", "accumulate"),
                                     &o_dinp, &o_dw, &o_db, &o_dout, &o_inp, &o_out, &o_w, &o_b, &o_mean,
                                     &o_invstd, &training, &o_act, &alpha, &accumulate))
        return NULL;
    p.training = training;
    ft_module_state *st = ft_py_state(m);
    const ft_tensor *dout, *inp, *out, *w, *b, *mean, *invstd;
    out_arg o[3] = {{0}};
    if (parse_act(o_act, alpha, &p.act) < 0 || parse_in(st, o_dout, "dout", false, &dout) < 0 ||
        parse_in(st, o_inp, "inp", false, &inp) < 0 || parse_in(st, o_out, "out", true, &out) < 0 ||
        parse_in(st, o_w, "weight", true, &w) < 0 || parse_in(st, o_b, "bias", true, &b) < 0 ||
        parse_in(st, o_mean, "save_mean", false, &mean) < 0 ||
        parse_in(st, o_invstd, "save_invstd", false, &invstd) < 0 ||
        parse_out(st, o_dinp, "dinp", true, &o[0]) < 0 || parse_out(st, o_dw, "dweight", true, &o[1]) < 0 ||
        parse_out(st, o_db, "dbias", true, &o[2]) < 0)
        return NULL;
    int64_t C = inp->ndim >= 2 ? inp->shape[1] : 0;
    if (alloc_like(st, &o[0], inp) < 0 || alloc_out(st, &o[1], inp, 1, &C, FT_FLOAT32) < 0 ||
        alloc_out(st, &o[2], inp, 1, &C, FT_FLOAT32) < 0) {
        drop_outs(o, 3);
        return NULL;
    }
    if (check_accumulate(o, 3, accumulate, "batch_norm_backward") < 0) {
        drop_outs(o, 3);
        return NULL;
    }
    ft_status s;
    CALL(s, big(inp),
         ft_batchnorm_backward(o[0].t, o[1].t, o[2].t, dout, inp, out, w, b, mean, invstd, &p,
                               ALL_ACC(accumulate)));
    return finish(s, o, 3);
}

static int parse_norm_size(PyObject *obj, int64_t *D) {
    int64_t shape[FT_MAX_DIMS];
    int n;
    if (parse_shape_arg(obj, "normalized_shape", shape, &n) < 0)
        return -1;
    *D = 1;
    for (int i = 0; i < n; i++)
        *D *= shape[i];
    return 0;
}

static PyObject *py_layer_norm_forward(PyObject *m, PyObject *args, PyObject *kw) {
    PyObject *o_out, *o_mean, *o_rstd, *o_inp, *o_w = Py_None, *o_b = Py_None, *o_shape;
    double eps = 1e-5;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOOOOO|d:layer_norm_forward",
                                     KW("out", "save_mean", "save_rstd", "inp", "weight", "bias", "normalized_shape",
                                        "eps"),
                                     &o_out, &o_mean, &o_rstd, &o_inp, &o_w, &o_b, &o_shape, &eps))
        return NULL;
    ft_module_state *st = ft_py_state(m);
    const ft_tensor *inp, *w, *b;
    out_arg o[3] = {{0}};
    int64_t D;
    if (parse_norm_size(o_shape, &D) < 0 || parse_in(st, o_inp, "inp", false, &inp) < 0 ||
        parse_in(st, o_w, "weight", true, &w) < 0 || parse_in(st, o_b, "bias", true, &b) < 0 ||
        parse_out(st, o_out, "out", false, &o[0]) < 0 || parse_out(st, o_mean, "save_mean", true, &o[1]) < 0 ||
        parse_out(st, o_rstd, "save_rstd", true, &o[2]) < 0)
        return NULL;
    int64_t R = D > 0 ? ft_tensor_numel(inp) / D : 0;
    if (alloc_out(st, &o[0], inp, inp->ndim, inp->shape, inp->dtype) < 0 ||
        alloc_out(st, &o[1], inp, 1, &R, FT_FLOAT32) < 0 || alloc_out(st, &o[2], inp, 1, &R, FT_FLOAT32) < 0) {
        drop_outs(o, 3);
        return NULL;
    }
    ft_status s;
    CALL(s, big(inp), ft_layernorm_forward(o[0].t, o[1].t, o[2].t, inp, w, b, D, eps));
    return finish(s, o, 3);
}

static PyObject *py_layer_norm_backward(PyObject *m, PyObject *args, PyObject *kw) {
    PyObject *o_dinp, *o_dw, *o_db, *o_dout, *o_inp, *o_w, *o_mean, *o_rstd, *o_shape;
    int accumulate = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOOOOOOO|p:layer_norm_backward",
                                     KW("dinp", "dweight", "dbias", "dout", "inp", "weight", "save_mean", "save_rstd",
                                        "normalized_shape", "accumulate"),
                                     &o_dinp, &o_dw, &o_db, &o_dout, &o_inp, &o_w, &o_mean, &o_rstd, &o_shape,
                                     &accumulate))
        return NULL;
    ft_module_state *st = ft_py_state(m);
    const ft_tensor *dout, *inp, *w, *mean, *rstd;
    out_arg o[3] = {{0}};
    int64_t D;
    if (parse_norm_size(o_shape, &D) < 0 || parse_in(st, o_dout, "dout", false, &dout) < 0 ||
        parse_in(st, o_inp, "inp", false, &inp) < 0 || parse_in(st, o_w, "weight", true, &w) < 0 ||
        parse_in(st, o_mean, "save_mean", false, &mean) < 0 || parse_in(st, o_rstd, "save_rstd", false, &rstd) < 0 ||
        parse_out(st, o_dinp, "dinp", true, &o[0]) < 0 || parse_out(st, o_dw, "dweight", true, &o[1]) < 0 ||
        parse_out(st, o_db, "dbias", true, &o[2]) < 0)
        return NULL;
    if (alloc_out(st, &o[0], inp, inp->ndim, inp->shape, inp->dtype) < 0 ||
        alloc_out(st, &o[1], inp, 1, &D, FT_FLOAT32) < 0 || alloc_out(st, &o[2], inp, 1, &D, FT_FLOAT32) < 0) {
        drop_outs(o, 3);
        return NULL;
    }
    if (check_accumulate(o, 3, accumulate, "layer_norm_backward") < 0) {
        drop_outs(o, 3);
        return NULL;
    }
    ft_status s;
    CALL(s, big(inp), ft_layernorm_backward(o[0].t, o[1].t, o[2].t, dout, inp, w, mean, rstd, D, ALL_ACC(accumulate)));
    return finish(s, o, 3);
}

/* ======================= group norm, embedding, upsampling ======================= */

static PyObject *py_group_norm_forward(PyObject *m, PyObject *args, PyObject *kw) {
    PyObject *o_out, *o_mean, *o_rstd, *o_inp, *o_w, *o_b;
    long long groups;
    double eps = 1e-5;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOOOOL|d:group_norm_forward",
                                     KW("out", "save_mean", "save_rstd", "inp", "weight", "bias", "num_groups",
                                        "eps"),
                                     &o_out, &o_mean, &o_rstd, &o_inp, &o_w, &o_b, &groups, &eps))
        return NULL;
    ft_module_state *st = ft_py_state(m);
    const ft_tensor *inp, *w, *b;
    out_arg o[3] = {{0}};
    if (parse_in(st, o_inp, "inp", false, &inp) < 0 || parse_in(st, o_w, "weight", true, &w) < 0 ||
        parse_in(st, o_b, "bias", true, &b) < 0 || parse_out(st, o_out, "out", false, &o[0]) < 0 ||
        parse_out(st, o_mean, "save_mean", true, &o[1]) < 0 || parse_out(st, o_rstd, "save_rstd", true, &o[2]) < 0)
        return NULL;
    /* (N, G); a bad group count allocates nothing and is reported by the op */
    int64_t NG[2] = {inp->ndim ? inp->shape[0] : 0, groups > 0 ? groups : 0};
    if (alloc_like(st, &o[0], inp) < 0 || alloc_on(st, &o[1], inp, 2, NG, FT_FLOAT32) < 0 ||
        alloc_on(st, &o[2], inp, 2, NG, FT_FLOAT32) < 0) {
        drop_outs(o, 3);
        return NULL;
    }
    ft_status s;
    CALL(s, big(inp), ft_group_norm_forward(o[0].t, o[1].t, o[2].t, inp, w, b, groups, eps));
    return finish(s, o, 3);
}

static PyObject *py_group_norm_backward(PyObject *m, PyObject *args, PyObject *kw) {
    PyObject *o_dinp, *o_dw, *o_db, *o_dout, *o_inp, *o_mean, *o_rstd, *o_w;
    long long groups;
    int accumulate = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOOOOOOL|p:group_norm_backward",
                                     KW("dinp", "dweight", "dbias", "dout", "inp", "save_mean", "save_rstd",
                                        "weight", "num_groups", "accumulate"),
                                     &o_dinp, &o_dw, &o_db, &o_dout, &o_inp, &o_mean, &o_rstd, &o_w, &groups,
                                     &accumulate))
        return NULL;
    ft_module_state *st = ft_py_state(m);
    const ft_tensor *dout, *inp, *w, *mean, *rstd;
    out_arg o[3] = {{0}};
    if (parse_in(st, o_dout, "dout", false, &dout) < 0 || parse_in(st, o_inp, "inp", false, &inp) < 0 ||
        parse_in(st, o_mean, "save_mean", false, &mean) < 0 || parse_in(st, o_rstd, "save_rstd", false, &rstd) < 0 ||
        parse_in(st, o_w, "weight", true, &w) < 0 || parse_out(st, o_dinp, "dinp", true, &o[0]) < 0 ||
        parse_out(st, o_dw, "dweight", true, &o[1]) < 0 || parse_out(st, o_db, "dbias", true, &o[2]) < 0)
        return NULL;
    int64_t C = inp->ndim >= 2 ? inp->shape[1] : 0;
    if (alloc_like(st, &o[0], inp) < 0 || alloc_on(st, &o[1], inp, 1, &C, FT_FLOAT32) < 0 ||
        alloc_on(st, &o[2], inp, 1, &C, FT_FLOAT32) < 0 || check_accumulate(o, 3, accumulate,
                                                                            "group_norm_backward") < 0) {
        drop_outs(o, 3);
        return NULL;
    }
    ft_status s;
    CALL(s, big(inp), ft_group_norm_backward(o[0].t, o[1].t, o[2].t, dout, inp, mean, rstd, w, groups,
                                             ALL_ACC(accumulate)));
    return finish(s, o, 3);
}

/* padding_idx: None (-1: none) or a row, negative counting from the end (PyTorch's). */
static int parse_padding(PyObject *obj, int64_t V, const char *op, int64_t *p) {
    *p = -1;
    if (obj == Py_None)
        return 0;
    long long v = PyLong_AsLongLong(obj);
    if (v == -1 && PyErr_Occurred())
        return -1;
    if (v < -V || v >= V) {
        PyErr_Format(PyExc_ValueError, "%s: padding_idx must be within the %lld rows of the weight, got %lld", op,
                     (long long)V, v);
        return -1;
    }
    *p = v < 0 ? v + V : v;
    return 0;
}

static PyObject *py_embedding_forward(PyObject *m, PyObject *args, PyObject *kw) {
    PyObject *o_out, *o_ids, *o_w, *o_pad = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOO|O:embedding_forward", KW("out", "ids", "weight", "padding_idx"),
                                     &o_out, &o_ids, &o_w, &o_pad))
        return NULL;
    ft_module_state *st = ft_py_state(m);
    const ft_tensor *ids, *w;
    out_arg out;
    int64_t pad;
    if (parse_in(st, o_ids, "ids", false, &ids) < 0 || parse_in(st, o_w, "weight", false, &w) < 0 ||
        parse_out(st, o_out, "out", false, &out) < 0)
        return NULL;
    ft_status s = ft_check_ndim("embedding", "weight", w, 2, "(V, D)");
    if (s != FT_OK)
        return ft_py_raise(s);
    if (parse_padding(o_pad, w->shape[0], "embedding", &pad) < 0)
        return NULL;
    if (needs_alloc(&out)) {
        if (ids->ndim >= FT_MAX_DIMS)
            return PyErr_Format(PyExc_ValueError, "embedding: ids may have at most %d dimensions, got %d",
                                FT_MAX_DIMS - 1, ids->ndim);
        int64_t shape[FT_MAX_DIMS];
        memcpy(shape, ids->shape, (size_t)ids->ndim * sizeof *shape);
        shape[ids->ndim] = w->shape[1];
        if (alloc_on(st, &out, w, ids->ndim + 1, shape, FT_FLOAT32) < 0)
            return NULL;
    }
    CALL(s, big(out.t), ft_embedding_forward(out.t, ids, w, pad));
    return finish(s, &out, 1);
}

static PyObject *py_one_hot_forward(PyObject *m, PyObject *args, PyObject *kw) {
    PyObject *o_out, *o_ids, *o_num = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|O:one_hot_forward", KW("out", "ids", "num_classes"), &o_out,
                                     &o_ids, &o_num))
        return NULL;
    ft_module_state *st = ft_py_state(m);
    const ft_tensor *ids;
    out_arg out;
    if (parse_in(st, o_ids, "ids", false, &ids) < 0 || parse_out(st, o_out, "out", false, &out) < 0)
        return NULL;
    if (needs_alloc(&out)) {
        long long C = o_num == Py_None ? -1 : PyLong_AsLongLong(o_num);
        if (C == -1 && PyErr_Occurred())
            return NULL;
        if (C < 0)
            return PyErr_Format(PyExc_ValueError, "one_hot_forward: give num_classes (>= 0) to allocate out");
        if (ids->ndim >= FT_MAX_DIMS)
            return PyErr_Format(PyExc_ValueError, "one_hot_forward: ids may have at most %d dimensions, got %d",
                                FT_MAX_DIMS - 1, ids->ndim);
        int64_t shape[FT_MAX_DIMS];
        memcpy(shape, ids->shape, (size_t)ids->ndim * sizeof *shape);
        shape[ids->ndim] = C;
        if (alloc_on(st, &out, ids, ids->ndim + 1, shape, FT_FLOAT32) < 0)
            return NULL;
    }
    ft_status s;
    CALL(s, big(out.t), ft_one_hot_forward(out.t, ids));
    return finish(s, &out, 1);
}

static PyObject *py_embedding_backward(PyObject *m, PyObject *args, PyObject *kw) {
    PyObject *o_dw, *o_dout, *o_ids, *o_num = Py_None, *o_pad = Py_None;
    int accumulate = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOO|OOp:embedding_backward",
                                     KW("dweight", "dout", "ids", "num_weights", "padding_idx", "accumulate"),
                                     &o_dw, &o_dout, &o_ids, &o_num, &o_pad, &accumulate))
        return NULL;
    ft_module_state *st = ft_py_state(m);
    const ft_tensor *dout, *ids;
    out_arg dw;
    int64_t pad;
    if (parse_in(st, o_dout, "dout", false, &dout) < 0 || parse_in(st, o_ids, "ids", false, &ids) < 0 ||
        parse_out(st, o_dw, "dweight", false, &dw) < 0)
        return NULL;
    if (needs_alloc(&dw)) {
        long long V = o_num == Py_None ? -1 : PyLong_AsLongLong(o_num);
        if (V == -1 && PyErr_Occurred())
            return NULL;
        if (V < 0 || dout->ndim < 1)
            return PyErr_Format(PyExc_ValueError, "embedding_backward: num_weights (a non-negative int) is needed "
                                                  "to allocate dweight, and dout must have a last dimension D");
        int64_t shape[2] = {V, dout->shape[dout->ndim - 1]};
        if (alloc_on(st, &dw, dout, 2, shape, FT_FLOAT32) < 0)
            return NULL;
    }
    if (check_accumulate(&dw, 1, accumulate, "embedding_backward") < 0 ||
        parse_padding(o_pad, dw.t->ndim ? dw.t->shape[0] : 0, "embedding_backward", &pad) < 0) {
        drop_outs(&dw, 1);
        return NULL;
    }
    ft_status s;
    CALL(s, big(dw.t) || big(dout), ft_embedding_backward(dw.t, dout, ids, pad, accumulate));
    return finish(s, &dw, 1);
}

static int parse_scales(PyObject *obj, const char *op, int64_t v[2]) {
    if (parse_pair(obj, "scale_factor", NULL, v) < 0)
        return -1;
    if (v[0] < 1 || v[1] < 1) {
        PyErr_Format(PyExc_ValueError, "%s: the scale factors must be positive integers, got (%lld, %lld)", op,
                     (long long)v[0], (long long)v[1]);
        return -1;
    }
    return 0;
}

static PyObject *py_upsample_nearest2d_forward(PyObject *m, PyObject *args, PyObject *kw) {
    PyObject *o_out, *o_inp, *o_scale;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOO:upsample_nearest2d_forward", KW("out", "inp", "scale_factor"),
                                     &o_out, &o_inp, &o_scale))
        return NULL;
    ft_module_state *st = ft_py_state(m);
    const ft_tensor *inp;
    out_arg out;
    int64_t sc[2];
    if (parse_scales(o_scale, "upsample_nearest2d", sc) < 0 || parse_in(st, o_inp, "inp", false, &inp) < 0 ||
        parse_out(st, o_out, "out", false, &out) < 0)
        return NULL;
    ft_status s;
    if (needs_alloc(&out)) {
        if ((s = ft_check_ndim("upsample_nearest2d", "input", inp, 4, "(N, C, H, W)")) != FT_OK)
            return ft_py_raise(s);
        int64_t shape[4] = {inp->shape[0], inp->shape[1], inp->shape[2] * sc[0], inp->shape[3] * sc[1]};
        if (alloc_out(st, &out, inp, 4, shape, inp->dtype) < 0)
            return NULL;
    }
    CALL(s, big(out.t), ft_upsample_nearest2d_forward(out.t, inp, sc[0], sc[1]));
    return finish(s, &out, 1);
}

static PyObject *py_upsample_nearest2d_backward(PyObject *m, PyObject *args, PyObject *kw) {
    PyObject *o_dinp, *o_dout, *o_scale;
    int accumulate = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOO|p:upsample_nearest2d_backward",
                                     KW("dinp", "dout", "scale_factor", "accumulate"), &o_dinp, &o_dout, &o_scale,
                                     &accumulate))
        return NULL;
    ft_module_state *st = ft_py_state(m);
    const ft_tensor *dout;
    out_arg dinp;
    int64_t sc[2];
    if (parse_scales(o_scale, "upsample_nearest2d_backward", sc) < 0 ||
        parse_in(st, o_dout, "dout", false, &dout) < 0 || parse_out(st, o_dinp, "dinp", false, &dinp) < 0)
        return NULL;
    ft_status s;
    if (needs_alloc(&dinp)) {
        if ((s = ft_check_ndim("upsample_nearest2d_backward", "grad_output", dout, 4, "(N, C, H, W)")) != FT_OK)
            return ft_py_raise(s);
        if (dout->shape[2] % sc[0] || dout->shape[3] % sc[1])
            return PyErr_Format(PyExc_ValueError, "upsample_nearest2d_backward: grad_output's size %lld x %lld is "
                                                  "not a multiple of the scale factors (%lld, %lld)",
                                (long long)dout->shape[2], (long long)dout->shape[3], (long long)sc[0],
                                (long long)sc[1]);
        int64_t shape[4] = {dout->shape[0], dout->shape[1], dout->shape[2] / sc[0], dout->shape[3] / sc[1]};
        if (alloc_out(st, &dinp, dout, 4, shape, dout->dtype) < 0)
            return NULL;
    }
    if (check_accumulate(&dinp, 1, accumulate, "upsample_nearest2d_backward") < 0) {
        drop_outs(&dinp, 1);
        return NULL;
    }
    CALL(s, big(dout), ft_upsample_nearest2d_backward(dinp.t, dout, sc[0], sc[1], accumulate));
    return finish(s, &dinp, 1);
}

static PyObject *py_upsample_bilinear2d_forward(PyObject *m, PyObject *args, PyObject *kw) {
    PyObject *o_out, *o_inp, *o_size;
    int align_corners = 0;
    ft_bilinear2d_params p = {0.0, 0.0, false};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOO|pdd:upsample_bilinear2d_forward",
                                     KW("out", "inp", "size", "align_corners", "scale_h", "scale_w"), &o_out, &o_inp,
                                     &o_size, &align_corners, &p.scale_h, &p.scale_w))
        return NULL;
    p.align_corners = align_corners;
    ft_module_state *st = ft_py_state(m);
    const ft_tensor *inp;
    out_arg out;
    int64_t size[2];
    if (parse_pair(o_size, "size", NULL, size) < 0 || parse_in(st, o_inp, "inp", false, &inp) < 0 ||
        parse_out(st, o_out, "out", false, &out) < 0)
        return NULL;
    ft_status s;
    if (needs_alloc(&out)) {
        if ((s = ft_check_ndim("upsample_bilinear2d", "input", inp, 4, "(N, C, H, W)")) != FT_OK)
            return ft_py_raise(s);
        int64_t shape[4] = {inp->shape[0], inp->shape[1], size[0], size[1]};
        if (alloc_out(st, &out, inp, 4, shape, inp->dtype) < 0)
            return NULL;
    }
    CALL(s, big(out.t), ft_upsample_bilinear2d_forward(out.t, inp, &p));
    return finish(s, &out, 1);
}

static PyObject *py_upsample_bilinear2d_backward(PyObject *m, PyObject *args, PyObject *kw) {
    PyObject *o_dinp, *o_dout, *o_size;
    int align_corners = 0, accumulate = 0;
    ft_bilinear2d_params p = {0.0, 0.0, false};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOO|pddp:upsample_bilinear2d_backward",
                                     KW("dinp", "dout", "input_size", "align_corners", "scale_h", "scale_w",
                                        "accumulate"),
                                     &o_dinp, &o_dout, &o_size, &align_corners, &p.scale_h, &p.scale_w, &accumulate))
        return NULL;
    p.align_corners = align_corners;
    ft_module_state *st = ft_py_state(m);
    const ft_tensor *dout;
    out_arg dinp;
    int64_t size[2];
    if (parse_pair(o_size, "input_size", NULL, size) < 0 || parse_in(st, o_dout, "dout", false, &dout) < 0 ||
        parse_out(st, o_dinp, "dinp", false, &dinp) < 0)
        return NULL;
    ft_status s;
    if (needs_alloc(&dinp)) {
        if ((s = ft_check_ndim("upsample_bilinear2d_backward", "grad_output", dout, 4, "(N, C, H, W)")) != FT_OK)
            return ft_py_raise(s);
        int64_t shape[4] = {dout->shape[0], dout->shape[1], size[0], size[1]};
        if (alloc_out(st, &dinp, dout, 4, shape, dout->dtype) < 0)
            return NULL;
    }
    if (check_accumulate(&dinp, 1, accumulate, "upsample_bilinear2d_backward") < 0) {
        drop_outs(&dinp, 1);
        return NULL;
    }
    CALL(s, big(dout), ft_upsample_bilinear2d_backward(dinp.t, dout, &p, accumulate));
    return finish(s, &dinp, 1);
}

/* ======================= attention ======================= */

/* scale=None (or omitted): 1 / sqrt(D); seed and offset place the dropout mask (as dropout_forward's). */
static int parse_sdpa(ft_module_state *st, PyObject *scale, int causal, double dropout_p, PyObject *seed,
                      PyObject *offset, PyObject *key_mask, PyObject *bias, ft_sdpa_params *p) {
    memset(p, 0, sizeof *p);
    if (key_mask && parse_in(st, key_mask, "key_mask", true, &p->key_mask) < 0)
        return -1;
    if (bias && parse_in(st, bias, "bias", true, &p->bias) < 0)
        return -1;
    p->causal = causal;
    p->dropout_p = dropout_p;
    p->seed = seed ? PyLong_AsUnsignedLongLongMask(seed) : 0;
    if (PyErr_Occurred())
        return -1;
    p->offset = offset ? PyLong_AsUnsignedLongLong(offset) : 0;
    if (PyErr_Occurred())
        return -1;
    if (!scale || scale == Py_None)
        return 0;
    p->scale = PyFloat_AsDouble(scale);
    if (p->scale == -1.0 && PyErr_Occurred())
        return -1;
    if (!(p->scale > 0)) {
        PyErr_Format(PyExc_ValueError, "sdpa: scale must be positive (or None for 1/sqrt(D)), got %R", scale);
        return -1;
    }
    return 0;
}

static PyObject *py_sdpa_forward(PyObject *m, PyObject *args, PyObject *kw) {
    PyObject *o_out, *o_lse, *o_q, *o_k, *o_v, *o_scale = NULL, *o_seed = NULL, *o_offset = NULL, *o_mask = NULL,
             *o_bias = NULL;
    int causal = 0;
    double dropout_p = 0.0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOOO|Op$dOOOO:sdpa_forward",
                                     KW("out", "lse", "q", "k", "v", "scale", "causal", "dropout_p", "seed", "offset",
                                        "key_mask", "bias"),
                                     &o_out, &o_lse, &o_q, &o_k, &o_v, &o_scale, &causal, &dropout_p, &o_seed,
                                     &o_offset, &o_mask, &o_bias))
        return NULL;
    ft_module_state *st = ft_py_state(m);
    const ft_tensor *q, *k, *v;
    out_arg o[2] = {{0}};
    ft_sdpa_params p;
    if (parse_sdpa(st, o_scale, causal, dropout_p, o_seed, o_offset, o_mask, o_bias, &p) < 0 ||
        parse_in(st, o_q, "q", false, &q) < 0 ||
        parse_in(st, o_k, "k", false, &k) < 0 || parse_in(st, o_v, "v", false, &v) < 0 ||
        parse_out(st, o_out, "out", false, &o[0]) < 0 || parse_out(st, o_lse, "lse", true, &o[1]) < 0)
        return NULL;
    /* a q of another rank gets no lse: the op then names what is wrong with q */
    if (alloc_like(st, &o[0], q) < 0 || (q->ndim == 4 && alloc_on(st, &o[1], q, 3, q->shape, FT_FLOAT32) < 0)) {
        drop_outs(o, 2);
        return NULL;
    }
    ft_status s;
    CALL(s, big(q) || big(k), ft_sdpa_forward(o[0].t, o[1].t, q, k, v, &p));
    return finish(s, o, 2);
}

static PyObject *py_sdpa_backward(PyObject *m, PyObject *args, PyObject *kw) {
    PyObject *o_dq, *o_dk, *o_dv, *o_dout, *o_q, *o_k, *o_v, *o_out, *o_lse, *o_scale = NULL, *o_seed = NULL,
             *o_offset = NULL, *o_mask = NULL, *o_bias = NULL, *o_dbias = Py_None;
    int causal = 0, accumulate = 0;
    double dropout_p = 0.0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOOOOOOO|Opp$dOOOOO:sdpa_backward",
                                     KW("dq", "dk", "dv", "dout", "q", "k", "v", "out", "lse", "scale", "causal",
                                        "accumulate", "dropout_p", "seed", "offset", "key_mask", "bias", "dbias"),
                                     &o_dq, &o_dk, &o_dv, &o_dout, &o_q, &o_k, &o_v, &o_out, &o_lse, &o_scale, &causal,
                                     &accumulate, &dropout_p, &o_seed, &o_offset, &o_mask, &o_bias, &o_dbias))
        return NULL;
    ft_module_state *st = ft_py_state(m);
    const ft_tensor *dout, *q, *k, *v, *out, *lse;
    out_arg o[4] = {{0}};
    ft_sdpa_params p;
    if (parse_sdpa(st, o_scale, causal, dropout_p, o_seed, o_offset, o_mask, o_bias, &p) < 0 ||
        parse_in(st, o_dout, "dout", false, &dout) < 0 ||
        parse_in(st, o_q, "q", false, &q) < 0 || parse_in(st, o_k, "k", false, &k) < 0 ||
        parse_in(st, o_v, "v", false, &v) < 0 || parse_in(st, o_out, "out", false, &out) < 0 ||
        parse_in(st, o_lse, "lse", false, &lse) < 0 || parse_out(st, o_dq, "dq", true, &o[0]) < 0 ||
        parse_out(st, o_dk, "dk", true, &o[1]) < 0 || parse_out(st, o_dv, "dv", true, &o[2]) < 0 ||
        parse_out(st, o_dbias == Py_None && !p.bias ? Py_False : o_dbias, "dbias", true, &o[3]) < 0)
        return NULL;
    /* with a bias, its gradient too: (N, H, Tq, Tk) in the bias's dtype */
    int64_t bshape[4] = {q->shape[0], q->shape[1], q->shape[2], k->ndim == 4 ? k->shape[2] : 0};
    if (alloc_like(st, &o[0], q) < 0 || alloc_like(st, &o[1], k) < 0 || alloc_like(st, &o[2], v) < 0 ||
        (p.bias && q->ndim == 4 && alloc_on(st, &o[3], q, 4, bshape, p.bias->dtype) < 0) ||
        check_accumulate(o, 4, accumulate, "sdpa_backward") < 0) {
        drop_outs(o, 4);
        return NULL;
    }
    ft_status s;
    CALL(s, big(q) || big(k),
         ft_sdpa_backward(o[0].t, o[1].t, o[2].t, o[3].t, dout, q, k, v, out, lse, &p,
                          (ft_sdpa_acc){accumulate, accumulate, accumulate, accumulate}));
    return finish(s, o, p.bias ? 4 : 3);
}

/* ======================= eager tensor math ======================= */

/* python/fasttrain/_math.py's device path: the op by name, the compute dtype
 * by code, PyTorch's promotion already applied by the caller. */

static int parse_dtype_code(int code, ft_dtype *dt) {
    if (!ft_dtype_valid(code)) {
        PyErr_Format(PyExc_ValueError, "invalid dtype code %d", code);
        return -1;
    }
    *dt = (ft_dtype)code;
    return 0;
}

/* math_pointwise(op, operands, dtype, shape) -> a new tensor of the
 * operands' broadcast shape on their device (bool for comparisons, else
 * dtype); ft_math_pointwise checks that each operand broadcasts to it. */
static PyObject *py_math_pointwise(PyObject *m, PyObject *args) {
    ft_module_state *st = ft_py_state(m);
    const char *name;
    PyObject *seq_obj, *shape_obj;
    int code;
    if (!PyArg_ParseTuple(args, "sOiO:math_pointwise", &name, &seq_obj, &code, &shape_obj))
        return NULL;
    ft_math_op op;
    ft_dtype compute;
    int64_t shape[FT_MAX_DIMS];
    int ndim;
    if (ft_math_op_of(name, &op) != FT_OK)
        return ft_py_raise(FT_ERR_VALUE);
    if (parse_dtype_code(code, &compute) < 0 || ft_py_parse_shape(shape_obj, shape, &ndim) < 0)
        return NULL;
    PyObject *seq = PySequence_Fast(seq_obj, "math_pointwise: operands must be a sequence");
    if (!seq)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    ft_math_arg a[3] = {{0}};
    const ft_tensor *ref = NULL;
    if (n != ft_math_arity(op)) {
        PyErr_Format(PyExc_ValueError, "math_pointwise: %s takes %d operands, got %zd", name, ft_math_arity(op), n);
        goto error;
    }
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *item = PySequence_Fast_GET_ITEM(seq, k);
        if (!PyObject_TypeCheck(item, st->tensor_base)) {
            if (ft_py_parse_scalar(item, &a[k].s, NULL) < 0)
                goto error;
            continue;
        }
        a[k].t = ft_py_unwrap(st, item, "operand");
        ref = ref ? ref : a[k].t;
    }
    if (!ref) {
        PyErr_Format(PyExc_TypeError, "math_pointwise: %s needs a tensor operand", name);
        goto error;
    }
    out_arg o;
    if (parse_out(st, Py_None, "out", false, &o) < 0 ||
        alloc_on(st, &o, ref, ndim, shape, ft_math_is_comparison(op) ? FT_BOOL : compute) < 0)
        goto error;
    ft_status s;
    CALL(s, big(o.t), ft_math_pointwise(o.t, op, compute, a, (int)n));
    Py_DECREF(seq);
    return finish(s, &o, 1);
error:
    Py_DECREF(seq);
    return NULL;
}

/* math_reduce(op, inp, shape, dtype, out_dtype, correction=0.0, indices=False) -> out, or (out, indices) */
static PyObject *py_math_reduce(PyObject *m, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"op", "inp", "shape", "dtype", "out_dtype", "correction", "indices", NULL};
    ft_module_state *st = ft_py_state(m);
    const char *name;
    PyObject *inp_obj, *shape_obj;
    int code, out_code, with_indices = 0;
    double correction = 0.0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "sOOii|dp:math_reduce", kwlist, &name, &inp_obj, &shape_obj, &code,
                                     &out_code, &correction, &with_indices))
        return NULL;
    ft_red_op op;
    ft_dtype compute, out_dtype;
    if (ft_red_op_of(name, &op) != FT_OK)
        return ft_py_raise(FT_ERR_VALUE);
    const ft_tensor *inp;
    int64_t shape[FT_MAX_DIMS];
    int ndim;
    if (parse_dtype_code(code, &compute) < 0 || parse_dtype_code(out_code, &out_dtype) < 0 ||
        parse_in(st, inp_obj, "inp", false, &inp) < 0 || ft_py_parse_shape(shape_obj, shape, &ndim) < 0)
        return NULL;
    out_arg o[2];
    if (parse_out(st, Py_None, "out", false, &o[0]) < 0 ||
        parse_out(st, with_indices ? Py_None : Py_False, "indices", true, &o[1]) < 0 ||
        alloc_on(st, &o[0], inp, ndim, shape, out_dtype) < 0 || alloc_on(st, &o[1], inp, ndim, shape, FT_INT64) < 0) {
        drop_outs(o, 2);
        return NULL;
    }
    ft_status s;
    CALL(s, big(inp), ft_math_reduce(o[0].t, o[1].t, inp, op, compute, correction));
    return finish(s, o, with_indices ? 2 : 1);
}

static PyMethodDef ops_methods[] = {
    {"conv2d_forward", FN(py_conv2d_forward), METH_VARARGS | METH_KEYWORDS,
     "conv2d_forward(out, inp, weight, bias=None, stride=1, padding=0, dilation=1, groups=1, act=None, alpha=0.0, "
     "sum=False) -> out"},
    {"conv2d_backward", FN(py_conv2d_backward), METH_VARARGS | METH_KEYWORDS,
     "conv2d_backward(dinp, dweight, dbias, dout, inp, weight, stride=1, padding=0, dilation=1, groups=1, "
     "accumulate=False) -> "
     "(dinp, dweight, dbias)"},
    KWFN(conv_transpose2d_forward, "conv_transpose2d_forward(out, inp, weight, bias=None, stride=1, padding=0, "
                                   "dilation=1, groups=1, output_padding=0) -> out"),
    KWFN(conv_transpose2d_backward, "conv_transpose2d_backward(dinp, dweight, dbias, dout, inp, weight, stride=1, "
                                    "padding=0, dilation=1, groups=1, accumulate=False) -> (dinp, dweight, dbias)"),
    {"linear_forward", FN(py_linear_forward), METH_VARARGS | METH_KEYWORDS,
     "linear_forward(out, inp, weight, bias=None, act=None, alpha=0.0) -> out"},
    {"linear_backward", FN(py_linear_backward), METH_VARARGS | METH_KEYWORDS,
     "linear_backward(dinp, dweight, dbias, dout, inp, weight, accumulate=False) -> (dinp, dweight, dbias)"},
    {"batch_norm_forward", FN(py_batch_norm_forward), METH_VARARGS | METH_KEYWORDS,
     "batch_norm_forward(out, save_mean, save_invstd, inp, weight=None, bias=None, running_mean=None, "
     "running_var=None, training=True, momentum=0.1, eps=1e-5, act=None, alpha=0.0) -> (out, save_mean, "
     "save_invstd)"},
    {"batch_norm_backward", FN(py_batch_norm_backward), METH_VARARGS | METH_KEYWORDS,
     "batch_norm_backward(dinp, dweight, dbias, dout, inp, out, weight, save_mean, save_invstd, training=True, "
     "act=None, alpha=0.0, accumulate=False) -> (dinp, dweight, dbias)"},
    {"layer_norm_forward", FN(py_layer_norm_forward), METH_VARARGS | METH_KEYWORDS,
     "layer_norm_forward(out, save_mean, save_rstd, inp, weight, bias, normalized_shape, eps=1e-5) -> (out, "
     "save_mean, save_rstd)"},
    {"layer_norm_backward", FN(py_layer_norm_backward), METH_VARARGS | METH_KEYWORDS,
     "layer_norm_backward(dinp, dweight, dbias, dout, inp, weight, save_mean, save_rstd, normalized_shape, "
     "accumulate=False) -> "
     "(dinp, dweight, dbias)"},
    KWFN(activation_forward, "activation_forward(out, inp, act, alpha=0.0) -> out"),
    KWFN(activation_backward,
         "activation_backward(dinp, dout, inp, out, act, alpha=0.0, accumulate=False) -> dinp"),
    KWFN(add_forward, "add_forward(out, a, b, act=None, alpha=0.0) -> out: act(a + b)"),
    KWFN(add_backward, "add_backward(da, db, dout, a=None, b=None, out=None, act=None, alpha=0.0, "
                       "accumulate_a=False, accumulate_b=False) -> (da, db)"),
    KWFN(mul_forward, "mul_forward(out, a, b) -> out"),
    KWFN(mul_backward, "mul_backward(da, db, dout, a, b, accumulate_a=False, accumulate_b=False) -> (da, db)"),
    KWFN(lstm_cell_forward, "lstm_cell_forward(c, gates, c_prev=None) -> c: sigmoid(f) c_prev + sigmoid(i) tanh(g) of "
                            "gates (N, 4H) in PyTorch's order (i, f, g, o)"),
    KWFN(lstm_cell_backward, "lstm_cell_backward(dgates, dc_prev, dc, gates, c_prev, accumulate_gates=False, "
                             "accumulate_c_prev=False) -> (dgates, dc_prev): dgates' i, f and g columns"),
    KWFN(lstm_hidden_forward, "lstm_hidden_forward(h, gates, c) -> h: sigmoid(o) tanh(c)"),
    KWFN(lstm_hidden_backward, "lstm_hidden_backward(dgates, dc, dh, gates, c, accumulate_gates=False, "
                               "accumulate_c=False) -> (dgates, dc): dgates' o column"),
    KWFN(concat_forward, "concat_forward(out, inputs, dim=1) -> out"),
    KWFN(concat_backward, "concat_backward(grads, dout, sizes, dim=1, accumulate=False) -> [grads]"),
    KWFN(dropout_forward, "dropout_forward(out, inp, p, seed, offset, span=1) -> out"),
    KWFN(dropout_backward, "dropout_backward(dinp, dout, p, seed, offset, accumulate=False, span=1) -> dinp"),
    {"dropout_blocks", py_dropout_blocks, METH_O, "dropout_blocks(numel) -> Philox blocks a mask uses"},
    KWFN(max_pool2d_forward, "max_pool2d_forward(out, indices, inp, kernel_size, stride=None, padding=0, "
                             "dilation=1, ceil_mode=False) -> (out, indices)"),
    KWFN(max_pool2d_backward, "max_pool2d_backward(dinp, dout, indices, input_size=None, accumulate=False) -> dinp"),
    KWFN(avg_pool2d_forward, "avg_pool2d_forward(out, inp, kernel_size, stride=None, padding=0, ceil_mode=False, "
                             "count_include_pad=True, divisor_override=None) -> out"),
    KWFN(avg_pool2d_backward, "avg_pool2d_backward(dinp, dout, input_size, kernel_size, stride=None, padding=0, "
                              "ceil_mode=False, count_include_pad=True, divisor_override=None, accumulate=False) "
                              "-> dinp"),
    KWFN(adaptive_avg_pool2d_forward, "adaptive_avg_pool2d_forward(out, inp, output_size=None) -> out"),
    KWFN(adaptive_avg_pool2d_backward,
         "adaptive_avg_pool2d_backward(dinp, dout, input_size=None, accumulate=False) -> dinp"),
    KWFN(adaptive_max_pool2d_forward,
         "adaptive_max_pool2d_forward(out, indices, inp, output_size=None) -> (out, indices)"),
    KWFN(adaptive_max_pool2d_backward,
         "adaptive_max_pool2d_backward(dinp, dout, indices, input_size=None, accumulate=False) -> dinp"),
    KWFN(softmax_forward, "softmax_forward(out, inp, dim) -> out"),
    KWFN(softmax_backward, "softmax_backward(dinp, dout, out, dim, accumulate=False) -> dinp"),
    KWFN(log_softmax_forward, "log_softmax_forward(out, inp, dim) -> out"),
    KWFN(log_softmax_backward, "log_softmax_backward(dinp, dout, out, dim, accumulate=False) -> dinp"),
    KWFN(cross_entropy_forward,
         "cross_entropy_forward(loss, dlogits, logits, target, weight=None, reduction='mean', ignore_index=-100, "
         "label_smoothing=0.0) -> (loss, dlogits)"),
    KWFN(cross_entropy_backward,
         "cross_entropy_backward(dlogits, dloss, logits, target, weight=None, reduction='mean', ignore_index=-100, "
         "label_smoothing=0.0, accumulate=False) -> dlogits"),
    KWFN(mse_loss_forward, "mse_loss_forward(loss, inp, target, reduction='mean') -> loss"),
    KWFN(mse_loss_backward, "mse_loss_backward(dinp, dtarget, dloss, inp, target, reduction='mean', "
                            "accumulate_inp=False, accumulate_target=False) -> (dinp, dtarget)"),
    KWFN(group_norm_forward, "group_norm_forward(out, save_mean, save_rstd, inp, weight, bias, num_groups, "
                             "eps=1e-5) -> (out, save_mean, save_rstd)"),
    KWFN(group_norm_backward, "group_norm_backward(dinp, dweight, dbias, dout, inp, save_mean, save_rstd, weight, "
                              "num_groups, accumulate=False) -> (dinp, dweight, dbias)"),
    KWFN(embedding_forward, "embedding_forward(out, ids, weight, padding_idx=None) -> out"),
    KWFN(one_hot_forward, "one_hot_forward(out, ids, num_classes=None) -> out (*ids.shape, C): 1.0 at each id"),
    KWFN(embedding_backward, "embedding_backward(dweight, dout, ids, num_weights=None, padding_idx=None, "
                             "accumulate=False) -> dweight"),
    KWFN(upsample_nearest2d_forward, "upsample_nearest2d_forward(out, inp, scale_factor) -> out"),
    KWFN(upsample_nearest2d_backward,
         "upsample_nearest2d_backward(dinp, dout, scale_factor, accumulate=False) -> dinp"),
    KWFN(upsample_bilinear2d_forward,
         "upsample_bilinear2d_forward(out, inp, size, align_corners=False, scale_h=0.0, scale_w=0.0) -> out"),
    KWFN(upsample_bilinear2d_backward, "upsample_bilinear2d_backward(dinp, dout, input_size, align_corners=False, "
                                       "scale_h=0.0, scale_w=0.0, accumulate=False) -> dinp"),
    KWFN(sdpa_forward, "sdpa_forward(out, lse, q, k, v, scale=None, causal=False, *, dropout_p=0.0, seed=0, offset=0, "
                       "key_mask=None) -> (out, lse): scaled dot-product attention; lse=False when no backward "
                       "follows. Dropout drops what dropout_forward(p, seed, offset) would of the (N, H, Tq, Tk) "
                       "probabilities; key_mask (N, Tk) bool is True where a key is masked out; bias (N, H, Tq, Tk) "
                       "(CPU; strides 0 where it broadcasts) is added to the scaled scores"),
    KWFN(sdpa_backward, "sdpa_backward(dq, dk, dv, dout, q, k, v, out, lse, scale=None, causal=False, "
                        "accumulate=False, *, dropout_p=0.0, seed=0, offset=0, key_mask=None, bias=None, "
                        "dbias=None) -> (dq, dk, dv), and dbias (the bias's gradient, contiguous) after them with a "
                        "bias"),
    {"math_pointwise", py_math_pointwise, METH_VARARGS,
     "math_pointwise(op, operands, dtype, shape) -> the elementwise op of tensors and numbers computed in dtype (a "
     "code), of their broadcast shape"},
    {"math_reduce", FN(py_math_reduce), METH_VARARGS | METH_KEYWORDS,
     "math_reduce(op, inp, shape, dtype, out_dtype, correction=0.0, indices=False) -> out or (out, indices): inp "
     "reduced to shape (inp's sizes or 1)"},
    {NULL, NULL, 0, NULL},
};

int ft_py_bind_ops(PyObject *module) { return PyModule_AddFunctions(module, ops_methods); }
