/* Tensors from nested Python sequences of numbers, with PyTorch's dtype
 * inference: bool -> bool, int -> int64, float -> float32, NumPy scalars keep
 * their dtype, and mixed elements promote. */
#include "bind/bind.h"

typedef struct {
    ft_module_state *st;
    int ndim;
    int64_t shape[FT_MAX_DIMS];
    bool infer;      /* this pass infers the dtype instead of storing */
    bool seen;       /* a scalar has been inferred */
    ft_dtype dtype;  /* inferred so far, or the one to store */
    char *cursor;    /* where the next element is stored */
} walk;

static bool is_tensor(walk *w, PyObject *o) { return PyObject_TypeCheck(o, w->st->tensor_base); }

/* Sequences nest; strings, 0-d arrays and 0-d tensors are leaves. */
static bool is_sequence(walk *w, PyObject *o) {
    if (PyList_Check(o) || PyTuple_Check(o))
        return true;
    if (PyArray_Check(o))
        return PyArray_NDIM((PyArrayObject *)o) > 0;
    if (is_tensor(w, o))
        return ((ft_tensor_object *)o)->t.ndim > 0;
    return PySequence_Check(o) && !PyUnicode_Check(o) && !PyBytes_Check(o) && !PyByteArray_Check(o);
}

static int discover_shape(walk *w, PyObject *data) {
    Py_INCREF(data);
    PyObject *o = data;
    int depth = 0;
    while (is_sequence(w, o)) {
        if (depth == FT_MAX_DIMS) {
            Py_DECREF(o);
            PyErr_Format(PyExc_ValueError, "data nests deeper than %d levels (is a list inside itself?)", FT_MAX_DIMS);
            return -1;
        }
        Py_ssize_t n = PySequence_Size(o);
        if (n < 0) {
            Py_DECREF(o);
            return -1;
        }
        w->shape[depth++] = n;
        if (n == 0)
            break;
        PyObject *first = PySequence_GetItem(o, 0);
        Py_DECREF(o);
        if (!first)
            return -1;
        o = first;
    }
    Py_DECREF(o);
    w->ndim = depth;
    return 0;
}

static int visit_scalar(walk *w, PyObject *o, int depth) {
    if (is_sequence(w, o)) {
        PyErr_Format(PyExc_ValueError, "ragged data: expected a number at dimension %d, got a sequence", depth);
        return -1;
    }
    PyObject *value = o;
    if (is_tensor(w, o) || PyArray_Check(o)) { /* 0-d */
        value = PyObject_CallMethod(o, "item", NULL);
        if (!value)
            return -1;
    }
    ft_scalar s;
    ft_dtype natural;
    int r = ft_py_parse_scalar(value, &s, &natural);
    if (value != o)
        Py_DECREF(value);
    if (r < 0)
        return -1;
    if (w->infer) {
        if (w->seen) {
            w->dtype = ft_dtype_promote(w->dtype, natural);
        } else {
            w->dtype = natural;
            w->seen = true;
        }
        return 0;
    }
    if (ft_py_check_scalar_fits(&s, w->dtype) < 0)
        return -1;
    ft_store_scalar(w->cursor, w->dtype, s);
    w->cursor += ft_dtype_get(w->dtype)->itemsize;
    return 0;
}

static int visit(walk *w, PyObject *o, int depth) {
    if (depth == w->ndim)
        return visit_scalar(w, o, depth);
    if (!is_sequence(w, o)) {
        PyErr_Format(PyExc_ValueError, "ragged data: expected a sequence at dimension %d, got %.100s", depth,
                     Py_TYPE(o)->tp_name);
        return -1;
    }
    PyObject *seq = PySequence_Fast(o, "expected a sequence");
    if (!seq)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    int r = 0;
    if (n != w->shape[depth]) {
        PyErr_Format(PyExc_ValueError, "ragged data: expected a sequence of length %lld at dimension %d, got %zd",
                     (long long)w->shape[depth], depth, n);
        r = -1;
    }
    for (Py_ssize_t i = 0; r == 0 && i < n; i++) {
        if (Py_EnterRecursiveCall(" while converting nested data to a tensor")) {
            r = -1;
            break;
        }
        r = visit(w, PySequence_Fast_GET_ITEM(seq, i), depth + 1);
        Py_LeaveRecursiveCall();
    }
    Py_DECREF(seq);
    return r;
}

PyObject *ft_py_tensor_from_data(ft_module_state *st, PyObject *data, int dtype) {
    walk w = {.st = st};
    if (dtype >= 0 && !ft_dtype_valid(dtype))
        return PyErr_Format(PyExc_ValueError, "unknown dtype code %d", dtype);
    if (discover_shape(&w, data) < 0)
        return NULL;
    if (dtype < 0) {
        w.infer = true;
        if (visit(&w, data, 0) < 0)
            return NULL;
        if (!w.seen)
            w.dtype = FT_FLOAT32; /* empty data */
        w.infer = false;
    } else {
        w.dtype = (ft_dtype)dtype;
    }
    if (ft_dtype_is_complex(w.dtype))
        return PyErr_Format(PyExc_TypeError, "complex tensors are storage-only: build them with ft.from_numpy");
    ft_tensor t;
    ft_status s = ft_tensor_empty(&t, w.ndim, w.shape, w.dtype, FT_CPU, false);
    if (s != FT_OK)
        return ft_py_raise(s);
    w.cursor = ft_tensor_data(&t);
    if (visit(&w, data, 0) < 0) {
        ft_tensor_release(&t);
        return NULL;
    }
    return ft_py_wrap(st, &t);
}
