/* Random fills by the counter-based (Philox) generator: each takes the
 * tensor to fill, the generator's (seed, offset) and its distribution's
 * parameters, and returns the offset past the numbers it drew (the Python
 * Generator keeps the state). */
#include "bind/bind.h"

#include "core/rng.h"

/* One fill: the arguments every distribution takes, then its outcome. */
typedef struct {
    PyObject *obj;
    unsigned long long seed, offset;
    ft_tensor *t;
    ft_rng_state rng;
    ft_status status;
} fill;

static int begin(PyObject *module, fill *f) {
    f->t = ft_py_unwrap(ft_py_state(module), f->obj, "out");
    f->rng = (ft_rng_state){f->seed, f->offset};
    return f->t ? 0 : -1;
}

static PyObject *end(const fill *f) {
    return f->status == FT_OK ? PyLong_FromUnsignedLongLong(f->rng.offset) : ft_py_raise(f->status);
}

static PyObject *py_uniform(PyObject *module, PyObject *args) {
    fill f;
    double low, high;
    if (!PyArg_ParseTuple(args, "OKKdd:uniform_", &f.obj, &f.seed, &f.offset, &low, &high) || begin(module, &f) < 0)
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    f.status = ft_rng_uniform(f.t, &f.rng, low, high);
    Py_END_ALLOW_THREADS
    return end(&f);
}

static PyObject *py_normal(PyObject *module, PyObject *args) {
    fill f;
    double mean, std;
    if (!PyArg_ParseTuple(args, "OKKdd:normal_", &f.obj, &f.seed, &f.offset, &mean, &std) || begin(module, &f) < 0)
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    f.status = ft_rng_normal(f.t, &f.rng, mean, std);
    Py_END_ALLOW_THREADS
    return end(&f);
}

static PyObject *py_randint(PyObject *module, PyObject *args) {
    fill f;
    long long low, high;
    if (!PyArg_ParseTuple(args, "OKKLL:randint_", &f.obj, &f.seed, &f.offset, &low, &high) || begin(module, &f) < 0)
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    f.status = ft_rng_randint(f.t, &f.rng, low, high);
    Py_END_ALLOW_THREADS
    return end(&f);
}

static PyObject *py_randperm(PyObject *module, PyObject *args) {
    fill f;
    if (!PyArg_ParseTuple(args, "OKK:randperm_", &f.obj, &f.seed, &f.offset) || begin(module, &f) < 0)
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    f.status = ft_rng_randperm(f.t, &f.rng);
    Py_END_ALLOW_THREADS
    return end(&f);
}

static PyMethodDef random_functions[] = {
    {"uniform_", py_uniform, METH_VARARGS, "uniform_(t, seed, offset, low, high) -> new offset"},
    {"normal_", py_normal, METH_VARARGS, "normal_(t, seed, offset, mean, std) -> new offset"},
    {"randint_", py_randint, METH_VARARGS, "randint_(t, seed, offset, low, high) -> new offset"},
    {"randperm_", py_randperm, METH_VARARGS, "randperm_(t, seed, offset) -> new offset"},
    {NULL, NULL, 0, NULL},
};

int ft_py_bind_random(PyObject *module) { return PyModule_AddFunctions(module, random_functions); }
