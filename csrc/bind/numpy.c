/* The NumPy bridge: arrays in and out without copying. */
#include "bind/bind.h"

static int npy_type_of(ft_dtype dt) {
    switch (dt) {
    case FT_BOOL: return NPY_BOOL;
    case FT_UINT8: return NPY_UINT8;
    case FT_INT8: return NPY_INT8;
    case FT_INT16: return NPY_INT16;
    case FT_INT32: return NPY_INT32;
    case FT_INT64: return NPY_INT64;
    case FT_UINT16: return NPY_UINT16;
    case FT_UINT32: return NPY_UINT32;
    case FT_UINT64: return NPY_UINT64;
    case FT_FLOAT16: return NPY_HALF;
    case FT_FLOAT32: return NPY_FLOAT32;
    case FT_FLOAT64: return NPY_FLOAT64;
    case FT_COMPLEX64: return NPY_COMPLEX64;
    case FT_COMPLEX128: return NPY_COMPLEX128;
    default: return -1; /* bfloat16: NumPy has no such type */
    }
}

int ft_py_dtype_of_descr(PyArray_Descr *d, ft_dtype *out) {
    int code;
    switch (d->kind) {
    case 'b': code = FT_DL_BOOL; break;
    case 'i': code = FT_DL_INT; break;
    case 'u': code = FT_DL_UINT; break;
    case 'f': code = FT_DL_FLOAT; break;
    case 'c': code = FT_DL_COMPLEX; break;
    default: code = -1; break;
    }
    int bits = (int)PyDataType_ELSIZE(d) * 8;
    if (code < 0 || ft_dtype_from_dlpack(out, code, bits, 1) != FT_OK) {
        PyErr_Format(PyExc_TypeError,
                     "can't convert np.ndarray of type %S: fasttrain supports bool, int8-64, uint8-64, float16, "
                     "float32, float64, complex64 and complex128 (convert with a.astype(...))",
                     (PyObject *)d);
        return -1;
    }
    return 0;
}

/* Storage release for memory borrowed from an array: drops the reference
 * under the GIL, from whichever thread releases the storage. */
static void release_array(void *owner) {
    PyGILState_STATE gil = PyGILState_Ensure();
    Py_DECREF((PyObject *)owner);
    PyGILState_Release(gil);
}

PyObject *ft_py_from_numpy(ft_module_state *st, PyObject *obj) {
    if (!PyArray_Check(obj))
        return PyErr_Format(PyExc_TypeError, "expected np.ndarray (got %.100s)", Py_TYPE(obj)->tp_name);
    PyArrayObject *arr = (PyArrayObject *)obj;
    ft_dtype dtype;
    if (ft_py_dtype_of_descr(PyArray_DESCR(arr), &dtype) < 0)
        return NULL;
    if (!PyArray_ISNOTSWAPPED(arr))
        return PyErr_Format(PyExc_ValueError, "the array has non-native byte order; convert it first with "
                                              "a.astype(a.dtype.newbyteorder('='))");
    int ndim = PyArray_NDIM(arr);
    if (ndim > FT_MAX_DIMS)
        return PyErr_Format(PyExc_ValueError, "a tensor has at most %d dimensions, the array has %d", FT_MAX_DIMS,
                            ndim);
    npy_intp itemsize = PyArray_ITEMSIZE(arr);
    int64_t shape[FT_MAX_DIMS], strides[FT_MAX_DIMS];
    for (int i = 0; i < ndim; i++) {
        npy_intp s = PyArray_STRIDE(arr, i);
        if (s % itemsize != 0)
            return PyErr_Format(PyExc_ValueError,
                                "the array's strides are not a multiple of its element size %zd bytes; copy it "
                                "first with np.ascontiguousarray(a)",
                                (Py_ssize_t)itemsize);
        shape[i] = PyArray_DIM(arr, i);
        strides[i] = s / itemsize;
    }
    ft_tensor t;
    ft_status s = ft_tensor_borrow(&t, PyArray_DATA(arr), ndim, shape, strides, dtype, FT_CPU,
                                   !PyArray_ISWRITEABLE(arr), release_array, obj);
    if (s != FT_OK)
        return ft_py_raise(s);
    Py_INCREF(obj); /* now owned by the storage */
    return ft_py_wrap(st, &t);
}

static void storage_capsule_release(PyObject *capsule) {
    ft_storage_release(PyCapsule_GetPointer(capsule, "fasttrain.storage"));
}

/* arr (new, or NULL on failure) over storage s's memory, holding s through
 * a capsule as its base: the array stays valid after every tensor view of
 * the storage is gone. */
static PyObject *holding_storage(PyObject *arr, ft_storage *s) {
    PyObject *base = arr ? PyCapsule_New(s, "fasttrain.storage", storage_capsule_release) : NULL;
    if (!base) {
        Py_XDECREF(arr);
        return NULL;
    }
    ft_storage_retain(s);
    if (PyArray_SetBaseObject((PyArrayObject *)arr, base) < 0) { /* it took base's reference all the same */
        Py_DECREF(arr);
        return NULL;
    }
    return arr;
}

PyObject *ft_py_to_numpy(ft_tensor *t) {
    if (t->storage->device.type == FT_DEV_CUDA)
        return PyErr_Format(PyExc_TypeError, "can't convert a cuda tensor to numpy: copy it to the host first "
                                             "with .cpu()");
    int typenum = npy_type_of(t->dtype);
    if (typenum < 0)
        return PyErr_Format(PyExc_TypeError, "NumPy has no bfloat16 type: convert with .to(ft.float32) or share "
                                             "it through DLPack");
    npy_intp dims[FT_MAX_DIMS], strides[FT_MAX_DIMS];
    npy_intp itemsize = (npy_intp)ft_dtype_get(t->dtype)->itemsize;
    for (int i = 0; i < t->ndim; i++) {
        dims[i] = (npy_intp)t->shape[i];
        strides[i] = (npy_intp)t->strides[i] * itemsize;
    }
    PyArray_Descr *descr = PyArray_DescrFromType(typenum);
    PyObject *arr = PyArray_NewFromDescr(&PyArray_Type, descr, t->ndim, dims, strides, ft_tensor_data(t),
                                         t->storage->readonly ? 0 : NPY_ARRAY_WRITEABLE, NULL);
    return holding_storage(arr, t->storage);
}

PyObject *ft_py_storage_bytes(ft_storage *s) {
    npy_intp n = (npy_intp)s->nbytes;
    PyObject *arr = PyArray_New(&PyArray_Type, 1, &n, NPY_UINT8, NULL, s->data, 1,
                                s->readonly ? 0 : NPY_ARRAY_WRITEABLE, NULL);
    return holding_storage(arr, s);
}
