/* DLPack both ways: __dlpack__ / __dlpack_device__ on tensors and
 * ft.from_dlpack for any producer, with legacy ("dltensor") and 1.x
 * ("dltensor_versioned") capsules. */
#include "bind/bind.h"

#include "bind/dlpack.h"
#include "core/cuda.h"

static const char LEGACY[] = "dltensor", VERSIONED[] = "dltensor_versioned";
static const char USED_LEGACY[] = "used_dltensor", USED_VERSIONED[] = "used_dltensor_versioned";

/* ---- export ---- */

/* One allocation per export: the managed tensor first (its address is what
 * the deleter gets), then the view whose shape and strides it points into. */
typedef struct {
    union {
        DLManagedTensor legacy;
        DLManagedTensorVersioned versioned;
    } m;
    ft_tensor t;
} export_ctx;

static void export_free(export_ctx *ctx) {
    ft_tensor_release(&ctx->t);
    PyMem_RawFree(ctx);
}

static void delete_legacy(DLManagedTensor *m) { export_free((export_ctx *)m); }
static void delete_versioned(DLManagedTensorVersioned *m) { export_free((export_ctx *)m); }

/* A capsule that nobody consumed still owns its tensor. */
static void capsule_destructor(PyObject *capsule) {
    if (PyCapsule_IsValid(capsule, VERSIONED)) {
        DLManagedTensorVersioned *m = PyCapsule_GetPointer(capsule, VERSIONED);
        if (m->deleter)
            m->deleter(m);
    } else if (PyCapsule_IsValid(capsule, LEGACY)) {
        DLManagedTensor *m = PyCapsule_GetPointer(capsule, LEGACY);
        if (m->deleter)
            m->deleter(m);
    }
}

static DLDevice dl_device_of(const ft_tensor *t) {
    ft_device d = ft_tensor_device(t);
    return (DLDevice){d.type == FT_DEV_CUDA ? FT_DEV_CUDA : FT_DEV_CPU, d.index};
}

PyObject *ft_py_dlpack_device(ft_tensor *t) {
    DLDevice d = dl_device_of(t);
    return Py_BuildValue("(ii)", d.device_type, d.device_id);
}

static int parse_int_pair(PyObject *obj, const char *what, int *a, int *b) {
    if (!PyTuple_Check(obj) || !PyArg_ParseTuple(obj, "ii", a, b)) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s must be a tuple of two ints", what);
        return -1;
    }
    return 0;
}

PyObject *ft_py_dlpack_export(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"stream", "max_version", "dl_device", "copy", NULL};
    PyObject *stream = Py_None, *max_version = Py_None, *dl_device = Py_None, *copy_obj = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|$OOOO:__dlpack__", kwlist, &stream, &max_version, &dl_device,
                                     &copy_obj))
        return NULL;
    ft_tensor *t = &((ft_tensor_object *)self)->t;
    int major = 0, minor = 0;
    if (max_version != Py_None && parse_int_pair(max_version, "max_version", &major, &minor) < 0)
        return NULL;
    int copy = copy_obj == Py_None ? -1 : PyObject_IsTrue(copy_obj);
    if (copy_obj != Py_None && copy < 0)
        return NULL;
    DLDevice have = dl_device_of(t), want = have;
    if (dl_device != Py_None && parse_int_pair(dl_device, "dl_device", &want.device_type, &want.device_id) < 0)
        return NULL;
    bool to_host = false;
    if (want.device_type != have.device_type || want.device_id != have.device_id) {
        if (!(want.device_type == FT_DEV_CPU && have.device_type == FT_DEV_CUDA) || copy == 0)
            return PyErr_Format(PyExc_BufferError, "cannot export a tensor on DLPack device (%d, %d) to (%d, %d)%s",
                                have.device_type, have.device_id, want.device_type, want.device_id,
                                copy == 0 ? " without a copy" : "");
        to_host = true;
    }
    if (have.device_type == FT_DEV_CPU && stream != Py_None)
        return PyErr_Format(PyExc_ValueError, "__dlpack__: stream must be None for a CPU tensor");
    bool versioned = major >= 1;
    if (!versioned && t->storage->readonly)
        return PyErr_Format(PyExc_BufferError, "a read-only tensor can only be exported as a DLPack 1.x capsule "
                                               "(the consumer must pass max_version=(1, 0) or later)");

    export_ctx *ctx = PyMem_RawCalloc(1, sizeof *ctx);
    if (!ctx)
        return PyErr_NoMemory();
    ft_status s = FT_OK;
    if (copy == 1 || to_host) {
        Py_BEGIN_ALLOW_THREADS
        s = ft_tensor_to(&ctx->t, t, t->dtype, to_host ? FT_CPU : ft_tensor_device(t), false, false, false);
        Py_END_ALLOW_THREADS
    } else {
        ft_tensor_share(&ctx->t, t);
    }
    /* A producer on a device must have finished writing before the consumer's
     * stream reads; nothing finer-grained is tracked yet, so wait for the device. */
    if (s == FT_OK && have.device_type == FT_DEV_CUDA && !to_host && stream != Py_None) {
        Py_BEGIN_ALLOW_THREADS
        s = ft_cuda()->device_synchronize(have.device_id);
        Py_END_ALLOW_THREADS
    }
    if (s != FT_OK) {
        if (ctx->t.storage)
            ft_tensor_release(&ctx->t);
        PyMem_RawFree(ctx);
        return ft_py_raise(s);
    }
    DLTensor dl = {
        .data = ft_tensor_data(&ctx->t),
        .device = dl_device_of(&ctx->t),
        .ndim = ctx->t.ndim,
        .dtype = {ft_dtype_get(t->dtype)->dl_code, ft_dtype_get(t->dtype)->bits, 1},
        .shape = ctx->t.shape,
        .strides = ctx->t.strides,
        .byte_offset = 0,
    };
    if (versioned) {
        ctx->m.versioned = (DLManagedTensorVersioned){
            .version = {DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION},
            .manager_ctx = ctx,
            .deleter = delete_versioned,
            .flags = (ctx->t.storage->readonly ? DLPACK_FLAG_BITMASK_READ_ONLY : 0) |
                     (ctx->t.storage != t->storage ? DLPACK_FLAG_BITMASK_IS_COPIED : 0),
            .dl_tensor = dl,
        };
    } else {
        ctx->m.legacy = (DLManagedTensor){.dl_tensor = dl, .manager_ctx = ctx, .deleter = delete_legacy};
    }
    PyObject *capsule = PyCapsule_New(ctx, versioned ? VERSIONED : LEGACY, capsule_destructor);
    if (!capsule)
        export_free(ctx);
    return capsule;
}

/* ---- import ---- */

static void release_legacy(void *owner) {
    PyGILState_STATE gil = PyGILState_Ensure();
    DLManagedTensor *m = owner;
    if (m->deleter)
        m->deleter(m);
    PyGILState_Release(gil);
}

static void release_versioned(void *owner) {
    PyGILState_STATE gil = PyGILState_Ensure();
    DLManagedTensorVersioned *m = owner;
    if (m->deleter)
        m->deleter(m);
    PyGILState_Release(gil);
}

/* Asks a producer object for a capsule, preferring DLPack 1.x. */
static PyObject *request_capsule(PyObject *obj) {
    PyObject *method = PyObject_GetAttrString(obj, "__dlpack__");
    if (!method) {
        PyErr_Format(PyExc_TypeError, "from_dlpack expects an object with __dlpack__ or a DLPack capsule, got %.100s",
                     Py_TYPE(obj)->tp_name);
        return NULL;
    }
    PyObject *kwargs = Py_BuildValue("{s(ii)}", "max_version", DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION);
    PyObject *dev = kwargs ? PyObject_CallMethod(obj, "__dlpack_device__", NULL) : NULL;
    int dev_type = 0, dev_id = 0;
    if (dev && parse_int_pair(dev, "__dlpack_device__()'s result", &dev_type, &dev_id) < 0)
        Py_CLEAR(dev);
    /* A CUDA producer orders its work before the legacy default stream (1),
     * the stream fasttrain's device work runs on. */
    if (dev && dev_type == FT_DEV_CUDA) {
        PyObject *one = PyLong_FromLong(1);
        if (!one || PyDict_SetItemString(kwargs, "stream", one) < 0)
            Py_CLEAR(dev);
        Py_XDECREF(one);
    }
    PyObject *capsule = NULL;
    if (dev) {
        PyObject *empty = PyTuple_New(0);
        capsule = empty ? PyObject_Call(method, empty, kwargs) : NULL;
        /* A producer from before DLPack 1.0 does not know max_version. */
        if (!capsule && PyErr_ExceptionMatches(PyExc_TypeError)) {
            PyErr_Clear();
            PyDict_DelItemString(kwargs, "max_version");
            capsule = PyObject_Call(method, empty, kwargs);
        }
        Py_XDECREF(empty);
    }
    Py_XDECREF(dev);
    Py_XDECREF(kwargs);
    Py_DECREF(method);
    return capsule;
}

static PyObject *import_capsule(ft_module_state *st, PyObject *capsule) {
    const char *name = PyCapsule_GetName(capsule);
    if (!name && PyErr_Occurred())
        return NULL;
    bool versioned;
    if (name && strcmp(name, VERSIONED) == 0)
        versioned = true;
    else if (name && strcmp(name, LEGACY) == 0)
        versioned = false;
    else if (name && (strcmp(name, USED_VERSIONED) == 0 || strcmp(name, USED_LEGACY) == 0))
        return PyErr_Format(PyExc_ValueError, "this DLPack capsule was already consumed: a capsule can be imported "
                                              "only once");
    else
        return PyErr_Format(PyExc_TypeError, "not a DLPack capsule (its name is '%s')", name ? name : "");
    void *managed = PyCapsule_GetPointer(capsule, name);
    if (!managed)
        return NULL;
    DLTensor *dl;
    bool readonly = false;
    if (versioned) {
        DLManagedTensorVersioned *m = managed;
        if (m->version.major != DLPACK_MAJOR_VERSION)
            return PyErr_Format(PyExc_BufferError, "DLPack major version %u is not supported (fasttrain reads %d.x)",
                                m->version.major, DLPACK_MAJOR_VERSION);
        dl = &m->dl_tensor;
        readonly = m->flags & DLPACK_FLAG_BITMASK_READ_ONLY;
    } else {
        dl = &((DLManagedTensor *)managed)->dl_tensor;
    }

    ft_device device;
    switch (dl->device.device_type) {
    case FT_DEV_CPU:
    case FT_DEV_CUDA_HOST: device = FT_CPU; break;
    case FT_DEV_CUDA:
        if (ft_cuda_check_device(dl->device.device_id) != FT_OK)
            return ft_py_raise(FT_ERR_DEVICE);
        device = (ft_device){FT_DEV_CUDA, dl->device.device_id};
        break;
    default:
        return PyErr_Format(PyExc_BufferError, "DLPack device type %d is not supported by fasttrain",
                            dl->device.device_type);
    }
    ft_dtype dtype;
    ft_status s = ft_dtype_from_dlpack(&dtype, dl->dtype.code, dl->dtype.bits, dl->dtype.lanes);
    if (s != FT_OK)
        return ft_py_raise(s);
    if (dl->ndim < 0 || dl->ndim > FT_MAX_DIMS)
        return PyErr_Format(PyExc_BufferError, "DLPack tensor has %d dimensions; fasttrain supports 0 to %d",
                            dl->ndim, FT_MAX_DIMS);
    int64_t strides[FT_MAX_DIMS];
    if (dl->ndim > 0 && !dl->shape)
        return PyErr_Format(PyExc_BufferError, "DLPack tensor has no shape");
    if (dl->strides)
        memcpy(strides, dl->strides, (size_t)dl->ndim * sizeof *strides);
    else
        ft_contiguous_strides(strides, dl->ndim, dl->shape);
    int64_t numel;
    s = ft_shape_numel(&numel, dl->ndim, dl->shape, ft_dtype_get(dtype)->itemsize);
    if (s != FT_OK)
        return ft_py_raise(s);
    if (numel > 0 && !dl->data)
        return PyErr_Format(PyExc_BufferError, "DLPack tensor has a NULL data pointer");
    ft_tensor t;
    s = ft_tensor_borrow(&t, (char *)dl->data + dl->byte_offset, dl->ndim, dl->shape, strides, dtype, device, readonly,
                         versioned ? release_versioned : release_legacy, managed);
    if (s != FT_OK)
        return ft_py_raise(s);
    t.storage->pinned = dl->device.device_type == FT_DEV_CUDA_HOST;
    /* From here the storage owns the managed tensor: the capsule must not delete it. */
    if (PyCapsule_SetName(capsule, versioned ? USED_VERSIONED : USED_LEGACY) < 0 ||
        PyCapsule_SetDestructor(capsule, NULL) < 0) {
        t.storage->release = ft_storage_unowned;
        ft_tensor_release(&t);
        return NULL;
    }
    return ft_py_wrap(st, &t);
}

PyObject *ft_py_from_dlpack(ft_module_state *st, PyObject *obj) {
    if (PyCapsule_CheckExact(obj))
        return import_capsule(st, obj);
    PyObject *capsule = request_capsule(obj);
    if (!capsule)
        return NULL;
    PyObject *result = import_capsule(st, capsule);
    Py_DECREF(capsule);
    return result;
}
