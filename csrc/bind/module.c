/* The fasttrain._C module: its state, the mapping of statuses to Python
 * exceptions, and initialisation, which lets each binding file add what it
 * defines. */
#define FT_BIND_IMPORTS_NUMPY
#include "bind/bind.h"

PyObject *ft_py_raise(ft_status status) {
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

ft_module_state *ft_py_state(PyObject *module) { return PyModule_GetState(module); }

ft_module_state *ft_py_state_of_type(PyTypeObject *type) {
    PyObject *module = PyType_GetModuleByDef(type, &ft_module_def);
    return module ? PyModule_GetState(module) : NULL;
}

int ft_py_add_type(PyObject *module, PyType_Spec *spec) {
    PyObject *type = PyType_FromModuleAndSpec(module, spec, NULL);
    if (!type)
        return -1;
    int r = PyModule_AddObjectRef(module, strrchr(spec->name, '.') + 1, type);
    Py_DECREF(type);
    return r;
}

int ft_py_add_enum(PyObject *module, const char *attr, int n, const char *(*name_of)(int)) {
    PyObject *d = PyDict_New();
    for (int k = 0; d && k < n; k++) {
        PyObject *code = PyLong_FromLong(k);
        int r = code ? PyDict_SetItemString(d, name_of(k), code) : -1;
        Py_XDECREF(code);
        if (r < 0)
            Py_CLEAR(d);
    }
    int r = d ? PyModule_AddObjectRef(module, attr, d) : -1;
    Py_XDECREF(d);
    return r;
}

static int module_exec(PyObject *module) {
    if (PyArray_ImportNumPyAPI() < 0)
        return -1;
    /* The tensor type first: every other file's functions make or take tensors. */
    int (*const bind[])(PyObject *) = {ft_py_bind_tensor, ft_py_bind_random, ft_py_bind_runtime, ft_py_bind_dist,
                                       ft_py_bind_ops,    ft_py_bind_optim,  ft_py_bind_nn,      ft_py_bind_data};
    for (size_t i = 0; i < sizeof bind / sizeof *bind; i++)
        if (bind[i](module) < 0)
            return -1;
    return 0;
}

static int module_traverse(PyObject *module, visitproc visit, void *arg) {
    ft_module_state *st = ft_py_state(module);
    Py_VISIT(st->tensor_base);
    Py_VISIT(st->tensor_class);
    Py_VISIT(st->export_check);
    return 0;
}

static int module_clear(PyObject *module) {
    ft_module_state *st = ft_py_state(module);
    Py_CLEAR(st->tensor_base);
    Py_CLEAR(st->tensor_class);
    Py_CLEAR(st->export_check);
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
    .m_slots = module_slots,
    .m_traverse = module_traverse,
    .m_clear = module_clear,
};

PyMODINIT_FUNC PyInit__C(void) { return PyModuleDef_Init(&ft_module_def); }
