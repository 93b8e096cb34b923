/* The process-wide state behind ft.settings, ft.memory_* and ft.cuda: thread
 * count, determinism and autotuning flags, allocator statistics, and the
 * CUDA backend's device queries. */
#include "bind/bind.h"

#include "core/alloc.h"
#include "core/cuda.h"
#include "core/settings.h"

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
    if (ft_py_parse_int(arg, &n) < 0)
        return NULL;
    ft_status s = ft_set_num_threads(n);
    return s == FT_OK ? Py_NewRef(Py_None) : ft_py_raise(s);
}

static PyObject *py_get_num_threads(PyObject *module, PyObject *unused) {
    (void)module, (void)unused;
    return PyLong_FromLong(ft_get_num_threads());
}

/* A flag setter's argument, by Python's truth. */
static PyObject *set_flag(PyObject *arg, void (*set)(bool)) {
    int on = PyObject_IsTrue(arg);
    if (on < 0)
        return NULL;
    set(on);
    Py_RETURN_NONE;
}

static PyObject *py_set_deterministic(PyObject *module, PyObject *arg) {
    (void)module;
    return set_flag(arg, ft_set_deterministic);
}

static PyObject *py_get_deterministic(PyObject *module, PyObject *unused) {
    (void)module, (void)unused;
    return PyBool_FromLong(ft_deterministic());
}

static PyObject *py_set_benchmark(PyObject *module, PyObject *arg) {
    (void)module;
    return set_flag(arg, ft_set_benchmark);
}

static PyObject *py_get_benchmark(PyObject *module, PyObject *unused) {
    (void)module, (void)unused;
    return PyBool_FromLong(ft_benchmark());
}

static PyObject *py_set_allow_tf32(PyObject *module, PyObject *arg) {
    (void)module;
    return set_flag(arg, ft_set_allow_tf32);
}

static PyObject *py_get_allow_tf32(PyObject *module, PyObject *unused) {
    (void)module, (void)unused;
    return PyBool_FromLong(ft_allow_tf32());
}

static PyObject *py_cpu_bf16(PyObject *module, PyObject *unused) {
    (void)module, (void)unused;
    return PyBool_FromLong(ft_cpu_bf16());
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

static PyObject *py_cuda_device_props(PyObject *module, PyObject *arg) {
    (void)module;
    int dev, major = 0, minor = 0;
    if (ft_py_parse_int(arg, &dev) < 0)
        return NULL;
    ft_status s = ft_cuda_check_device(dev);
    char name[256] = "";
    if (s == FT_OK)
        s = ft_cuda()->device_props(dev, name, sizeof name, &major, &minor);
    return s == FT_OK ? Py_BuildValue("(sii)", name, major, minor) : ft_py_raise(s);
}

static PyObject *py_cuda_synchronize(PyObject *module, PyObject *arg) {
    (void)module;
    int dev;
    if (ft_py_parse_int(arg, &dev) < 0)
        return NULL;
    ft_status s = ft_cuda_check_device(dev);
    if (s == FT_OK) {
        Py_BEGIN_ALLOW_THREADS
        s = ft_cuda()->device_synchronize(dev);
        Py_END_ALLOW_THREADS
    }
    return s == FT_OK ? Py_NewRef(Py_None) : ft_py_raise(s);
}

static PyMethodDef runtime_functions[] = {
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
    {"cpu_bf16", py_cpu_bf16, METH_NOARGS,
     "Whether fasttrain's kernels multiply bfloat16 in hardware (AVX512-BF16, unless ONEDNN_MAX_CPU_ISA caps it)."},
    {"cuda_set_library", py_cuda_set_library, METH_O,
     "Name the CUDA backend library that the first CUDA use loads (only the first name counts)."},
    {"cuda_device_count", py_cuda_device_count, METH_NOARGS, NULL},
    {"cuda_unavailable_reason", py_cuda_unavailable_reason, METH_NOARGS, NULL},
    {"cuda_device_props", py_cuda_device_props, METH_O, NULL},
    {"cuda_synchronize", py_cuda_synchronize, METH_O, NULL},
    {NULL, NULL, 0, NULL},
};

int ft_py_bind_runtime(PyObject *module) {
    if (PyModule_AddIntConstant(module, "CUDA_COMPILED", FT_WITH_CUDA) < 0)
        return -1;
    return PyModule_AddFunctions(module, runtime_functions);
}
