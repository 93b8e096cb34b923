/* fasttrain._C.TensorBase, the C half of fasttrain.Tensor (the Python class
 * in python/fasttrain/_tensor.py derives from it and adds indexing, repr and
 * the PyTorch-style conveniences), and the module functions that make
 * tensors. */
#include "bind/bind.h"

#include <structmember.h>

#include "core/cuda.h"
#include "ops/check.h"

#define SELF (&((ft_tensor_object *)self)->t)

static PyObject *tensor_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    (void)type, (void)args, (void)kwargs;
    PyErr_SetString(PyExc_TypeError, "tensors are made by ft.tensor, ft.empty, ft.zeros, ft.from_numpy, ... "
                                     "not by calling the class");
    return NULL;
}

static int tensor_traverse(PyObject *self, visitproc visit, void *arg) {
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(((ft_tensor_object *)self)->grad);
    return 0;
}

static int tensor_clear(PyObject *self) {
    Py_CLEAR(((ft_tensor_object *)self)->grad);
    return 0;
}

static void tensor_dealloc(PyObject *self) {
    PyTypeObject *type = Py_TYPE(self);
    ft_tensor_object *obj = (ft_tensor_object *)self;
    PyObject_GC_UnTrack(self);
    tensor_clear(self);
    if (obj->weakreflist)
        PyObject_ClearWeakRefs(self);
    if (obj->t.storage)
        ft_tensor_release(&obj->t);
    type->tp_free(self);
    Py_DECREF(type);
}

PyObject *ft_py_wrap(ft_module_state *st, ft_tensor *t) {
    ft_tensor_object *obj = (ft_tensor_object *)st->tensor_class->tp_alloc(st->tensor_class, 0);
    if (!obj) {
        ft_tensor_release(t);
        return NULL;
    }
    obj->t = *t;
    return (PyObject *)obj;
}

ft_tensor *ft_py_unwrap(ft_module_state *st, PyObject *obj, const char *what) {
    if (!PyObject_TypeCheck(obj, st->tensor_base)) {
        PyErr_Format(PyExc_TypeError, "%s must be a fasttrain Tensor, not %.100s", what, Py_TYPE(obj)->tp_name);
        return NULL;
    }
    return &((ft_tensor_object *)obj)->t;
}

PyObject *ft_py_shape_tuple(const int64_t *v, int n) {
    PyObject *tuple = PyTuple_New(n);
    for (int i = 0; tuple && i < n; i++) {
        PyObject *item = PyLong_FromLongLong(v[i]);
        if (!item) {
            Py_CLEAR(tuple);
            break;
        }
        PyTuple_SET_ITEM(tuple, i, item);
    }
    return tuple;
}

static PyObject *tensor_get_shape(PyObject *self, void *closure) {
    (void)closure;
    return ft_py_shape_tuple(SELF->shape, SELF->ndim);
}

static PyObject *tensor_get_ndim(PyObject *self, void *closure) {
    (void)closure;
    return PyLong_FromLong(SELF->ndim);
}

static PyObject *tensor_get_dtype_code(PyObject *self, void *closure) {
    (void)closure;
    return PyLong_FromLong(SELF->dtype);
}

static PyObject *tensor_get_device_tuple(PyObject *self, void *closure) {
    (void)closure;
    ft_device d = ft_tensor_device(SELF);
    return Py_BuildValue("(ii)", d.type, d.index);
}

static PyObject *tensor_get_readonly(PyObject *self, void *closure) {
    (void)closure;
    return PyBool_FromLong(SELF->storage->readonly);
}

static PyObject *tensor_get_grad(PyObject *self, void *closure) {
    (void)closure;
    PyObject *g = ((ft_tensor_object *)self)->grad;
    return Py_NewRef(g ? g : Py_None);
}

static int tensor_set_grad(PyObject *self, PyObject *value, void *closure) {
    (void)closure;
    if (value && value != Py_None && !PyObject_TypeCheck(value, ft_py_state_of_type(Py_TYPE(self))->tensor_base)) {
        PyErr_Format(PyExc_TypeError, "grad must be a fasttrain Tensor or None, not %.100s", Py_TYPE(value)->tp_name);
        return -1;
    }
    Py_XSETREF(((ft_tensor_object *)self)->grad, value && value != Py_None ? Py_NewRef(value) : NULL);
    return 0;
}

static PyObject *tensor_get_dlpack_device(PyObject *self, PyObject *unused) {
    (void)unused;
    return ft_py_dlpack_device(SELF);
}

static PyObject *tensor_stride(PyObject *self, PyObject *args) {
    PyObject *dim = Py_None;
    if (!PyArg_ParseTuple(args, "|O:stride", &dim))
        return NULL;
    if (dim == Py_None)
        return ft_py_shape_tuple(SELF->strides, SELF->ndim);
    long d = PyLong_AsLong(dim);
    if (d == -1 && PyErr_Occurred())
        return NULL;
    if (d < -SELF->ndim || d >= SELF->ndim)
        return PyErr_Format(PyExc_IndexError, "dimension %ld out of range for a %d-d tensor", d, SELF->ndim);
    return PyLong_FromLongLong(SELF->strides[d < 0 ? d + SELF->ndim : d]);
}

static PyObject *tensor_data_ptr(PyObject *self, PyObject *unused) {
    (void)unused;
    return PyLong_FromVoidPtr(ft_tensor_data(SELF));
}

static PyObject *tensor_numel(PyObject *self, PyObject *unused) {
    (void)unused;
    return PyLong_FromLongLong(ft_tensor_numel(SELF));
}

static PyObject *tensor_element_size(PyObject *self, PyObject *unused) {
    (void)unused;
    return PyLong_FromSize_t(ft_dtype_get(SELF->dtype)->itemsize);
}

static PyObject *tensor_storage_offset(PyObject *self, PyObject *unused) {
    (void)unused;
    return PyLong_FromLongLong(SELF->offset / (int64_t)ft_dtype_get(SELF->dtype)->itemsize);
}

static PyObject *tensor_is_contiguous(PyObject *self, PyObject *unused) {
    (void)unused;
    return PyBool_FromLong(ft_tensor_is_contiguous(SELF));
}

static PyObject *tensor_is_pinned(PyObject *self, PyObject *unused) {
    (void)unused;
    return PyBool_FromLong(SELF->storage->pinned);
}

static PyObject *tensor_as_strided(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"size", "stride", "storage_offset", NULL};
    PyObject *size_obj, *stride_obj, *offset_obj = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO|O:as_strided", kwlist, &size_obj, &stride_obj, &offset_obj))
        return NULL;
    int64_t shape[FT_MAX_DIMS], strides[FT_MAX_DIMS];
    int ndim, nstrides;
    if (ft_py_parse_shape(size_obj, shape, &ndim) < 0 || ft_py_parse_shape(stride_obj, strides, &nstrides) < 0)
        return NULL;
    if (ndim != nstrides)
        return PyErr_Format(PyExc_ValueError, "as_strided: %d sizes but %d strides", ndim, nstrides);
    int64_t itemsize = (int64_t)ft_dtype_get(SELF->dtype)->itemsize, offset = SELF->offset;
    if (offset_obj != Py_None) {
        long long elems = PyLong_AsLongLong(offset_obj);
        if (elems == -1 && PyErr_Occurred())
            return NULL;
        if (elems < 0 || elems > INT64_MAX / itemsize)
            return PyErr_Format(PyExc_ValueError, "as_strided: storage_offset %lld is out of range", elems);
        offset = elems * itemsize;
    }
    ft_tensor v;
    ft_status s = ft_tensor_view(&v, SELF, ndim, shape, strides, offset);
    return s == FT_OK ? ft_py_wrap(ft_py_state_of_type(Py_TYPE(self)), &v) : ft_py_raise(s);
}

static size_t nbytes_of(const ft_tensor *t) {
    return (size_t)ft_tensor_numel(t) * ft_dtype_get(t->dtype)->itemsize;
}

static PyObject *tensor_copy(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"src", "non_blocking", NULL};
    PyObject *src_obj;
    int non_blocking = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|p:_copy_from", kwlist, &src_obj, &non_blocking))
        return NULL;
    ft_tensor *src = ft_py_unwrap(ft_py_state_of_type(Py_TYPE(self)), src_obj, "copy_: src");
    if (!src)
        return NULL;
    /* several elements on one address (an expanded view): which value would land is not defined */
    ft_status s = ft_check_output("copy_", "the destination", SELF);
    if (s != FT_OK)
        return ft_py_raise(s);
    if (nbytes_of(SELF) >= FT_GIL_FREE_BYTES) {
        Py_BEGIN_ALLOW_THREADS
        s = ft_tensor_copy(SELF, src, non_blocking);
        Py_END_ALLOW_THREADS
    } else {
        s = ft_tensor_copy(SELF, src, non_blocking);
    }
    return s == FT_OK ? Py_NewRef(self) : ft_py_raise(s);
}

static PyObject *tensor_fill(PyObject *self, PyObject *value) {
    ft_scalar v;
    if (ft_py_parse_scalar(value, &v, NULL) < 0 || ft_py_check_scalar_fits(&v, SELF->dtype) < 0)
        return NULL;
    ft_status s;
    Py_BEGIN_ALLOW_THREADS
    s = ft_tensor_fill(SELF, v);
    Py_END_ALLOW_THREADS
    return s == FT_OK ? Py_NewRef(self) : ft_py_raise(s);
}

static PyObject *tensor_to(PyObject *self, PyObject *args) {
    int dtype, dev_type, dev_index, pinned, non_blocking, keep_layout;
    if (!PyArg_ParseTuple(args, "iiippp:_to", &dtype, &dev_type, &dev_index, &pinned, &non_blocking, &keep_layout))
        return NULL;
    if (!ft_dtype_valid(dtype) || (dev_type != FT_DEV_CPU && dev_type != FT_DEV_CUDA))
        return PyErr_Format(PyExc_ValueError, "_to: bad dtype %d or device type %d", dtype, dev_type);
    ft_device dev = {dev_type, dev_type == FT_DEV_CPU ? 0 : dev_index};
    ft_tensor out;
    ft_status s;
    Py_BEGIN_ALLOW_THREADS
    s = ft_tensor_to(&out, SELF, (ft_dtype)dtype, dev, pinned, non_blocking, keep_layout && !pinned);
    Py_END_ALLOW_THREADS
    return s == FT_OK ? ft_py_wrap(ft_py_state_of_type(Py_TYPE(self)), &out) : ft_py_raise(s);
}

/* Moves this tensor's values into `base`'s storage at element `offset`
 * (C-contiguous, on any device, converted to base's dtype) and makes this
 * object a view there. The object stays the same, so whoever holds it (an
 * optimizer's parameter list) then sees the flat buffer: the
 * contiguous-parameters trick without new objects, Module.to's move to
 * another device and Module.half's change of dtype. */
static PyObject *tensor_rebind(PyObject *self, PyObject *args) {
    PyObject *base_obj;
    long long offset;
    if (!PyArg_ParseTuple(args, "OL:_rebind", &base_obj, &offset))
        return NULL;
    ft_tensor *base = ft_py_unwrap(ft_py_state_of_type(Py_TYPE(self)), base_obj, "base");
    if (!base)
        return NULL;
    int64_t itemsize = (int64_t)ft_dtype_get(base->dtype)->itemsize, strides[FT_MAX_DIMS];
    if (offset < 0 || offset > INT64_MAX / itemsize)
        return PyErr_Format(PyExc_ValueError, "_rebind: offset %lld is out of range", offset);
    ft_contiguous_strides(strides, SELF->ndim, SELF->shape);
    ft_tensor view = {0};
    ft_status s = ft_tensor_view(&view, base, SELF->ndim, SELF->shape, strides, base->offset + offset * itemsize);
    if (s == FT_OK)
        s = ft_tensor_copy(&view, SELF, false);
    if (s != FT_OK) {
        if (view.storage)
            ft_tensor_release(&view);
        return ft_py_raise(s);
    }
    ft_tensor_release(SELF);
    *SELF = view;
    Py_RETURN_NONE;
}

/* The element of a one-element tensor as a Python number. */
static PyObject *tensor_item(PyObject *self, PyObject *unused) {
    (void)unused;
    int64_t n = ft_tensor_numel(SELF);
    if (n != 1)
        return PyErr_Format(PyExc_ValueError, "a tensor with %lld elements cannot be converted to a Python scalar",
                            (long long)n);
    ft_dtype dt = SELF->dtype;
    ft_dtype wide = ft_dtype_is_complex(dt) ? dt
                    : ft_dtype_is_float(dt) ? FT_FLOAT64
                    : dt == FT_UINT64       ? FT_UINT64
                                            : FT_INT64;
    union {
        double f;
        int64_t i;
        uint64_t u;
        double c[2];
        float c32[2];
    } value;
    ft_storage *s;
    ft_status st = ft_storage_borrow(&s, &value, sizeof value, FT_CPU, false, ft_storage_unowned, NULL);
    if (st != FT_OK)
        return ft_py_raise(st);
    ft_tensor one = {.storage = s, .dtype = wide, .ndim = SELF->ndim};
    memcpy(one.shape, SELF->shape, sizeof one.shape);
    st = ft_tensor_copy(&one, SELF, false);
    ft_storage_release(s);
    if (st != FT_OK)
        return ft_py_raise(st);
    switch (wide) {
    case FT_FLOAT64: return PyFloat_FromDouble(value.f);
    case FT_UINT64: return PyLong_FromUnsignedLongLong(value.u);
    case FT_COMPLEX64: return PyComplex_FromDoubles(value.c32[0], value.c32[1]);
    case FT_COMPLEX128: return PyComplex_FromDoubles(value.c[0], value.c[1]);
    default: return dt == FT_BOOL ? PyBool_FromLong(value.i != 0) : PyLong_FromLongLong(value.i);
    }
}

static PyObject *tensor_numpy(PyObject *self, PyObject *unused) {
    (void)unused;
    return ft_py_to_numpy(SELF);
}

static PyObject *tensor_storage_bytes(PyObject *self, PyObject *unused) {
    (void)unused;
    if (SELF->storage->device.type == FT_DEV_CUDA)
        return PyErr_Format(PyExc_TypeError, "a cuda tensor has no host memory");
    return ft_py_storage_bytes(SELF->storage);
}

static PyObject *tensor_dlpack(PyObject *self, PyObject *args, PyObject *kwargs) {
    return ft_py_dlpack_export(self, args, kwargs);
}

/* ---- the buffer protocol ---- */

static const char *buffer_format(ft_dtype dt) {
    switch (dt) {
    case FT_BOOL: return "?";
    case FT_UINT8: return "B";
    case FT_INT8: return "b";
    case FT_INT16: return "h";
    case FT_INT32: return "i";
    case FT_INT64: return "q";
    case FT_UINT16: return "H";
    case FT_UINT32: return "I";
    case FT_UINT64: return "Q";
    case FT_FLOAT16: return "e";
    case FT_FLOAT32: return "f";
    case FT_FLOAT64: return "d";
    case FT_COMPLEX64: return "Zf";
    case FT_COMPLEX128: return "Zd";
    default: return NULL;
    }
}

struct buffer_export {
    ft_storage *storage;
    Py_ssize_t dims[]; // shape (ndim), then strides in bytes (ndim)
};

static int tensor_getbuffer(PyObject *self, Py_buffer *view, int flags) {
    ft_tensor *t = SELF;
    PyObject *check = ft_py_state_of_type(Py_TYPE(self))->export_check;
    PyObject *checked = check ? PyObject_CallOneArg(check, self) : Py_NewRef(Py_None);
    if (!checked) { /* a trainable parameter read by a traced forward (np.array(self.weight)) */
        view->obj = NULL;
        return -1;
    }
    Py_DECREF(checked);
    const char *format = buffer_format(t->dtype);
    bool c_contig = ft_tensor_is_contiguous(t), f_contig = ft_tensor_is_f_contiguous(t);
    const char *problem = NULL;
    if (ft_tensor_device(t).type == FT_DEV_CUDA)
        problem = "a cuda tensor has no host buffer: copy it with .cpu() first";
    else if (!format)
        problem = "bfloat16 has no buffer-protocol format: use .to(ft.float32) or DLPack";
    else if ((flags & PyBUF_WRITABLE) && t->storage->readonly)
        problem = "the tensor is read-only";
    else if ((flags & PyBUF_C_CONTIGUOUS) == PyBUF_C_CONTIGUOUS && !c_contig)
        problem = "the tensor is not C-contiguous: call .contiguous() first";
    else if ((flags & PyBUF_F_CONTIGUOUS) == PyBUF_F_CONTIGUOUS && !f_contig)
        problem = "the tensor is not Fortran-contiguous";
    else if ((flags & PyBUF_ANY_CONTIGUOUS) == PyBUF_ANY_CONTIGUOUS && !c_contig && !f_contig)
        problem = "the tensor is not contiguous: call .contiguous() first";
    else if ((flags & PyBUF_STRIDES) != PyBUF_STRIDES && !c_contig)
        problem = "the tensor is not contiguous and the consumer does not accept strides";
    if (problem) {
        PyErr_SetString(PyExc_BufferError, problem);
        view->obj = NULL;
        return -1;
    }
    /* The export holds the storage, not only the tensor object: model.compile()
     * rebinds a parameter object to the flat buffer and releases its old
     * storage, which an array taken before must still be able to read. */
    struct buffer_export *ex = PyMem_Malloc(sizeof *ex + sizeof(Py_ssize_t) * 2 * (size_t)t->ndim);
    if (!ex) {
        PyErr_NoMemory();
        view->obj = NULL;
        return -1;
    }
    ex->storage = t->storage;
    ft_storage_retain(ex->storage);
    Py_ssize_t *dims = ex->dims;
    Py_ssize_t itemsize = (Py_ssize_t)ft_dtype_get(t->dtype)->itemsize;
    for (int i = 0; i < t->ndim; i++) {
        dims[i] = (Py_ssize_t)t->shape[i];
        dims[t->ndim + i] = (Py_ssize_t)t->strides[i] * itemsize;
    }
    view->buf = ft_tensor_data(t);
    view->obj = Py_NewRef(self);
    view->len = (Py_ssize_t)nbytes_of(t);
    view->readonly = t->storage->readonly;
    view->itemsize = itemsize;
    view->format = (flags & PyBUF_FORMAT) ? (char *)format : NULL;
    view->ndim = t->ndim;
    view->shape = (flags & PyBUF_ND) ? dims : NULL;
    view->strides = (flags & PyBUF_STRIDES) == PyBUF_STRIDES ? dims + t->ndim : NULL;
    view->suboffsets = NULL;
    view->internal = ex;
    return 0;
}

static void tensor_releasebuffer(PyObject *self, Py_buffer *view) {
    (void)self;
    struct buffer_export *ex = view->internal;
    ft_storage_release(ex->storage);
    PyMem_Free(ex);
}

static PyGetSetDef tensor_getset[] = {
    {"shape", tensor_get_shape, NULL, "The size of each dimension.", NULL},
    {"ndim", tensor_get_ndim, NULL, "The number of dimensions.", NULL},
    {"_dtype_code", tensor_get_dtype_code, NULL, NULL, NULL},
    {"_device_tuple", tensor_get_device_tuple, NULL, NULL, NULL},
    {"_readonly", tensor_get_readonly, NULL, NULL, NULL},
    {"grad", tensor_get_grad, tensor_set_grad,
     "The gradient the last training step wrote for this parameter (or None).", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef tensor_methods[] = {
    {"stride", tensor_stride, METH_VARARGS, "stride(dim=None): strides in elements."},
    {"data_ptr", tensor_data_ptr, METH_NOARGS, "Address of the first element."},
    {"numel", tensor_numel, METH_NOARGS, "Number of elements."},
    {"element_size", tensor_element_size, METH_NOARGS, "Bytes per element."},
    {"storage_offset", tensor_storage_offset, METH_NOARGS, "Offset of the first element in its storage, in elements."},
    {"is_contiguous", tensor_is_contiguous, METH_NOARGS, "Whether the layout is C-contiguous."},
    {"is_pinned", tensor_is_pinned, METH_NOARGS, "Whether the memory is page-locked host memory."},
    {"as_strided", (PyCFunction)(void (*)(void))tensor_as_strided, METH_VARARGS | METH_KEYWORDS,
     "as_strided(size, stride, storage_offset=None): a view of the same storage."},
    {"_copy_from", (PyCFunction)(void (*)(void))tensor_copy, METH_VARARGS | METH_KEYWORDS, NULL},
    {"_fill", tensor_fill, METH_O, NULL},
    {"_to", tensor_to, METH_VARARGS, NULL},
    {"_rebind", tensor_rebind, METH_VARARGS, NULL},
    {"item", tensor_item, METH_NOARGS, "The value of a one-element tensor as a Python number."},
    {"numpy", tensor_numpy, METH_NOARGS, "A NumPy array sharing this tensor's memory."},
    {"_storage_bytes", tensor_storage_bytes, METH_NOARGS, NULL},
    {"__dlpack__", (PyCFunction)(void (*)(void))tensor_dlpack, METH_VARARGS | METH_KEYWORDS,
     "__dlpack__(*, stream=None, max_version=None, dl_device=None, copy=None)"},
    {"__dlpack_device__", tensor_get_dlpack_device, METH_NOARGS, "(device type, device id) in DLPack's codes."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef tensor_members[] = {
    {"__weaklistoffset__", T_PYSSIZET, offsetof(ft_tensor_object, weakreflist), READONLY, NULL},
    {"requires_grad", T_BOOL, offsetof(ft_tensor_object, requires_grad), 0,
     "Whether a compiled program computes this tensor's gradient (False freezes a parameter)."},
    {NULL, 0, 0, 0, NULL},
};

static PyType_Slot tensor_slots[] = {
    {Py_tp_new, tensor_new},
    {Py_tp_dealloc, tensor_dealloc},
    {Py_tp_traverse, tensor_traverse},
    {Py_tp_clear, tensor_clear},
    {Py_tp_getset, tensor_getset},
    {Py_tp_methods, tensor_methods},
    {Py_tp_members, tensor_members},
    {Py_bf_getbuffer, tensor_getbuffer},
    {Py_bf_releasebuffer, tensor_releasebuffer},
    {Py_tp_doc, "The C part of fasttrain.Tensor."},
    {0, NULL},
};

static PyType_Spec tensor_spec = {
    .name = "fasttrain._C.TensorBase",
    .basicsize = sizeof(ft_tensor_object),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .slots = tensor_slots,
};

/* ---- module functions that make tensors ---- */

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
    if (ft_py_parse_shape(shape_obj, shape, &ndim) < 0 || parse_device(dev_type, dev_index, &dev) < 0)
        return NULL;
    if (!ft_dtype_valid(dtype))
        return PyErr_Format(PyExc_ValueError, "unknown dtype code %d", dtype);
    if (pinned && dev.type != FT_DEV_CPU)
        return PyErr_Format(PyExc_ValueError, "only CPU tensors can be pinned");
    ft_tensor t;
    ft_status s = ft_tensor_empty(&t, ndim, shape, (ft_dtype)dtype, dev, pinned);
    return s == FT_OK ? ft_py_wrap(ft_py_state(module), &t) : ft_py_raise(s);
}

static PyObject *py_from_numpy(PyObject *module, PyObject *arr) { return ft_py_from_numpy(ft_py_state(module), arr); }

static PyObject *py_from_dlpack(PyObject *module, PyObject *obj) { return ft_py_from_dlpack(ft_py_state(module), obj); }

static PyObject *py_tensor_from_data(PyObject *module, PyObject *args) {
    PyObject *data;
    int dtype;
    if (!PyArg_ParseTuple(args, "Oi", &data, &dtype))
        return NULL;
    return ft_py_tensor_from_data(ft_py_state(module), data, dtype);
}

static PyObject *py_set_tensor_class(PyObject *module, PyObject *cls) {
    ft_module_state *st = ft_py_state(module);
    if (!PyType_Check(cls) || !PyType_IsSubtype((PyTypeObject *)cls, st->tensor_base))
        return PyErr_Format(PyExc_TypeError, "the tensor class must derive from TensorBase");
    Py_SETREF(st->tensor_class, (PyTypeObject *)Py_NewRef(cls));
    Py_RETURN_NONE;
}

/* _set_export_check(fn or None): fn(tensor) runs before each buffer export (see ft_module_state). */
static PyObject *py_set_export_check(PyObject *module, PyObject *fn) {
    if (fn != Py_None && !PyCallable_Check(fn))
        return PyErr_Format(PyExc_TypeError, "_set_export_check takes a callable or None, got %s",
                            Py_TYPE(fn)->tp_name);
    ft_module_state *st = ft_py_state(module);
    Py_XSETREF(st->export_check, fn == Py_None ? NULL : Py_NewRef(fn));
    Py_RETURN_NONE;
}

static PyMethodDef tensor_functions[] = {
    {"empty", py_empty, METH_VARARGS, "empty(shape, dtype, device_type, device_index, pinned)"},
    {"from_numpy", py_from_numpy, METH_O, "A tensor sharing the memory of a NumPy array."},
    {"from_dlpack", py_from_dlpack, METH_O, "A tensor sharing the memory of a DLPack producer or capsule."},
    {"tensor_from_data", py_tensor_from_data, METH_VARARGS, "tensor_from_data(data, dtype or -1)"},
    {"_set_tensor_class", py_set_tensor_class, METH_O, NULL},
    {"_set_export_check", py_set_export_check, METH_O, NULL},
    {NULL, NULL, 0, NULL},
};

/* (name, code, DLPack code, bits, itemsize) of each dtype, which ft.dtype reads. */
static PyObject *dtype_table(void) {
    PyObject *table = PyList_New(FT_NUM_DTYPES);
    for (int i = 0; table && i < FT_NUM_DTYPES; i++) {
        const ft_dtype_info *info = ft_dtype_get((ft_dtype)i);
        PyObject *item = Py_BuildValue("(siiin)", info->name, i, info->dl_code, info->bits, (Py_ssize_t)info->itemsize);
        if (!item) {
            Py_CLEAR(table);
            break;
        }
        PyList_SET_ITEM(table, i, item);
    }
    return table;
}

int ft_py_bind_tensor(PyObject *module) {
    ft_module_state *st = ft_py_state(module);
    st->tensor_base = (PyTypeObject *)PyType_FromModuleAndSpec(module, &tensor_spec, NULL);
    if (!st->tensor_base)
        return -1;
    st->tensor_class = (PyTypeObject *)Py_NewRef(st->tensor_base);
    if (PyModule_AddObjectRef(module, "TensorBase", (PyObject *)st->tensor_base) < 0 ||
        PyModule_AddIntConstant(module, "MAX_DIMS", FT_MAX_DIMS) < 0)
        return -1;
    PyObject *dtypes = dtype_table();
    int r = dtypes ? PyModule_AddObjectRef(module, "DTYPES", dtypes) : -1;
    Py_XDECREF(dtypes);
    return r < 0 ? -1 : PyModule_AddFunctions(module, tensor_functions);
}
