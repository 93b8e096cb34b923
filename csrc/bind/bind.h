/* Shared declarations of the Python binding: the only C code that includes
 * Python.h and NumPy. */
#ifndef FT_BIND_BIND_H
#define FT_BIND_BIND_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#define PY_ARRAY_UNIQUE_SYMBOL fasttrain_ARRAY_API
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#ifndef FT_BIND_IMPORTS_NUMPY
#define NO_IMPORT_ARRAY
#endif
#include <numpy/arrayobject.h>

#include "core/status.h"
#include "core/tensor.h"
#include "optim/optim.h"

typedef struct {
    PyObject_HEAD
    ft_tensor t;
    PyObject *weakreflist;
    PyObject *grad; /* t.grad: a tensor or NULL (None), as PyTorch's */
    char requires_grad; /* whether a compiled program differentiates it (parameters: true unless frozen) */
} ft_tensor_object;

typedef struct {
    PyTypeObject *tensor_base;  /* fasttrain._C.TensorBase */
    PyTypeObject *tensor_class; /* the class new tensors get: fasttrain.Tensor once registered */
    PyObject *export_check;     /* while a forward is traced: called with a tensor before its buffer is exported */
} ft_module_state;

extern PyModuleDef ft_module_def;

/* Every name the binding exports starts with ft_py_; each file adds what it
 * defines to the module from its ft_py_bind_* function (module.c calls them
 * in order), with the module functions named py_<name> and a type's methods
 * <type>_<name>. */

/* Sets the Python exception for a failed status and returns NULL. */
PyObject *ft_py_raise(ft_status status);

/* The module state, from the module or from a type the module defined. */
ft_module_state *ft_py_state(PyObject *module);
ft_module_state *ft_py_state_of_type(PyTypeObject *type);

/* Adds a type made from spec under its short name. */
int ft_py_add_type(PyObject *module, PyType_Spec *spec);
/* Adds {name_of(k): k for k < n} as module attribute `attr`: the Python side
 * reads the C enums from there instead of mirroring them. */
int ft_py_add_enum(PyObject *module, const char *attr, int n, const char *(*name_of)(int));

/* Wraps t (taking its storage reference) in a new tensor object; on failure
 * the reference is released (bind/tensor.c). */
PyObject *ft_py_wrap(ft_module_state *st, ft_tensor *t);

/* Borrows the ft_tensor of a fasttrain tensor, or raises TypeError naming `what`. */
ft_tensor *ft_py_unwrap(ft_module_state *st, PyObject *obj, const char *what);

/* n int64 values (a shape, strides) as a tuple of ints (bind/tensor.c). */
PyObject *ft_py_shape_tuple(const int64_t *v, int n);

/* Shared argument parsing (bind/args.c): an int with TypeError/OverflowError
 * for anything else; a shape given as an int or a sequence of ints; a Python
 * or NumPy number as a scalar, or TypeError or OverflowError, with
 * *natural (if not NULL) the dtype PyTorch would infer. */
int ft_py_parse_int(PyObject *arg, int *out);
int ft_py_parse_shape(PyObject *obj, int64_t *shape, int *ndim);
int ft_py_parse_scalar(PyObject *obj, ft_scalar *out, ft_dtype *natural);
/* 0 when storing s in dtype loses no more than PyTorch's checked
 * conversion lets a number lose (a float's fraction; a negative integer
 * into uint8..uint32 wraps), else OverflowError and -1. */
int ft_py_check_scalar_fits(const ft_scalar *s, ft_dtype dtype);

/* Conversions between fasttrain tensors and NumPy arrays (bind/numpy.c). */
PyObject *ft_py_from_numpy(ft_module_state *st, PyObject *arr);
int ft_py_dtype_of_descr(PyArray_Descr *descr, ft_dtype *out);
PyObject *ft_py_to_numpy(ft_tensor *t);
/* A 1-d uint8 array over all of a host storage's bytes that holds the storage
 * (the `data` of __array_interface__, so that the array outlives a rebind). */
PyObject *ft_py_storage_bytes(ft_storage *s);

/* DLPack both ways (bind/dlpack.c). */
PyObject *ft_py_dlpack_export(PyObject *self, PyObject *args, PyObject *kwargs);
PyObject *ft_py_dlpack_device(ft_tensor *t);
PyObject *ft_py_from_dlpack(ft_module_state *st, PyObject *obj);

/* A tensor built from nested sequences of numbers (bind/convert.c). */
PyObject *ft_py_tensor_from_data(ft_module_state *st, PyObject *data, int dtype);

/* Each binding file adds its functions, types and constants to the module. */
int ft_py_bind_tensor(PyObject *module);
int ft_py_bind_random(PyObject *module);
int ft_py_bind_runtime(PyObject *module);
int ft_py_bind_dist(PyObject *module);
int ft_py_bind_ops(PyObject *module);
int ft_py_bind_nn(PyObject *module);
int ft_py_bind_data(PyObject *module);
int ft_py_bind_optim(PyObject *module);

/* The C optimizer behind an ft.optim optimizer (or a _C.Optimizer), for a C
 * training step that calls ft_optimizer_step itself with no Python per
 * step. For an ft.optim optimizer this builds or rebuilds the C optimizer
 * for its params and applies the param_groups' current hyperparameters, so
 * call it with the GIL held, again after Python changed param_groups (a
 * scheduler step). The pointer is valid while py_optimizer keeps that C
 * optimizer: until the next ft_py_optimizer_of or Python step() finds the
 * params moved or groups added. Its segments start without grads (skipped):
 * point them at the gradient buffers with ft_optimizer_set_grads; a Python
 * step() clears them again. NULL with TypeError if py_optimizer is neither. */
typedef struct ft_optimizer ft_optimizer;
ft_optimizer *ft_py_optimizer_of(PyObject *py_optimizer);
/* The C EMA of a _C.EMA for a C loop that updates it after every step
 * (fit's epoch), marked in use until ft_py_ema_end; NULL with an exception
 * where obj is no _C.EMA, is in use, or its params moved. With the GIL. */
typedef struct ft_ema ft_ema;
ft_ema *ft_py_ema_begin(PyObject *obj);
void ft_py_ema_end(PyObject *obj);
/* A parameter group's hyperparameters from the tuple ft.optim builds
 * (Optimizer._group_tuple); -1 with TypeError otherwise. */
int ft_py_parse_optim_group(PyObject *obj, ft_optim_group *g);


/* The C loader behind an ft.data.Loader (bind/data.c), for a C training loop
 * that pulls batches with ft_loader_next/ft_loader_release and no Python per
 * step (see data/loader.h for the threading contract). With the GIL:
 * ft_py_loader_begin marks the loader busy (NULL with TypeError if obj is not a
 * loader, ValueError if it is closed, RuntimeError if another call is using
 * it), and ft_py_loader_end, called once after the loop with the GIL, clears
 * the mark. The caller keeps a reference to obj in between. A close() meanwhile
 * (from another thread, or from a callback the loop runs) only raises the
 * flag that ft_py_loader_stopping reads, without the GIL: the loop then stops
 * after its current batch, ft_py_loader_end frees the loader and returns -1 with
 * RuntimeError, and a close() from another thread returns once that is done. */
typedef struct ft_loader ft_loader;
ft_loader *ft_py_loader_begin(PyObject *obj);
bool ft_py_loader_stopping(PyObject *obj);
int ft_py_loader_end(PyObject *obj);

/* Copies below this many bytes keep the GIL: releasing it costs more. */
#define FT_GIL_FREE_BYTES (1 << 16)

#endif
