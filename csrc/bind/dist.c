/* ft.distributed's C half: MPI initialisation and the collectives on CPU
 * tensors (core/dist.h), each run without the GIL. */
#include "bind/bind.h"

#include "core/dist.h"
#include "ops/check.h"

/* fn() without the GIL (a collective waits for the other ranks): None or the exception. */
static PyObject *call_unlocked(ft_status (*fn)(void)) {
    ft_status s;
    Py_BEGIN_ALLOW_THREADS
    s = fn();
    Py_END_ALLOW_THREADS
    return s == FT_OK ? Py_NewRef(Py_None) : ft_py_raise(s);
}

static PyObject *py_dist_set_library(PyObject *module, PyObject *arg) {
    (void)module;
    const char *path = PyUnicode_AsUTF8(arg);
    if (!path)
        return NULL;
    ft_dist_set_library(path);
    Py_RETURN_NONE;
}

static PyObject *py_dist_init(PyObject *module, PyObject *unused) {
    (void)module, (void)unused;
    PyObject *done = call_unlocked(ft_dist_init);
    if (!done)
        return NULL;
    Py_DECREF(done);
    return Py_BuildValue("(iii)", ft_dist_rank(), ft_dist_world_size(), ft_dist_local_rank());
}

static PyObject *py_dist_set_timeout(PyObject *module, PyObject *arg) {
    (void)module;
    double seconds = PyFloat_AsDouble(arg);
    if (seconds == -1.0 && PyErr_Occurred())
        return NULL;
    ft_status s = ft_dist_set_timeout(seconds);
    return s == FT_OK ? Py_NewRef(Py_None) : ft_py_raise(s);
}

static PyObject *py_dist_ready(PyObject *module, PyObject *unused) {
    (void)module, (void)unused;
    return PyBool_FromLong(ft_dist_ready());
}

/* The tensor a collective works on in place: contiguous, on the CPU, and
 * (for a sum) float32 or float64. */
static ft_tensor *collective_tensor(PyObject *module, PyObject *obj, const char *what, bool sum) {
    ft_tensor *t = ft_py_unwrap(ft_py_state(module), obj, what);
    if (!t)
        return NULL;
    if (ft_op_device(t).type != FT_DEV_CPU || !ft_tensor_is_contiguous(t)) {
        PyErr_Format(PyExc_ValueError, "%s: the tensor must be contiguous and on the CPU", what);
        return NULL;
    }
    if (sum && t->dtype != FT_FLOAT32 && t->dtype != FT_FLOAT64) {
        PyErr_Format(PyExc_TypeError, "%s: sums take float32 or float64 tensors, got %s", what,
                     ft_dtype_get(t->dtype)->name);
        return NULL;
    }
    return t;
}

static PyObject *py_dist_all_reduce_sum(PyObject *module, PyObject *arg) {
    ft_tensor *t = collective_tensor(module, arg, "all_reduce", true);
    if (!t)
        return NULL;
    void *data = ft_tensor_data(t);
    int64_t n = ft_tensor_numel(t);
    bool f32 = t->dtype == FT_FLOAT32;
    ft_status s;
    Py_BEGIN_ALLOW_THREADS
    s = f32 ? ft_dist_allreduce_sum_f32(data, n) : ft_dist_allreduce_sum_f64(data, n);
    Py_END_ALLOW_THREADS
    return s == FT_OK ? Py_NewRef(Py_None) : ft_py_raise(s);
}

static PyObject *py_dist_broadcast(PyObject *module, PyObject *args) {
    PyObject *obj;
    int src;
    if (!PyArg_ParseTuple(args, "Oi:broadcast", &obj, &src))
        return NULL;
    ft_tensor *t = collective_tensor(module, obj, "broadcast", false);
    if (!t)
        return NULL;
    void *data = ft_tensor_data(t);
    int64_t bytes = ft_tensor_numel(t) * (int64_t)ft_dtype_get(t->dtype)->itemsize;
    ft_status s;
    Py_BEGIN_ALLOW_THREADS
    s = ft_dist_bcast(data, bytes, src);
    Py_END_ALLOW_THREADS
    return s == FT_OK ? Py_NewRef(Py_None) : ft_py_raise(s);
}

static PyObject *py_dist_barrier(PyObject *module, PyObject *unused) {
    (void)module, (void)unused;
    return call_unlocked(ft_dist_barrier);
}

static PyObject *py_dist_abort(PyObject *module, PyObject *arg) {
    (void)module;
    int code;
    if (ft_py_parse_int(arg, &code) < 0)
        return NULL;
    ft_dist_abort(code);
    Py_RETURN_NONE;
}

static PyObject *py_dist_finalize(PyObject *module, PyObject *unused) {
    (void)module, (void)unused;
    return call_unlocked(ft_dist_finalize);
}

static PyMethodDef dist_functions[] = {
    {"dist_set_library", py_dist_set_library, METH_O, "Name the MPI backend library that dist_init opens."},
    {"dist_init", py_dist_init, METH_NOARGS, "dist_init() -> (rank, world size, local rank)"},
    {"dist_ready", py_dist_ready, METH_NOARGS, NULL},
    {"dist_set_timeout", py_dist_set_timeout, METH_O, "How long a collective waits for every rank, in seconds."},
    {"dist_all_reduce_sum", py_dist_all_reduce_sum, METH_O, "Sums a CPU tensor over the ranks, in place."},
    {"dist_broadcast", py_dist_broadcast, METH_VARARGS, "broadcast(tensor, src): src's values, in place."},
    {"dist_barrier", py_dist_barrier, METH_NOARGS, NULL},
    {"dist_abort", py_dist_abort, METH_O, NULL},
    {"dist_finalize", py_dist_finalize, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

int ft_py_bind_dist(PyObject *module) { return PyModule_AddFunctions(module, dist_functions); }
