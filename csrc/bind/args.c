/* Argument parsing shared by the binding files: shapes, scalars and ints as
 * every function that takes them reads them. */
#include "bind/bind.h"

int ft_py_parse_int(PyObject *arg, int *out) {
    if (!PyLong_Check(arg)) {
        PyErr_Format(PyExc_TypeError, "expected an int, got %.100s", Py_TYPE(arg)->tp_name);
        return -1;
    }
    long v = PyLong_AsLong(arg);
    if (v == -1 && PyErr_Occurred())
        return -1;
    if (v < INT_MIN || v > INT_MAX) {
        PyErr_SetString(PyExc_OverflowError, "int argument out of range");
        return -1;
    }
    *out = (int)v;
    return 0;
}

int ft_py_parse_shape(PyObject *obj, int64_t *shape, int *ndim) {
    if (PyLong_Check(obj)) {
        shape[0] = PyLong_AsLongLong(obj);
        *ndim = 1;
        return shape[0] == -1 && PyErr_Occurred() ? -1 : 0;
    }
    PyObject *seq = PySequence_Fast(obj, "a shape must be an int or a sequence of ints");
    if (!seq)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n > FT_MAX_DIMS) {
        Py_DECREF(seq);
        PyErr_Format(PyExc_ValueError, "a tensor has at most %d dimensions, got %zd", FT_MAX_DIMS, n);
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(seq, i);
        if (!PyIndex_Check(item) || PyBool_Check(item)) {
            PyErr_Format(PyExc_TypeError, "shape entries must be ints, got %.100s", Py_TYPE(item)->tp_name);
            Py_DECREF(seq);
            return -1;
        }
        PyObject *index = PyNumber_Index(item);
        shape[i] = index ? PyLong_AsLongLong(index) : -1;
        Py_XDECREF(index);
        if (shape[i] == -1 && PyErr_Occurred()) {
            Py_DECREF(seq);
            return -1;
        }
    }
    *ndim = (int)n;
    Py_DECREF(seq);
    return 0;
}

int ft_py_parse_scalar(PyObject *obj, ft_scalar *out, ft_dtype *natural) {
    ft_dtype dt;
    /* NumPy scalars first: np.float64 is also a Python float. */
    if (PyArray_IsScalar(obj, Generic)) {
        PyArray_Descr *descr = PyArray_DescrFromScalar(obj);
        if (!descr)
            return -1;
        int r = ft_py_dtype_of_descr(descr, &dt);
        Py_DECREF(descr);
        if (r < 0)
            return -1;
        if (ft_dtype_is_complex(dt)) {
            PyErr_SetString(PyExc_TypeError, "complex values are storage-only in fasttrain: build complex tensors "
                                             "with ft.from_numpy");
            return -1;
        }
        /* NumPy scalars are numbers Python already knows how to read. */
        PyObject *value = ft_dtype_is_float(dt) ? PyNumber_Float(obj) : PyNumber_Long(obj);
        if (!value)
            return -1;
        ft_dtype ignored;
        r = ft_py_parse_scalar(value, out, &ignored);
        Py_DECREF(value);
        if (r < 0)
            return -1;
    } else if (PyBool_Check(obj)) {
        *out = (ft_scalar){.kind = FT_SCALAR_INT, .i = obj == Py_True};
        dt = FT_BOOL;
    } else if (PyFloat_Check(obj)) {
        *out = (ft_scalar){.kind = FT_SCALAR_FLOAT, .f = PyFloat_AS_DOUBLE(obj)};
        dt = FT_FLOAT32;
    } else if (PyLong_Check(obj)) {
        int overflow;
        long long v = PyLong_AsLongLongAndOverflow(obj, &overflow);
        if (v == -1 && PyErr_Occurred())
            return -1;
        *out = (ft_scalar){.kind = FT_SCALAR_INT, .i = v};
        dt = FT_INT64;
        if (overflow) {
            unsigned long long u = overflow > 0 ? PyLong_AsUnsignedLongLong(obj) : 0;
            if (overflow < 0 || (u == (unsigned long long)-1 && PyErr_Occurred())) {
                PyErr_Clear();
                PyErr_Format(PyExc_OverflowError, "integer %R does not fit in int64 or uint64", obj);
                return -1;
            }
            /* PyTorch still infers int64: storing checks the value fits. */
            *out = (ft_scalar){.kind = FT_SCALAR_UINT, .u = u};
        }
    } else {
        PyErr_Format(PyExc_TypeError, "expected a real number (bool, int or float), got %.100s", Py_TYPE(obj)->tp_name);
        return -1;
    }
    if (natural)
        *natural = dt;
    return 0;
}

int ft_py_check_scalar_fits(const ft_scalar *s, ft_dtype dtype) {
    if (dtype == FT_BOOL || ft_dtype_is_float(dtype) || ft_dtype_is_complex(dtype))
        return 0;
    int64_t lo, hi;
    switch (dtype) {
    case FT_UINT8: lo = 0, hi = UINT8_MAX; break;
    case FT_INT8: lo = INT8_MIN, hi = INT8_MAX; break;
    case FT_INT16: lo = INT16_MIN, hi = INT16_MAX; break;
    case FT_UINT16: lo = 0, hi = UINT16_MAX; break;
    case FT_INT32: lo = INT32_MIN, hi = INT32_MAX; break;
    case FT_UINT32: lo = 0, hi = UINT32_MAX; break;
    default: lo = dtype == FT_UINT64 ? 0 : INT64_MIN, hi = INT64_MAX; break;
    }
    bool fits;
    if (s->kind == FT_SCALAR_UINT) /* above INT64_MAX */
        fits = dtype == FT_UINT64;
    else if (s->kind == FT_SCALAR_INT) /* PyTorch lets -hi..-1 wrap into an unsigned type, uint64 aside */
        fits = s->i <= hi && (s->i >= lo || (lo == 0 && dtype != FT_UINT64 && s->i >= -hi));
    else /* the fraction goes; NaN and values outside the range do not fit */
        fits = s->f >= (double)lo &&
               s->f < (dtype == FT_UINT64 ? 18446744073709551616.0 : (double)hi + 1.0); /* exact powers of two */
    if (fits)
        return 0;
    PyObject *v = s->kind == FT_SCALAR_FLOAT  ? PyFloat_FromDouble(s->f)
                  : s->kind == FT_SCALAR_UINT ? PyLong_FromUnsignedLongLong(s->u)
                                              : PyLong_FromLongLong(s->i);
    if (v) {
        PyErr_Format(PyExc_OverflowError, "value %R cannot be converted to type %s without overflow", v,
                     ft_dtype_get(dtype)->name);
        Py_DECREF(v);
    }
    return -1;
}
