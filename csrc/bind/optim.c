/* Python bindings of csrc/optim/: the types _C.Optimizer and _C.EMA behind
 * ft.optim (python/fasttrain/optim/), and ft_py_optimizer_of for C training
 * steps.
 *
 * Both types keep a reference to every param tensor and to its storage: the
 * C objects point into that memory. Grads are lent for one step() call only,
 * so the C optimizer never holds a pointer into memory it does not own once
 * the call returns. */
#include "bind/bind.h"

#include "ops/check.h"
#include "optim/optim.h"

typedef struct {
    PyObject_HEAD
    ft_optimizer *opt;
    PyObject *params;       /* tuple of the param tensors, one per segment */
    ft_storage **storages;  /* one reference to each param's storage */
    bool busy;              /* a step runs without the GIL */
} optimizer_object;

typedef struct {
    PyObject_HEAD
    ft_ema *ema;
    PyObject *params;
    ft_storage **storages;
    bool busy;
} ema_object;

/* ---- shared: params ---- */

/* Checks the params (float32, contiguous, writable tensors, all on the
 * device of the first, which *device_out receives: the CPU when there are
 * none) and takes a reference to each one's storage; `what` names the caller
 * in messages. */
static int take_params(ft_module_state *st, PyObject *params, const char *what, PyObject **tuple_out,
                       ft_storage ***storages_out, ft_device *device_out) {
    PyObject *tuple = PySequence_Tuple(params);
    if (!tuple)
        return -1;
    Py_ssize_t n = PyTuple_GET_SIZE(tuple);
    if (n > INT_MAX) {
        Py_DECREF(tuple);
        PyErr_Format(PyExc_OverflowError, "%s: too many params (%zd)", what, n);
        return -1;
    }
    ft_storage **storages = PyMem_RawCalloc((size_t)(n ? n : 1), sizeof *storages);
    if (!storages) {
        Py_DECREF(tuple);
        PyErr_NoMemory();
        return -1;
    }
    char arg[32];
    ft_device device = FT_CPU;
    for (Py_ssize_t i = 0; i < n; i++) {
        snprintf(arg, sizeof arg, "param %zd", i);
        ft_tensor *t = ft_py_unwrap(st, PyTuple_GET_ITEM(tuple, i), arg);
        ft_status s = FT_OK;
        if (t) {
            if (i == 0)
                device = ft_op_device(t);
            s = ft_check_float_on(what, arg, t, device, "param 0", false);
            if (s == FT_OK && !ft_tensor_is_contiguous(t))
                s = ft_fail(FT_ERR_VALUE, "%s: %s must be contiguous (call .contiguous() before handing it over)",
                            what, arg);
            if (s == FT_OK)
                s = ft_tensor_check_writable(t, arg);
        }
        if (!t || s != FT_OK) {
            if (t)
                ft_py_raise(s);
            for (Py_ssize_t j = 0; j < i; j++)
                ft_storage_release(storages[j]);
            PyMem_RawFree(storages);
            Py_DECREF(tuple);
            return -1;
        }
        ft_storage_retain(t->storage);
        storages[i] = t->storage;
    }
    *tuple_out = tuple;
    *storages_out = storages;
    *device_out = device;
    return 0;
}

static void drop_params(PyObject **params, ft_storage ***storages) {
    if (*storages && *params)
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(*params); i++)
            ft_storage_release((*storages)[i]);
    PyMem_RawFree(*storages);
    *storages = NULL;
    Py_CLEAR(*params);
}

static float *param_data(PyObject *params, Py_ssize_t i) {
    return (float *)ft_tensor_data(&((ft_tensor_object *)PyTuple_GET_ITEM(params, i))->t);
}

static int64_t param_numel(PyObject *params, Py_ssize_t i) {
    return ft_tensor_numel(&((ft_tensor_object *)PyTuple_GET_ITEM(params, i))->t);
}

/* A 1-d float32 tensor over the whole of s, sharing it. */
static PyObject *wrap_flat(PyObject *self, ft_storage *s) {
    if (!s)
        Py_RETURN_NONE;
    ft_storage_retain(s);
    ft_tensor t = {.storage = s, .dtype = FT_FLOAT32, .ndim = 1,
                   .shape = {(int64_t)(s->nbytes / sizeof(float))}, .strides = {1}};
    return ft_py_wrap(ft_py_state_of_type(Py_TYPE(self)), &t);
}

/* what: "the optimizer", "the EMA" */
static int refuse_busy(bool busy, const char *what) {
    if (busy)
        PyErr_Format(PyExc_RuntimeError, "%s is running a step in another thread", what);
    return busy ? -1 : 0;
}

static int parse_kind(PyObject *obj, ft_optim_kind *out) {
    int kind = PyLong_Check(obj) ? (int)PyLong_AsLong(obj) : -1;
    if (kind == -1 && PyErr_Occurred())
        return -1;
    if (kind < FT_OPTIM_SGD || kind >= FT_OPTIM_NKINDS) {
        PyErr_Format(PyExc_ValueError, "unknown optimizer kind %R", obj);
        return -1;
    }
    *out = (ft_optim_kind)kind;
    return 0;
}

/* A group given as the tuple (lr, weight_decay, momentum, dampening,
 * nesterov, maximize, beta1, beta2, eps, amsgrad, trust_coefficient,
 * lars_exclude, alpha, centered, lr_decay, initial_accumulator_value,
 * momentum_decay, decoupled_weight_decay) that ft.optim builds from a
 * param_groups dict. */
int ft_py_parse_optim_group(PyObject *obj, ft_optim_group *g) {
    if (!PyTuple_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "an optimizer group must be a tuple, not %.100s", Py_TYPE(obj)->tp_name);
        return -1;
    }
    int nesterov, maximize, amsgrad, exclude, centered, decoupled;
    if (!PyArg_ParseTuple(obj, "ddddppdddpdpdpdddp;an optimizer group tuple", &g->lr, &g->weight_decay, &g->momentum,
                          &g->dampening, &nesterov, &maximize, &g->beta1, &g->beta2, &g->eps, &amsgrad,
                          &g->trust_coefficient, &exclude, &g->alpha, &centered, &g->lr_decay,
                          &g->initial_accumulator_value, &g->momentum_decay, &decoupled))
        return -1;
    g->decoupled_weight_decay = decoupled;
    g->nesterov = nesterov;
    g->maximize = maximize;
    g->amsgrad = amsgrad;
    g->lars_exclude = exclude;
    g->centered = centered;
    return 0;
}

/* ---- _C.Optimizer ---- */

#define OPT(self) ((optimizer_object *)(self))

static PyObject *optimizer_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"kind", "groups", "params", "group_of", NULL};
    PyObject *kind_obj, *groups_obj, *params_obj, *group_of_obj;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOO", kwlist, &kind_obj, &groups_obj, &params_obj, &group_of_obj))
        return NULL;
    ft_optim_kind kind;
    if (parse_kind(kind_obj, &kind) < 0)
        return NULL;
    optimizer_object *self = (optimizer_object *)type->tp_alloc(type, 0);
    if (!self)
        return NULL;
    ft_module_state *st = ft_py_state_of_type(type);
    PyObject *groups = NULL, *group_of = NULL;
    ft_optim_group *g = NULL;
    ft_optim_segment *segs = NULL;
    ft_device device;
    if (take_params(st, params_obj, ft_optim_kind_name(kind), &self->params, &self->storages, &device) < 0)
        goto error;
    groups = PySequence_Tuple(groups_obj);
    group_of = groups ? PySequence_Tuple(group_of_obj) : NULL;
    if (!group_of)
        goto error;
    Py_ssize_t ng = PyTuple_GET_SIZE(groups), ns = PyTuple_GET_SIZE(self->params);
    if (ng > INT_MAX || PyTuple_GET_SIZE(group_of) != ns) {
        PyErr_Format(PyExc_ValueError, "group_of has %zd entries for %zd params", PyTuple_GET_SIZE(group_of), ns);
        goto error;
    }
    g = PyMem_RawCalloc((size_t)(ng ? ng : 1), sizeof *g);
    segs = PyMem_RawCalloc((size_t)(ns ? ns : 1), sizeof *segs);
    if (!g || !segs) {
        PyErr_NoMemory();
        goto error;
    }
    for (Py_ssize_t i = 0; i < ng; i++)
        if (ft_py_parse_optim_group(PyTuple_GET_ITEM(groups, i), &g[i]) < 0)
            goto error;
    for (Py_ssize_t i = 0; i < ns; i++) {
        PyObject *item = PyTuple_GET_ITEM(group_of, i);
        int group = PyLong_Check(item) ? (int)PyLong_AsLong(item) : -1;
        if (PyErr_Occurred())
            goto error;
        segs[i] = (ft_optim_segment){param_data(self->params, i), NULL, param_numel(self->params, i), group};
    }
    ft_status s = ft_optimizer_create(&self->opt, device, kind, (int)ng, g, (int)ns, segs);
    if (s != FT_OK) {
        ft_py_raise(s);
        goto error;
    }
    PyMem_RawFree(g);
    PyMem_RawFree(segs);
    Py_DECREF(groups);
    Py_DECREF(group_of);
    return (PyObject *)self;
error:
    PyMem_RawFree(g);
    PyMem_RawFree(segs);
    Py_XDECREF(groups);
    Py_XDECREF(group_of);
    Py_DECREF(self);
    return NULL;
}

static int optimizer_traverse(PyObject *self, visitproc visit, void *arg) {
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(OPT(self)->params);
    return 0;
}

static void optimizer_dealloc(PyObject *self) {
    PyTypeObject *type = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    ft_optimizer_destroy(OPT(self)->opt);
    drop_params(&OPT(self)->params, &OPT(self)->storages);
    type->tp_free(self);
    Py_DECREF(type);
}

/* True when some param's memory is no longer where the segments point. */
static bool params_moved(PyObject *params, const ft_optimizer *opt) {
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(params); i++)
        if (ft_optimizer_segment(opt, (int)i)->param != param_data(params, i) ||
            ft_optimizer_segment(opt, (int)i)->numel != param_numel(params, i))
            return true;
    return false;
}

static PyObject *optimizer_params_moved(PyObject *self, PyObject *unused) {
    (void)unused;
    return PyBool_FromLong(params_moved(OPT(self)->params, OPT(self)->opt));
}

/* step(grads, grad_scale, max_grad_norm, want_norm) -> the norm or None. */
static PyObject *optimizer_step(PyObject *self, PyObject *args) {
    optimizer_object *o = OPT(self);
    PyObject *grads_obj;
    float scale;
    double max_norm;
    int want_norm;
    if (!PyArg_ParseTuple(args, "Ofdp", &grads_obj, &scale, &max_norm, &want_norm) ||
        refuse_busy(o->busy, "the optimizer") < 0)
        return NULL;
    const char *what = ft_optim_kind_name(ft_optimizer_kind(o->opt));
    if (params_moved(o->params, o->opt))
        return PyErr_Format(PyExc_RuntimeError, "%s: a param's memory moved since the optimizer was built", what);
    PyObject *grads = PySequence_Tuple(grads_obj);
    if (!grads)
        return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(o->params);
    if (PyTuple_GET_SIZE(grads) != n) {
        Py_DECREF(grads);
        return PyErr_Format(PyExc_ValueError, "%s: %zd grads for %zd params", what, PyTuple_GET_SIZE(grads), n);
    }
    const float **ptrs = PyMem_RawCalloc((size_t)(n ? n : 1), sizeof *ptrs);
    if (!ptrs) {
        Py_DECREF(grads);
        return PyErr_NoMemory();
    }
    ft_module_state *st = ft_py_state_of_type(Py_TYPE(self));
    ft_status s = FT_OK;
    char arg[40];
    for (Py_ssize_t i = 0; i < n && s == FT_OK; i++) {
        PyObject *item = PyTuple_GET_ITEM(grads, i);
        if (item == Py_None)
            continue;
        snprintf(arg, sizeof arg, "the grad of param %zd", i);
        const ft_tensor *g = ft_py_unwrap(st, item, arg);
        if (!g)
            goto error;
        const ft_tensor *p = &((ft_tensor_object *)PyTuple_GET_ITEM(o->params, i))->t;
        s = ft_check_float_on(what, arg, g, ft_optimizer_device(o->opt), "the params", false);
        if (s == FT_OK)
            s = ft_check_shape_as(what, arg, g, p);
        if (s == FT_OK && !ft_tensor_is_contiguous(g))
            s = ft_fail(FT_ERR_VALUE, "%s: %s must be contiguous", what, arg);
        ptrs[i] = (const float *)ft_tensor_data(g);
    }
    if (s == FT_OK)
        s = ft_optimizer_set_grads(o->opt, ptrs);
    if (s != FT_OK) {
        ft_py_raise(s);
        goto error;
    }
    double norm = 0;
    o->busy = true;
    Py_BEGIN_ALLOW_THREADS
    s = ft_optimizer_step(o->opt, scale, max_norm, want_norm ? &norm : NULL);
    Py_END_ALLOW_THREADS
    o->busy = false;
    /* The grads are only lent for this call. */
    memset(ptrs, 0, (size_t)n * sizeof *ptrs);
    ft_optimizer_set_grads(o->opt, ptrs);
    PyMem_RawFree(ptrs);
    Py_DECREF(grads);
    if (s != FT_OK)
        return ft_py_raise(s);
    return want_norm ? PyFloat_FromDouble(norm) : Py_NewRef(Py_None);
error:
    PyMem_RawFree(ptrs);
    Py_DECREF(grads);
    return NULL;
}

static PyObject *optimizer_set_group(PyObject *self, PyObject *args) {
    int index;
    PyObject *tuple;
    ft_optim_group g;
    if (!PyArg_ParseTuple(args, "iO", &index, &tuple) || refuse_busy(OPT(self)->busy, "the optimizer") < 0 ||
        ft_py_parse_optim_group(tuple, &g) < 0)
        return NULL;
    ft_status s = ft_optimizer_set_group(OPT(self)->opt, index, &g);
    return s == FT_OK ? Py_NewRef(Py_None) : ft_py_raise(s);
}

static PyObject *optimizer_state_buffer(PyObject *self, PyObject *arg) {
    long kind = PyLong_AsLong(arg);
    if (kind == -1 && PyErr_Occurred())
        return NULL;
    if (kind < 0 || kind >= FT_OPTIM_NUM_STATES)
        return PyErr_Format(PyExc_ValueError, "no optimizer state kind %ld", kind);
    return wrap_flat(self, ft_optimizer_state(OPT(self)->opt, (ft_optim_state)kind));
}

static PyObject *optimizer_segment_state(PyObject *self, PyObject *arg) {
    int i = PyLong_Check(arg) ? (int)PyLong_AsLong(arg) : -1;
    if (PyErr_Occurred())
        return NULL;
    if (i < 0 || i >= ft_optimizer_num_segments(OPT(self)->opt))
        return PyErr_Format(PyExc_IndexError, "no param %R", arg);
    ft_optim_segment_state s = ft_optimizer_segment_state(OPT(self)->opt, i);
    return Py_BuildValue("(LOd)", (long long)s.steps, s.momentum_valid ? Py_True : Py_False, s.mu_product);
}

static PyObject *optimizer_set_segment_state(PyObject *self, PyObject *args) {
    int i, valid;
    long long steps;
    double mu_product;
    if (!PyArg_ParseTuple(args, "iLpd", &i, &steps, &valid, &mu_product) ||
        refuse_busy(OPT(self)->busy, "the optimizer") < 0)
        return NULL;
    ft_status s =
        ft_optimizer_set_segment_state(OPT(self)->opt, i, (ft_optim_segment_state){steps, valid, mu_product});
    return s == FT_OK ? Py_NewRef(Py_None) : ft_py_raise(s);
}

static PyObject *optimizer_get_offsets(PyObject *self, void *closure) {
    (void)closure;
    int n = ft_optimizer_num_segments(OPT(self)->opt);
    PyObject *list = PyList_New(n);
    for (int i = 0; list && i < n; i++) {
        PyObject *v = PyLong_FromLongLong(ft_optimizer_offset(OPT(self)->opt, i));
        if (!v) {
            Py_CLEAR(list);
            break;
        }
        PyList_SET_ITEM(list, i, v);
    }
    return list;
}

static PyObject *optimizer_get_num_steps(PyObject *self, void *closure) {
    (void)closure;
    return PyLong_FromLongLong(ft_optimizer_num_steps(OPT(self)->opt));
}

static PyMethodDef optimizer_methods[] = {
    {"step", optimizer_step, METH_VARARGS,
     "step(grads, grad_scale, max_grad_norm, want_norm) -> the global grad norm, or None when not computed.\n"
     "grads: one tensor or None (skip) per param, lent for this call only."},
    {"set_group", optimizer_set_group, METH_VARARGS, "set_group(index, hyperparameter tuple)"},
    {"state_buffer", optimizer_state_buffer, METH_O,
     "The flat float32 state of one kind (an index into OPTIM_STATES), sharing memory, or None."},
    {"segment_state", optimizer_segment_state, METH_O, "segment_state(i) -> (steps, momentum_valid, mu_product)"},
    {"set_segment_state", optimizer_set_segment_state, METH_VARARGS,
     "set_segment_state(i, steps, momentum_valid, mu_product)"},
    {"params_moved", optimizer_params_moved, METH_NOARGS, "True when a param's memory moved since construction."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef optimizer_getset[] = {
    {"offsets", optimizer_get_offsets, NULL, "Where each param starts in the flat state buffers.", NULL},
    {"num_steps", optimizer_get_num_steps, NULL, "Steps that updated at least one param.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot optimizer_slots[] = {
    {Py_tp_new, optimizer_new},
    {Py_tp_dealloc, optimizer_dealloc},
    {Py_tp_traverse, optimizer_traverse},
    {Py_tp_methods, optimizer_methods},
    {Py_tp_getset, optimizer_getset},
    {Py_tp_doc, "Optimizer(kind, groups, params, group_of): the fused C optimizer behind ft.optim."},
    {0, NULL},
};

static PyType_Spec optimizer_spec = {
    .name = "fasttrain._C.Optimizer",
    .basicsize = sizeof(optimizer_object),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .slots = optimizer_slots,
};

ft_optimizer *ft_py_optimizer_of(PyObject *py_optimizer) {
    if (Py_TYPE(py_optimizer)->tp_dealloc == optimizer_dealloc)
        return OPT(py_optimizer)->opt;
    PyObject *sync = PyObject_GetAttrString(py_optimizer, "_sync");
    if (!sync) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "expected an ft.optim optimizer, got %.100s", Py_TYPE(py_optimizer)->tp_name);
        return NULL;
    }
    PyObject *c = PyObject_CallNoArgs(sync);
    Py_DECREF(sync);
    if (!c)
        return NULL;
    /* py_optimizer keeps the object alive: its reference here can go. */
    bool ok = Py_TYPE(c)->tp_dealloc == optimizer_dealloc;
    ft_optimizer *opt = ok ? OPT(c)->opt : NULL;
    if (!ok)
        PyErr_Format(PyExc_TypeError, "%.100s._sync() did not return the optimizer's own _C.Optimizer",
                     Py_TYPE(py_optimizer)->tp_name);
    Py_DECREF(c);
    return opt;
}

/* ---- _C.EMA ---- */

#define EMA(self) ((ema_object *)(self))

static PyObject *ema_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"params", NULL};
    PyObject *params_obj;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O", kwlist, &params_obj))
        return NULL;
    ema_object *self = (ema_object *)type->tp_alloc(type, 0);
    if (!self)
        return NULL;
    ft_device device;
    if (take_params(ft_py_state_of_type(type), params_obj, "EMA", &self->params, &self->storages, &device) < 0) {
        Py_DECREF(self);
        return NULL;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(self->params);
    ft_ema_segment *segs = PyMem_RawCalloc((size_t)(n ? n : 1), sizeof *segs);
    if (!segs) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < n; i++)
        segs[i] = (ft_ema_segment){param_data(self->params, i), param_numel(self->params, i)};
    ft_status s = ft_ema_create(&self->ema, device, (int)n, segs);
    PyMem_RawFree(segs);
    if (s != FT_OK) {
        Py_DECREF(self);
        return ft_py_raise(s);
    }
    return (PyObject *)self;
}

static int ema_traverse(PyObject *self, visitproc visit, void *arg) {
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(EMA(self)->params);
    return 0;
}

static void ema_dealloc(PyObject *self) {
    PyTypeObject *type = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    ft_ema_destroy(EMA(self)->ema);
    drop_params(&EMA(self)->params, &EMA(self)->storages);
    type->tp_free(self);
    Py_DECREF(type);
}

static bool ema_params_moved(const ema_object *e) {
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(e->params); i++) {
        ft_ema_segment seg = ft_ema_get_segment(e->ema, (int)i);
        if (seg.param != param_data(e->params, i) || seg.numel != param_numel(e->params, i))
            return true;
    }
    return false;
}

static PyObject *ema_update(PyObject *self, PyObject *arg) {
    ema_object *e = EMA(self);
    double decay = PyFloat_AsDouble(arg);
    if ((decay == -1 && PyErr_Occurred()) || refuse_busy(e->busy, "the EMA") < 0)
        return NULL;
    if (ema_params_moved(e))
        return PyErr_Format(PyExc_RuntimeError, "EMA: a param's memory moved since the EMA was built");
    ft_status s;
    e->busy = true;
    Py_BEGIN_ALLOW_THREADS
    s = ft_ema_update(e->ema, decay);
    Py_END_ALLOW_THREADS
    e->busy = false;
    return s == FT_OK ? Py_NewRef(Py_None) : ft_py_raise(s);
}

ft_ema *ft_py_ema_begin(PyObject *obj) {
    if (Py_TYPE(obj)->tp_dealloc != ema_dealloc) {
        PyErr_Format(PyExc_TypeError, "expected a _C.EMA, got %.100s", Py_TYPE(obj)->tp_name);
        return NULL;
    }
    ema_object *e = EMA(obj);
    if (refuse_busy(e->busy, "the EMA") < 0)
        return NULL;
    if (ema_params_moved(e)) {
        PyErr_SetString(PyExc_RuntimeError, "EMA: a param's memory moved since the EMA was built");
        return NULL;
    }
    e->busy = true;
    return e->ema;
}

void ft_py_ema_end(PyObject *obj) { EMA(obj)->busy = false; }

static PyObject *ema_average(PyObject *self, PyObject *unused) {
    (void)unused;
    return wrap_flat(self, ft_ema_average(EMA(self)->ema));
}

static PyObject *ema_get_offsets(PyObject *self, void *closure) {
    (void)closure;
    int n = ft_ema_num_segments(EMA(self)->ema);
    PyObject *list = PyList_New(n);
    for (int i = 0; list && i < n; i++) {
        PyObject *v = PyLong_FromLongLong(ft_ema_offset(EMA(self)->ema, i));
        if (!v) {
            Py_CLEAR(list);
            break;
        }
        PyList_SET_ITEM(list, i, v);
    }
    return list;
}

static PyMethodDef ema_methods[] = {
    {"update", ema_update, METH_O, "update(decay): avg = lerp(avg, param, 1 - decay) for every param, one pass."},
    {"average", ema_average, METH_NOARGS, "The flat float32 averages, sharing memory."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef ema_getset[] = {
    {"offsets", ema_get_offsets, NULL, "Where each param's average starts in the flat buffer.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot ema_slots[] = {
    {Py_tp_new, ema_new},
    {Py_tp_dealloc, ema_dealloc},
    {Py_tp_traverse, ema_traverse},
    {Py_tp_methods, ema_methods},
    {Py_tp_getset, ema_getset},
    {Py_tp_doc, "EMA(params): exponential moving averages of float32 params in one flat buffer."},
    {0, NULL},
};

static PyType_Spec ema_spec = {
    .name = "fasttrain._C.EMA",
    .basicsize = sizeof(ema_object),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .slots = ema_slots,
};

/* ---- module ---- */

static PyObject *py_optim_check_group(PyObject *module, PyObject *args) {
    (void)module;
    PyObject *kind_obj, *tuple;
    int index;
    ft_optim_kind kind;
    ft_optim_group g;
    if (!PyArg_ParseTuple(args, "OiO", &kind_obj, &index, &tuple) || parse_kind(kind_obj, &kind) < 0 ||
        ft_py_parse_optim_group(tuple, &g) < 0)
        return NULL;
    ft_status s = ft_optim_check_group(kind, index, &g);
    return s == FT_OK ? Py_NewRef(Py_None) : ft_py_raise(s);
}

static PyMethodDef optim_functions[] = {
    {"optim_check_group", py_optim_check_group, METH_VARARGS,
     "optim_check_group(kind, index, hyperparameter tuple): ValueError naming the first bad value."},
    {NULL, NULL, 0, NULL},
};

static const char *kind_name(int i) { return ft_optim_kind_name((ft_optim_kind)i); }
static const char *state_name(int i) { return ft_optim_state_name((ft_optim_state)i); }

int ft_py_bind_optim(PyObject *module) {
    if (PyModule_AddFunctions(module, optim_functions) < 0 || ft_py_add_type(module, &optimizer_spec) < 0 ||
        ft_py_add_type(module, &ema_spec) < 0 ||
        ft_py_add_enum(module, "OPTIM_KINDS", FT_OPTIM_NKINDS, kind_name) < 0)
        return -1;
    return ft_py_add_enum(module, "OPTIM_STATES", FT_OPTIM_NUM_STATES, state_name);
}
