/* The fasttrain._C module: initialisation, error mapping and the functions
 * that are not tensor methods. */
#define FT_BIND_IMPORTS_NUMPY
#include "bind/bind.h"

#include "core/alloc.h"
#include "core/cuda.h"
#include "core/rng.h"
#include "core/settings.h"

PyObject *ft_raise(ft_status status) {
    PyObject *type;
    switch (status) {
    case FT_ERR_INDEX: type = PyExc_IndexError; break;
    case FT_ERR_DTYPE: type = PyExc_TypeError; break;
    case FT_ERR_OVERFLOW: type = PyExc_OverflowError; break;
    case FT_ERR_NOMEM: type = PyExc_MemoryError; break;
    case FT_ERR_IO: type = PyExc_OSError; break;
    case FT_ERR_BUFFER: type = PyExc_BufferError; break;
    case FT_ERR_DEVICE:
    case FT_ERR_CUDA:
    case FT_ERR_RUNTIME: type = PyExc_RuntimeError; break;
    default: type = PyExc_ValueError; break;
    }
    PyErr_SetString(type, ft_last_error());
    return NULL;
}

ft_module_state *ft_state_of_type(PyTypeObject *type) {
    PyObject *module = PyType_GetModuleByDef(type, &ft_module_def);
    return module ? PyModule_GetState(module) : NULL;
}

PyObject *ft_wrap(ft_module_state *st, ft_tensor *t) {
    ft_tensor_object *obj = (ft_tensor_object *)st->tensor_class->tp_alloc(st->tensor_class, 0);
    if (!obj) {
        ft_tensor_release(t);
        return NULL;
    }
    obj->t = *t;
    return (PyObject *)obj;
}

ft_tensor *ft_unwrap(ft_module_state *st, PyObject *obj, const char *what) {
    if (!PyObject_TypeCheck(obj, st->tensor_base)) {
        PyErr_Format(PyExc_TypeError, "%s must be a fasttrain Tensor, not %.100s", what, Py_TYPE(obj)->tp_name);
        return NULL;
    }
    return &((ft_tensor_object *)obj)->t;
}

int ft_parse_shape(PyObject *obj, int64_t *shape, int *ndim) {
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

int ft_parse_scalar(PyObject *obj, ft_scalar *out, ft_dtype *natural) {
    ft_dtype dt;
    /* NumPy scalars first: np.float64 is also a Python float. */
    if (PyArray_IsScalar(obj, Generic)) {
        PyArray_Descr *descr = PyArray_DescrFromScalar(obj);
        if (!descr)
            return -1;
        int r = ft_dtype_of_descr(descr, &dt);
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
        r = ft_parse_scalar(value, out, &ignored);
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

void ft_release_pyobject(void *owner) {
    PyGILState_STATE gil = PyGILState_Ensure();
    Py_DECREF((PyObject *)owner);
    PyGILState_Release(gil);
}

static ft_module_state *state(PyObject *module) { return PyModule_GetState(module); }

/* An int argument, with TypeError/OverflowError for anything else. */
static int parse_int(PyObject *arg, int *out) {
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

/* ---- module functions ---- */

static int parse_device(int type, int index, ft_device *out) {
    if (type != FT_DEV_CPU && type != FT_DEV_CUDA) {
        PyErr_Format(PyExc_ValueError, "unknown device type %d", type);
        return -1;
    }
    *out = (ft_device){type, type == FT_DEV_CPU ? 0 : index};
    return 0;
}

static PyObject *py_empty(PyObject *module, PyObject *args) {
    PyObject *shape_obj;
    int dtype, dev_type, dev_index, pinned;
    if (!PyArg_ParseTuple(args, "Oiiip", &shape_obj, &dtype, &dev_type, &dev_index, &pinned))
        return NULL;
    int64_t shape[FT_MAX_DIMS];
    int ndim;
    ft_device dev;
    if (ft_parse_shape(shape_obj, shape, &ndim) < 0 || parse_device(dev_type, dev_index, &dev) < 0)
        return NULL;
    if (!ft_dtype_valid(dtype))
        return PyErr_Format(PyExc_ValueError, "unknown dtype code %d", dtype);
    if (pinned && dev.type != FT_DEV_CPU)
        return PyErr_Format(PyExc_ValueError, "only CPU tensors can be pinned");
    ft_tensor t;
    ft_status s = ft_tensor_empty(&t, ndim, shape, (ft_dtype)dtype, dev, pinned);
    return s == FT_OK ? ft_wrap(state(module), &t) : ft_raise(s);
}

static PyObject *py_from_numpy(PyObject *module, PyObject *arr) { return ft_from_numpy(state(module), arr); }

static PyObject *py_from_dlpack(PyObject *module, PyObject *obj) { return ft_from_dlpack(state(module), obj); }

static PyObject *py_tensor_from_data(PyObject *module, PyObject *args) {
    PyObject *data;
    int dtype;
    if (!PyArg_ParseTuple(args, "Oi", &data, &dtype))
        return NULL;
    return ft_tensor_from_data(state(module), data, dtype);
}

/* rng functions take (tensor, seed, offset, ...) and return the new offset. */
static PyObject *rng_call(PyObject *module, PyObject *args, int which) {
    PyObject *obj;
    unsigned long long seed, offset;
    double a = 0, b = 0;
    long long lo = 0, hi = 0;
    int ok = which == 2 ? PyArg_ParseTuple(args, "OKKLL", &obj, &seed, &offset, &lo, &hi)
             : which == 3 ? PyArg_ParseTuple(args, "OKK", &obj, &seed, &offset)
                          : PyArg_ParseTuple(args, "OKKdd", &obj, &seed, &offset, &a, &b);
    if (!ok)
        return NULL;
    ft_tensor *t = ft_unwrap(state(module), obj, "out");
    if (!t)
        return NULL;
    ft_rng_state rng = {seed, offset};
    ft_status s;
    Py_BEGIN_ALLOW_THREADS
    switch (which) {
    case 0: s = ft_rng_uniform(t, &rng, a, b); break;
    case 1: s = ft_rng_normal(t, &rng, a, b); break;
    case 2: s = ft_rng_randint(t, &rng, lo, hi); break;
    default: s = ft_rng_randperm(t, &rng); break;
    }
    Py_END_ALLOW_THREADS
    return s == FT_OK ? PyLong_FromUnsignedLongLong(rng.offset) : ft_raise(s);
}

static PyObject *py_uniform(PyObject *m, PyObject *a) { return rng_call(m, a, 0); }
static PyObject *py_normal(PyObject *m, PyObject *a) { return rng_call(m, a, 1); }
static PyObject *py_randint(PyObject *m, PyObject *a) { return rng_call(m, a, 2); }
static PyObject *py_randperm(PyObject *m, PyObject *a) { return rng_call(m, a, 3); }

static int parse_pool(PyObject *args, ft_mem_pool *pool) {
    int kind, device;
    if (!PyArg_ParseTuple(args, "ii", &kind, &device))
        return -1;
    if (kind < FT_MEM_HOST || kind > FT_MEM_CUDA || device < 0 || device >= FT_MAX_CUDA_DEVICES) {
        PyErr_Format(PyExc_ValueError, "no memory pool (%d, %d)", kind, device);
        return -1;
    }
    *pool = (ft_mem_pool){(ft_mem_kind)kind, device};
    return 0;
}

static PyObject *py_memory_stats(PyObject *module, PyObject *args) {
    (void)module;
    ft_mem_pool pool;
    if (parse_pool(args, &pool) < 0)
        return NULL;
    ft_mem_stats s = ft_memory_stats(pool);
    return Py_BuildValue("{sLsLsLsL}", "allocated_bytes", (long long)s.allocated, "peak_bytes", (long long)s.peak,
                         "reserved_bytes", (long long)s.reserved, "num_allocs", (long long)s.num_allocs);
}

static PyObject *py_reset_peak_memory_stats(PyObject *module, PyObject *args) {
    (void)module;
    ft_mem_pool pool;
    if (parse_pool(args, &pool) < 0)
        return NULL;
    ft_reset_peak_memory_stats(pool);
    Py_RETURN_NONE;
}

static PyObject *py_empty_cache(PyObject *module, PyObject *unused) {
    (void)module, (void)unused;
    ft_empty_cache();
    Py_RETURN_NONE;
}

static PyObject *py_set_num_threads(PyObject *module, PyObject *arg) {
    (void)module;
    int n;
    if (parse_int(arg, &n) < 0)
        return NULL;
    ft_status s = ft_set_num_threads(n);
    return s == FT_OK ? Py_NewRef(Py_None) : ft_raise(s);
}

static PyObject *py_get_num_threads(PyObject *module, PyObject *unused) {
    (void)module, (void)unused;
    return PyLong_FromLong(ft_get_num_threads());
}

static PyObject *py_set_deterministic(PyObject *module, PyObject *arg) {
    (void)module;
    int on = PyObject_IsTrue(arg);
    if (on < 0)
        return NULL;
    ft_set_deterministic(on);
    Py_RETURN_NONE;
}

static PyObject *py_get_deterministic(PyObject *module, PyObject *unused) {
    (void)module, (void)unused;
    return PyBool_FromLong(ft_deterministic());
}

static PyObject *py_set_benchmark(PyObject *module, PyObject *arg) {
    (void)module;
    int on = PyObject_IsTrue(arg);
    if (on < 0)
        return NULL;
    ft_set_benchmark(on);
    Py_RETURN_NONE;
}

static PyObject *py_get_benchmark(PyObject *module, PyObject *unused) {
    (void)module, (void)unused;
    return PyBool_FromLong(ft_benchmark());
}

static PyObject *py_set_allow_tf32(PyObject *module, PyObject *arg) {
    (void)module;
    int on = PyObject_IsTrue(arg);
    if (on < 0)
        return NULL;
    ft_set_allow_tf32(on);
    Py_RETURN_NONE;
}

static PyObject *py_get_allow_tf32(PyObject *module, PyObject *unused) {
    (void)module, (void)unused;
    return PyBool_FromLong(ft_allow_tf32());
}

static PyObject *py_cuda_set_library(PyObject *module, PyObject *arg) {
    (void)module;
    const char *path = PyUnicode_AsUTF8(arg);
    if (!path)
        return NULL;
    ft_cuda_set_library(path);
    Py_RETURN_NONE;
}

/* The first CUDA question loads the backend (a dlopen of the CUDA
 * libraries and the runtime's device query): seconds on some machines. */
static PyObject *py_cuda_device_count(PyObject *module, PyObject *unused) {
    (void)module, (void)unused;
    int n;
    Py_BEGIN_ALLOW_THREADS
    n = ft_cuda_device_count();
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(n);
}

static PyObject *py_cuda_unavailable_reason(PyObject *module, PyObject *unused) {
    (void)module, (void)unused;
    const char *reason;
    Py_BEGIN_ALLOW_THREADS
    reason = ft_cuda_unavailable_reason();
    Py_END_ALLOW_THREADS
    return PyUnicode_FromString(reason);
}

static PyObject *py_cuda_device_name(PyObject *module, PyObject *arg) {
    (void)module;
    int dev;
    if (parse_int(arg, &dev) < 0)
        return NULL;
    ft_status s = ft_cuda_check_device(dev);
    char name[256] = "";
    if (s == FT_OK)
        s = ft_cuda()->device_name(dev, name, sizeof name);
    return s == FT_OK ? PyUnicode_FromString(name) : ft_raise(s);
}

static PyObject *py_cuda_synchronize(PyObject *module, PyObject *arg) {
    (void)module;
    int dev;
    if (parse_int(arg, &dev) < 0)
        return NULL;
    ft_status s = ft_cuda_check_device(dev);
    if (s == FT_OK) {
        Py_BEGIN_ALLOW_THREADS
        s = ft_cuda()->device_synchronize(dev);
        Py_END_ALLOW_THREADS
    }
    return s == FT_OK ? Py_NewRef(Py_None) : ft_raise(s);
}

static PyObject *py_set_tensor_class(PyObject *module, PyObject *cls) {
    ft_module_state *st = state(module);
    if (!PyType_Check(cls) || !PyType_IsSubtype((PyTypeObject *)cls, st->tensor_base))
        return PyErr_Format(PyExc_TypeError, "the tensor class must derive from TensorBase");
    Py_SETREF(st->tensor_class, (PyTypeObject *)Py_NewRef(cls));
    Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"empty", py_empty, METH_VARARGS, "empty(shape, dtype, device_type, device_index, pinned)"},
    {"from_numpy", py_from_numpy, METH_O, "A tensor sharing the memory of a NumPy array."},
    {"from_dlpack", py_from_dlpack, METH_O, "A tensor sharing the memory of a DLPack producer or capsule."},
    {"tensor_from_data", py_tensor_from_data, METH_VARARGS, "tensor_from_data(data, dtype or -1)"},
    {"uniform_", py_uniform, METH_VARARGS, "uniform_(t, seed, offset, low, high) -> new offset"},
    {"normal_", py_normal, METH_VARARGS, "normal_(t, seed, offset, mean, std) -> new offset"},
    {"randint_", py_randint, METH_VARARGS, "randint_(t, seed, offset, low, high) -> new offset"},
    {"randperm_", py_randperm, METH_VARARGS, "randperm_(t, seed, offset) -> new offset"},
    {"memory_stats", py_memory_stats, METH_VARARGS, "memory_stats(pool_kind, device) -> dict"},
    {"reset_peak_memory_stats", py_reset_peak_memory_stats, METH_VARARGS, NULL},
    {"empty_cache", py_empty_cache, METH_NOARGS, "Return cached blocks to the system."},
    {"set_num_threads", py_set_num_threads, METH_O, NULL},
    {"get_num_threads", py_get_num_threads, METH_NOARGS, NULL},
    {"set_deterministic", py_set_deterministic, METH_O, NULL},
    {"get_deterministic", py_get_deterministic, METH_NOARGS, NULL},
    {"set_benchmark", py_set_benchmark, METH_O, NULL},
    {"get_benchmark", py_get_benchmark, METH_NOARGS, NULL},
    {"set_allow_tf32", py_set_allow_tf32, METH_O, NULL},
    {"get_allow_tf32", py_get_allow_tf32, METH_NOARGS, NULL},
    {"cuda_set_library", py_cuda_set_library, METH_O,
     "Name the CUDA backend library that the first CUDA use loads (only the first name counts)."},
    {"cuda_device_count", py_cuda_device_count, METH_NOARGS, NULL},
    {"cuda_unavailable_reason", py_cuda_unavailable_reason, METH_NOARGS, NULL},
    {"cuda_device_name", py_cuda_device_name, METH_O, NULL},
    {"cuda_synchronize", py_cuda_synchronize, METH_O, NULL},
    {"_set_tensor_class", py_set_tensor_class, METH_O, NULL},
    {NULL, NULL, 0, NULL},
};

static int module_exec(PyObject *module) {
    if (PyArray_ImportNumPyAPI() < 0)
        return -1;
    ft_module_state *st = state(module);
    st->tensor_base = (PyTypeObject *)PyType_FromModuleAndSpec(module, &ft_tensor_spec, NULL);
    if (!st->tensor_base)
        return -1;
    st->tensor_class = (PyTypeObject *)Py_NewRef(st->tensor_base);
    if (PyModule_AddObjectRef(module, "TensorBase", (PyObject *)st->tensor_base) < 0)
        return -1;
    if (PyModule_AddIntConstant(module, "CUDA_COMPILED", FT_WITH_CUDA) < 0 ||
        PyModule_AddIntConstant(module, "MAX_DIMS", FT_MAX_DIMS) < 0)
        return -1;
    if (ft_bind_ops(module) < 0)
        return -1;
    if (ft_bind_optim(module) < 0)
        return -1;
    if (ft_bind_nn(module) < 0)
        return -1;
    PyObject *names = PyList_New(0);
    if (!names)
        return -1;
    for (int i = 0; i < FT_NUM_DTYPES; i++) {
        const ft_dtype_info *info = ft_dtype_get((ft_dtype)i);
        PyObject *item = Py_BuildValue("(siiin)", info->name, i, info->dl_code, info->bits, (Py_ssize_t)info->itemsize);
        if (!item || PyList_Append(names, item) < 0) {
            Py_XDECREF(item);
            Py_DECREF(names);
            return -1;
        }
        Py_DECREF(item);
    }
    int r = PyModule_AddObjectRef(module, "DTYPES", names);
    Py_DECREF(names);
    if (r < 0 || ft_bind_data(module) < 0)
        return -1;
    return 0;
}

static int module_traverse(PyObject *module, visitproc visit, void *arg) {
    ft_module_state *st = state(module);
    Py_VISIT(st->tensor_base);
    Py_VISIT(st->tensor_class);
    return 0;
}

static int module_clear(PyObject *module) {
    ft_module_state *st = state(module);
    Py_CLEAR(st->tensor_base);
    Py_CLEAR(st->tensor_class);
    return 0;
}

static PyModuleDef_Slot module_slots[] = {
    {Py_mod_exec, module_exec},
    {0, NULL},
};

PyModuleDef ft_module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "fasttrain._C",
    .m_doc = "The C core of fasttrain.",
    .m_size = sizeof(ft_module_state),
    .m_methods = module_methods,
    .m_slots = module_slots,
    .m_traverse = module_traverse,
    .m_clear = module_clear,
};

PyMODINIT_FUNC PyInit__C(void) { return PyModuleDef_Init(&ft_module_def); }
