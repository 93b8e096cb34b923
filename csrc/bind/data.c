/* fasttrain._C's data types: DataSource, LoaderBase (the C half of
 * ft.data.Loader), RecordWriter, and JPEG helpers for tests and benchmarks. */
#include "bind/bind.h"

#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#include "data/jpeg.h"
#include "data/loader.h"
#include "data/record.h"

/* ---- DataSource ---- */

typedef struct {
    PyObject_HEAD
    ft_source *src;
} source_object;

static void source_dealloc(PyObject *self) {
    PyTypeObject *type = Py_TYPE(self);
    source_object *o = (source_object *)self;
    if (o->src) {
        ft_source *s = o->src;
        o->src = NULL;
        /* Array sources drop NumPy references: release needs the GIL, which we hold. */
        ft_source_release(s);
    }
    type->tp_free(self);
    Py_DECREF(type);
}

static PyObject *source_new_object(PyTypeObject *type, ft_source *src) {
    source_object *o = (source_object *)type->tp_alloc(type, 0);
    if (!o) {
        ft_source_release(src);
        return NULL;
    }
    o->src = src;
    return (PyObject *)o;
}

static PyObject *source_tp_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"kind", "arg", "recover", NULL};
    const char *kind;
    PyObject *arg, *images = NULL;
    int recover = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "sO|p:DataSource", kwlist, &kind, &arg, &recover))
        return NULL;
    ft_source *src = NULL;
    ft_status st;
    if (strcmp(kind, "record") == 0 || strcmp(kind, "image_folder") == 0) {
        PyObject *bytes;
        if (!PyUnicode_FSConverter(arg, &bytes))
            return NULL;
        const char *path = PyBytes_AS_STRING(bytes);
        Py_BEGIN_ALLOW_THREADS
        st = kind[0] == 'r' ? ft_source_open_record(&src, path, recover) : ft_source_open_image_folder(&src, path);
        Py_END_ALLOW_THREADS
        Py_DECREF(bytes);
    } else if (strcmp(kind, "tar") == 0) {
        PyObject *seq = PySequence_Fast(arg, "tar shards must be a sequence of paths");
        if (!seq)
            return NULL;
        Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
        PyObject **held = PyMem_Calloc((size_t)n + 1, sizeof *held);
        const char **paths = PyMem_Calloc((size_t)n + 1, sizeof *paths);
        int ok = held && paths;
        for (Py_ssize_t i = 0; ok && i < n; i++) {
            ok = PyUnicode_FSConverter(PySequence_Fast_GET_ITEM(seq, i), &held[i]);
            if (ok)
                paths[i] = PyBytes_AS_STRING(held[i]);
        }
        if (ok) {
            Py_BEGIN_ALLOW_THREADS
            st = ft_source_open_tar(&src, paths, (int)n);
            Py_END_ALLOW_THREADS
        }
        for (Py_ssize_t i = 0; held && i < n; i++)
            Py_XDECREF(held[i]);
        PyMem_Free(held);
        PyMem_Free(paths);
        Py_DECREF(seq);
        if (!ok)
            return PyErr_Occurred() ? NULL : PyErr_NoMemory();
    } else if (strcmp(kind, "arrays") == 0 || strcmp(kind, "tensors") == 0) {
        ft_module_state *ms = ft_py_state_of_type(type);
        PyObject *labels;
        if (!ms || !PyArg_ParseTuple(arg, "OO", &images, &labels))
            return NULL;
        ft_tensor *ti = ft_py_unwrap(ms, images, "images"), *tl = ti ? ft_py_unwrap(ms, labels, "labels") : NULL;
        if (!tl)
            return NULL;
        st = kind[0] == 'a' ? ft_source_from_arrays(&src, ti, tl) : ft_source_from_tensors(&src, ti, tl);
    } else {
        return PyErr_Format(PyExc_ValueError, "unknown source kind '%s'", kind);
    }
    if (st != FT_OK)
        return ft_py_raise(st);
    return source_new_object(type, src);
}

static Py_ssize_t source_len(PyObject *self) { return (Py_ssize_t)ft_source_count(((source_object *)self)->src); }

static PyObject *source_get_kind(PyObject *self, void *closure) {
    (void)closure;
    return PyUnicode_FromString(ft_source_kind(((source_object *)self)->src));
}

static PyObject *source_get_skipped_images(PyObject *self, void *closure) {
    (void)closure;
    return PyLong_FromLongLong((long long)ft_source_skipped_images(((source_object *)self)->src));
}

/* A list of item(s, c) for each class c of an ImageFolder. */
static PyObject *per_class(PyObject *self, PyObject *(*item)(const ft_source *, int)) {
    ft_source *s = ((source_object *)self)->src;
    int n = ft_source_num_classes(s);
    PyObject *list = PyList_New(n);
    for (int c = 0; list && c < n; c++) {
        PyObject *x = item(s, c);
        if (!x) {
            Py_CLEAR(list);
            break;
        }
        PyList_SET_ITEM(list, c, x);
    }
    return list;
}

static PyObject *class_name(const ft_source *s, int c) { return PyUnicode_DecodeFSDefault(ft_source_class_name(s, c)); }

static PyObject *class_count(const ft_source *s, int c) {
    return PyLong_FromLongLong((long long)ft_source_class_count(s, c));
}

static PyObject *source_get_classes(PyObject *self, void *closure) {
    (void)closure;
    return per_class(self, class_name);
}

static PyObject *source_get_class_counts(PyObject *self, void *closure) {
    (void)closure;
    return per_class(self, class_count);
}

static PyObject *source_get_meta(PyObject *self, void *closure) {
    (void)closure;
    size_t len;
    const char *m = ft_source_meta(((source_object *)self)->src, &len);
    if (!m)
        Py_RETURN_NONE;
    return PyBytes_FromStringAndSize(m, (Py_ssize_t)len);
}

/* get(i, verify=True) -> (kind, bytes, label, height, width, channels): for
 * converters and tests. */
static PyObject *source_get(PyObject *self, PyObject *args) {
    long long i;
    int verify = 1;
    if (!PyArg_ParseTuple(args, "L|p:get", &i, &verify))
        return NULL;
    ft_fetch_buf buf = {0};
    ft_sample smp;
    ft_status st;
    Py_BEGIN_ALLOW_THREADS
    st = ft_source_get(((source_object *)self)->src, i, verify, &buf, &smp);
    Py_END_ALLOW_THREADS
    PyObject *r = NULL;
    if (st != FT_OK) {
        ft_py_raise(st);
    } else {
        const char *kind = smp.kind == FT_SAMPLE_JPEG ? "jpeg" : smp.kind == FT_SAMPLE_PNG ? "png" : "raw";
        r = Py_BuildValue("(sy#Liii)", kind, (const char *)smp.data, (Py_ssize_t)smp.size, (long long)smp.label,
                          smp.height, smp.width, smp.channels);
    }
    ft_fetch_buf_free(&buf);
    return r;
}

static PyObject *source_describe(PyObject *self, PyObject *arg) {
    long long i = PyLong_AsLongLong(arg);
    if (i == -1 && PyErr_Occurred())
        return NULL;
    char name[1024];
    ft_source_describe(((source_object *)self)->src, i, name, sizeof name);
    return PyUnicode_DecodeFSDefault(name);
}

static PyGetSetDef source_getset[] = {
    {"kind", source_get_kind, NULL, "record, image_folder, tar or arrays", NULL},
    {"classes", source_get_classes, NULL, "ImageFolder class names (label = position)", NULL},
    {"class_counts", source_get_class_counts, NULL, "ImageFolder: the number of samples of each class", NULL},
    {"skipped_images", source_get_skipped_images, NULL,
     "ImageFolder: image files in a format it does not decode (PNG, ...), not samples", NULL},
    {"meta", source_get_meta, NULL, "a record file's meta bytes", NULL},
    {NULL},
};

static PyMethodDef source_methods[] = {
    {"get", source_get, METH_VARARGS, "get(i, verify=True) -> (kind, data, label, height, width, channels)"},
    {"describe", source_describe, METH_O, "A name for sample i in messages."},
    {NULL},
};

static PyType_Slot source_slots[] = {
    {Py_tp_new, source_tp_new},
    {Py_tp_dealloc, source_dealloc},
    {Py_tp_getset, source_getset},
    {Py_tp_methods, source_methods},
    {Py_sq_length, source_len},
    {Py_tp_doc, "DataSource(kind, arg, recover=False): a record file, an ImageFolder, tar shards or arrays."},
    {0, NULL},
};

static PyType_Spec source_spec = {
    .name = "fasttrain._C.DataSource",
    .basicsize = sizeof(source_object),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .slots = source_slots,
};

/* ---- LoaderBase ---- */

typedef struct {
    PyObject_HEAD
    ft_loader *loader;
    PyObject *source;    /* the DataSource, kept for attribute access */
    int busy;            /* a call is running with the GIL released; changed with the GIL only */
    unsigned long owner; /* the thread of that call */
    atomic_int closing;  /* close() came during that call: read by it without the GIL */
} loader_object;

static void loader_close_impl(loader_object *o) {
    ft_loader *l = o->loader;
    o->loader = NULL;
    if (l) {
        /* Joining threads can take a moment (a worker finishing a JPEG). */
        Py_BEGIN_ALLOW_THREADS
        ft_loader_free(l);
        Py_END_ALLOW_THREADS
    }
}

static void loader_dealloc(PyObject *self) {
    PyTypeObject *type = Py_TYPE(self);
    loader_object *o = (loader_object *)self;
    PyObject_GC_UnTrack(self);
    loader_close_impl(o);
    Py_CLEAR(o->source);
    type->tp_free(self);
    Py_DECREF(type);
}

static int loader_traverse(PyObject *self, visitproc visit, void *arg) {
    Py_VISIT(((loader_object *)self)->source);
    Py_VISIT(Py_TYPE(self));
    return 0;
}

static int loader_clear(PyObject *self) {
    Py_CLEAR(((loader_object *)self)->source);
    return 0;
}

static ft_loader *usable(loader_object *o) {
    if (!o->loader) {
        PyErr_SetString(PyExc_ValueError, "the loader is closed");
        return NULL;
    }
    if (o->busy) {
        PyErr_SetString(PyExc_RuntimeError,
                        o->owner == PyThread_get_thread_ident()
                            ? "the loader is in use by the epoch running it (a callback of fit cannot iterate or "
                              "evaluate the loader fit is training on: use another Loader of the same data)"
                            : "the loader is in use by another thread");
        return NULL;
    }
    return o->loader;
}

static ft_loader *loader_begin(loader_object *o) {
    ft_loader *l = usable(o);
    if (l) {
        o->busy = 1;
        o->owner = PyThread_get_thread_ident();
    }
    return l;
}

/* Ends a busy call; when a close() came during it, frees the loader now and
 * returns -1 with RuntimeError saying what `during` was cut short. */
static int loader_end(loader_object *o, const char *during) {
    int closing = atomic_load(&o->closing);
    if (closing)
        loader_close_impl(o); /* still busy meanwhile, so that no other call starts on it */
    atomic_store(&o->closing, 0);
    o->busy = 0;
    if (!closing)
        return 0;
    if (!PyErr_Occurred())
        PyErr_Format(PyExc_RuntimeError, "the loader was closed during %s", during);
    return -1;
}

ft_loader *ft_py_loader_begin(PyObject *obj) {
    for (PyTypeObject *t = Py_TYPE(obj); t; t = t->tp_base)
        if (t->tp_dealloc == loader_dealloc)
            return loader_begin((loader_object *)obj);
    PyErr_Format(PyExc_TypeError, "expected a fasttrain.data.Loader, got %.100s", Py_TYPE(obj)->tp_name);
    return NULL;
}

bool ft_py_loader_stopping(PyObject *obj) { return atomic_load(&((loader_object *)obj)->closing) != 0; }

int ft_py_loader_end(PyObject *obj) { return loader_end((loader_object *)obj, "the epoch"); }

/* Dict readers: a missing key keeps the default. */
static int dict_long(PyObject *d, const char *key, long long *out) {
    PyObject *v = PyDict_GetItemString(d, key);
    if (!v)
        return 0;
    long long x = PyLong_AsLongLong(v);
    if (x == -1 && PyErr_Occurred())
        return -1;
    *out = x;
    return 0;
}

static int dict_int(PyObject *d, const char *key, int *out) {
    long long x = *out;
    if (dict_long(d, key, &x) < 0)
        return -1;
    if (x < INT_MIN || x > INT_MAX) {
        PyErr_Format(PyExc_OverflowError, "%s is out of range", key);
        return -1;
    }
    *out = (int)x;
    return 0;
}

static int dict_bool(PyObject *d, const char *key, bool *out) {
    PyObject *v = PyDict_GetItemString(d, key);
    if (!v)
        return 0;
    int t = PyObject_IsTrue(v);
    if (t < 0)
        return -1;
    *out = t;
    return 0;
}

static int dict_doubles(PyObject *d, const char *key, double *out, int max, int *count) {
    PyObject *v = PyDict_GetItemString(d, key);
    if (!v)
        return 0;
    PyObject *seq = PySequence_Fast(v, "expected a sequence of numbers");
    if (!seq)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n > max) {
        Py_DECREF(seq);
        PyErr_Format(PyExc_ValueError, "%s takes at most %d values", key, max);
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        out[i] = PyFloat_AsDouble(PySequence_Fast_GET_ITEM(seq, i));
        if (out[i] == -1 && PyErr_Occurred()) {
            Py_DECREF(seq);
            return -1;
        }
    }
    if (count)
        *count = (int)n;
    Py_DECREF(seq);
    return 0;
}

static int parse_transform(PyObject *d, ft_transform *t) {
    if (!PyDict_Check(d)) {
        PyErr_SetString(PyExc_TypeError, "each transform is described by a dict");
        return -1;
    }
    *t = (ft_transform){.nfill = 1, .p = 0.5, .holes = 1, .std = {1, 1, 1}};
    int kind = 0, mode = 0;
    double pad[4] = {0}, mean[3] = {0}, std[3] = {1, 1, 1};
    if (dict_int(d, "kind", &kind) < 0 || dict_int(d, "height", &t->height) < 0 ||
        dict_int(d, "width", &t->width) < 0 || dict_int(d, "max_size", &t->max_size) < 0 ||
        dict_doubles(d, "scale", t->scale, 2, NULL) < 0 || dict_doubles(d, "ratio", t->ratio, 2, NULL) < 0 ||
        dict_doubles(d, "padding", pad, 4, NULL) < 0 || dict_bool(d, "pad_if_needed", &t->pad_if_needed) < 0 ||
        dict_int(d, "padding_mode", &mode) < 0 || dict_doubles(d, "fill", t->fill, 3, &t->nfill) < 0 ||
        dict_bool(d, "random_fill", &t->random_fill) < 0 || dict_doubles(d, "mean", mean, 3, NULL) < 0 ||
        dict_doubles(d, "std", std, 3, NULL) < 0 || dict_int(d, "length", &t->length) < 0 ||
        dict_int(d, "holes", &t->holes) < 0)
        return -1;
    PyObject *p = PyDict_GetItemString(d, "p");
    if (p && (t->p = PyFloat_AsDouble(p)) == -1 && PyErr_Occurred())
        return -1;
    if (kind < FT_XF_RANDOM_RESIZED_CROP || kind > FT_XF_CUTOUT || mode < 0 || mode > FT_PAD_SYMMETRIC) {
        PyErr_Format(PyExc_ValueError, "unknown transform kind %d or padding mode %d", kind, mode);
        return -1;
    }
    t->kind = (ft_transform_kind)kind;
    t->padding_mode = (ft_pad_mode)mode;
    for (int i = 0; i < 4; i++)
        t->padding[i] = (int)pad[i];
    for (int c = 0; c < 3; c++)
        t->mean[c] = (float)mean[c], t->std[c] = (float)std[c];
    return 0;
}

static PyObject *loader_tp_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    loader_object *o = (loader_object *)type->tp_alloc(type, 0);
    return (PyObject *)o;
}

/* LoaderBase.__init__(source, transforms: list of dicts, output: dict, config: dict) */
static int loader_init(PyObject *self, PyObject *args, PyObject *kwargs) {
    loader_object *o = (loader_object *)self;
    PyObject *src_obj, *ops_obj, *out_obj, *cfg_obj;
    if (!PyArg_ParseTuple(args, "OO!O!O!:LoaderBase", &src_obj, &PyList_Type, &ops_obj, &PyDict_Type, &out_obj,
                          &PyDict_Type, &cfg_obj))
        return -1;
    if (o->loader) {
        PyErr_SetString(PyExc_RuntimeError, "the loader is already initialised");
        return -1;
    }
    PyTypeObject *src_type = NULL;
    for (PyTypeObject *t = Py_TYPE(src_obj); t; t = t->tp_base)
        if (t->tp_dealloc == source_dealloc)
            src_type = t;
    if (!src_type) {
        PyErr_Format(PyExc_TypeError, "source must be a DataSource, got %.100s", Py_TYPE(src_obj)->tp_name);
        return -1;
    }
    Py_ssize_t nops = PyList_GET_SIZE(ops_obj);
    if (nops > FT_MAX_TRANSFORMS) {
        PyErr_Format(PyExc_ValueError, "at most %d transforms", FT_MAX_TRANSFORMS);
        return -1;
    }
    ft_transform ops[FT_MAX_TRANSFORMS];
    for (Py_ssize_t i = 0; i < nops; i++)
        if (parse_transform(PyList_GET_ITEM(ops_obj, i), &ops[i]) < 0)
            return -1;
    ft_output out = {.dtype = FT_FLOAT32, .dct_scale = true};
    int dtype = FT_FLOAT32;
    if (dict_int(out_obj, "dtype", &dtype) < 0 || dict_bool(out_obj, "channels_last", &out.channels_last) < 0 ||
        dict_int(out_obj, "channels", &out.channels) < 0 || dict_int(out_obj, "height", &out.height) < 0 ||
        dict_int(out_obj, "width", &out.width) < 0 || dict_bool(out_obj, "dct_scale", &out.dct_scale) < 0)
        return -1;
    if (!ft_dtype_valid(dtype)) {
        PyErr_Format(PyExc_ValueError, "unknown dtype code %d", dtype);
        return -1;
    }
    out.dtype = (ft_dtype)dtype;
    ft_loader_config c;
    ft_loader_config_default(&c);
    long long batch = c.batch_size, seed = 0, cache_bytes = 0;
    int on_error = 0, cache = 0, dev_type = FT_DEV_CPU, dev_index = 0;
    if (dict_long(cfg_obj, "batch_size", &batch) < 0 || dict_bool(cfg_obj, "shuffle", &c.shuffle) < 0 ||
        dict_bool(cfg_obj, "drop_last", &c.drop_last) < 0 || dict_long(cfg_obj, "seed", &seed) < 0 ||
        dict_int(cfg_obj, "num_workers", &c.num_workers) < 0 || dict_int(cfg_obj, "prefetch", &c.prefetch) < 0 ||
        dict_bool(cfg_obj, "pin_memory", &c.pin_memory) < 0 || dict_int(cfg_obj, "device_type", &dev_type) < 0 ||
        dict_int(cfg_obj, "device_index", &dev_index) < 0 || dict_int(cfg_obj, "rank", &c.rank) < 0 ||
        dict_int(cfg_obj, "world_size", &c.world_size) < 0 || dict_int(cfg_obj, "on_error", &on_error) < 0 ||
        dict_int(cfg_obj, "cache", &cache) < 0 || dict_long(cfg_obj, "cache_bytes", &cache_bytes) < 0 ||
        dict_bool(cfg_obj, "verify", &c.verify) < 0)
        return -1;
    c.batch_size = batch;
    c.seed = (uint64_t)seed;
    c.device = (ft_device){dev_type, dev_type == FT_DEV_CPU ? 0 : dev_index};
    c.on_error = (ft_on_error)on_error;
    c.cache = (ft_cache_mode)cache;
    c.cache_bytes = cache_bytes < 0 ? 0 : (size_t)cache_bytes;
    ft_loader *l = NULL;
    ft_source *src = ((source_object *)src_obj)->src;
    ft_status st;
    Py_BEGIN_ALLOW_THREADS
    st = ft_loader_new(&l, src, ops, (int)nops, &out, &c);
    Py_END_ALLOW_THREADS
    if (st != FT_OK) {
        ft_py_raise(st);
        return -1;
    }
    o->loader = l;
    Py_XSETREF(o->source, Py_NewRef(src_obj));
    return 0;
}

/* _next() -> (images, labels, epoch, index), or None at the end of the epoch. */
static PyObject *loader_next(PyObject *self, PyObject *unused) {
    loader_object *o = (loader_object *)self;
    ft_loader *l = loader_begin(o);
    if (!l)
        return NULL;
    ft_batch b;
    bool done = false, timed_out = true;
    ft_status st = FT_OK;
    while (timed_out && !atomic_load(&o->closing)) {
        Py_BEGIN_ALLOW_THREADS
        st = ft_loader_next_wait(l, &b, &done, 100, &timed_out);
        Py_END_ALLOW_THREADS
        if (st != FT_OK)
            break;
        /* Ctrl-C while blocked: the KeyboardInterrupt surfaces here. */
        if (timed_out && PyErr_CheckSignals() < 0)
            break;
    }
    int interrupted = timed_out && st == FT_OK;
    if (!interrupted && !done && st == FT_OK && atomic_load(&o->closing))
        ft_loader_release(l, &b); /* closed while this batch arrived: the batch goes with the loader */
    if (loader_end(o, "the wait for a batch") < 0 || interrupted)
        return NULL;
    if (st != FT_OK)
        return ft_py_raise(st);
    if (done)
        Py_RETURN_NONE;
    ft_module_state *ms = ft_py_state_of_type(Py_TYPE(self));
    if (!ms) {
        ft_loader_release(l, &b);
        return NULL;
    }
    PyObject *labels = NULL, *images = ft_py_wrap(ms, &b.images);
    if (images)
        labels = ft_py_wrap(ms, &b.labels);
    else
        ft_tensor_release(&b.labels);
    if (!labels) {
        Py_XDECREF(images);
        return NULL;
    }
    return Py_BuildValue("(NNLL)", images, labels, (long long)b.epoch, (long long)b.index);
}

static PyObject *loader_set_epoch(PyObject *self, PyObject *arg) {
    ft_loader *l = usable((loader_object *)self);
    long long e = PyLong_AsLongLong(arg);
    if (!l || (e == -1 && PyErr_Occurred()))
        return NULL;
    ft_status st = ft_loader_set_epoch(l, e);
    return st == FT_OK ? Py_NewRef(Py_None) : ft_py_raise(st);
}

static PyObject *loader_seek(PyObject *self, PyObject *args) {
    ft_loader *l = usable((loader_object *)self);
    long long e, b;
    if (!l || !PyArg_ParseTuple(args, "LL:seek", &e, &b))
        return NULL;
    ft_status st = ft_loader_seek(l, e, b);
    return st == FT_OK ? Py_NewRef(Py_None) : ft_py_raise(st);
}

/* Where the loader stands may be read within a call that holds it on this
 * thread too: a step callback of a C epoch saving a checkpoint. */
static PyObject *loader_position(PyObject *self, PyObject *unused) {
    loader_object *o = (loader_object *)self;
    ft_loader *l = o->loader && o->busy && o->owner == PyThread_get_thread_ident() ? o->loader : usable(o);
    if (!l)
        return NULL;
    int64_t e, b;
    ft_loader_position(l, &e, &b);
    return Py_BuildValue("(LL)", (long long)e, (long long)b);
}

static PyObject *loader_info(PyObject *self, PyObject *unused) {
    ft_loader *l = usable((loader_object *)self);
    if (!l)
        return NULL;
    int64_t s[FT_MAX_DIMS];
    PyObject *shape = ft_py_shape_tuple(s, ft_loader_batch_shape(l, s));
    if (!shape)
        return NULL;
    return Py_BuildValue("{sLsLsLsNsi}", "num_batches", (long long)ft_loader_num_batches(l), "num_samples",
                         (long long)ft_loader_num_samples(l), "unique_samples", (long long)ft_loader_unique_samples(l),
                         "batch_shape", shape, "dtype", (int)ft_loader_output(l)->dtype);
}

static PyObject *loader_stats(PyObject *self, PyObject *unused) {
    ft_loader *l = usable((loader_object *)self);
    if (!l)
        return NULL;
    ft_loader_stats s;
    ft_loader_get_stats(l, &s);
    return Py_BuildValue("{sLsLsLsLsLsnsdsssLsLsLsnsn}", "samples", (long long)s.samples, "skipped",
                         (long long)s.skipped, "errors", (long long)s.errors, "batches", (long long)s.batches,
                         "ring_buffers", (long long)s.ring_buffers, "ring_bytes", (Py_ssize_t)s.ring_bytes,
                         "wait_seconds", s.wait_seconds, "last_error", s.last_error, "cache_entries",
                         (long long)s.cache.entries, "cache_hits", (long long)s.cache.hits, "cache_misses",
                         (long long)s.cache.misses, "cache_bytes", (Py_ssize_t)s.cache.bytes, "cache_budget",
                         (Py_ssize_t)s.cache.budget);
}

/* During a busy call, close() asks that call to stop and free the loader
 * when it ends. From the call's own thread (a progress callback of fit) it
 * returns at once; from another thread it waits for the end, polling: busy
 * changes only with the GIL, which this thread gives up between looks. */
static PyObject *loader_close(PyObject *self, PyObject *unused) {
    loader_object *o = (loader_object *)self;
    if (!o->busy) {
        loader_close_impl(o);
        Py_RETURN_NONE;
    }
    atomic_store(&o->closing, 1);
    if (o->owner == PyThread_get_thread_ident())
        Py_RETURN_NONE;
    while (o->busy) {
        Py_BEGIN_ALLOW_THREADS
        nanosleep(&(struct timespec){0, 1000000}, NULL);
        Py_END_ALLOW_THREADS
        if (PyErr_CheckSignals() < 0)
            return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *loader_get_closed(PyObject *self, void *closure) {
    (void)closure;
    return PyBool_FromLong(((loader_object *)self)->loader == NULL);
}

static PyObject *loader_get_source(PyObject *self, void *closure) {
    (void)closure;
    PyObject *s = ((loader_object *)self)->source;
    return Py_NewRef(s ? s : Py_None);
}

static PyMethodDef loader_methods[] = {
    {"_next", loader_next, METH_NOARGS, "_next() -> (images, labels, epoch, index) or None at the epoch's end"},
    {"_set_epoch", loader_set_epoch, METH_O, NULL},
    {"_seek", loader_seek, METH_VARARGS, "_seek(epoch, batch)"},
    {"_position", loader_position, METH_NOARGS, "(epoch, batches received in it)"},
    {"_info", loader_info, METH_NOARGS, NULL},
    {"stats", loader_stats, METH_NOARGS, "Counters: samples, skipped, errors, batches, cache use, ..."},
    {"close", loader_close, METH_NOARGS, "Stops and joins the workers and frees the buffers."},
    {NULL},
};

static PyGetSetDef loader_getset[] = {
    {"closed", loader_get_closed, NULL, NULL, NULL},
    {"source", loader_get_source, NULL, NULL, NULL},
    {NULL},
};

static PyType_Slot loader_slots[] = {
    {Py_tp_new, loader_tp_new},
    {Py_tp_init, loader_init},
    {Py_tp_dealloc, loader_dealloc},
    {Py_tp_traverse, loader_traverse},
    {Py_tp_clear, loader_clear},
    {Py_tp_methods, loader_methods},
    {Py_tp_getset, loader_getset},
    {Py_tp_doc, "The C half of fasttrain.data.Loader."},
    {0, NULL},
};

static PyType_Spec loader_spec = {
    .name = "fasttrain._C.LoaderBase",
    .basicsize = sizeof(loader_object),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .slots = loader_slots,
};

/* ---- RecordWriter ---- */

typedef struct {
    PyObject_HEAD
    ft_record_writer *w;
    int busy;    /* an add runs with the GIL released; changed with the GIL only */
    int closing; /* close() or abort() waits for that add: no other add may start */
} writer_object;

/* Waits for an add running in another thread, which a large payload does
 * without the GIL; polling is enough since busy changes only with the GIL,
 * which this thread gives up between looks. -1 on a signal's exception. */
static int writer_wait(writer_object *o) {
    while (o->busy) {
        Py_BEGIN_ALLOW_THREADS
        nanosleep(&(struct timespec){0, 1000000}, NULL);
        Py_END_ALLOW_THREADS
        if (PyErr_CheckSignals() < 0)
            return -1;
    }
    return 0;
}

static void writer_dealloc(PyObject *self) {
    PyTypeObject *type = Py_TYPE(self);
    writer_object *o = (writer_object *)self;
    if (o->w)
        ft_record_writer_abort(o->w); /* never closed: the partial file goes */
    type->tp_free(self);
    Py_DECREF(type);
}

static int writer_init(PyObject *self, PyObject *args, PyObject *kwargs) {
    writer_object *o = (writer_object *)self;
    PyObject *bytes;
    if (!PyArg_ParseTuple(args, "O&:RecordWriter", PyUnicode_FSConverter, &bytes))
        return -1;
    if (writer_wait(o) < 0) {
        Py_DECREF(bytes);
        return -1;
    }
    if (o->w) {
        ft_record_writer_abort(o->w);
        o->w = NULL;
    }
    ft_status st = ft_record_writer_open(&o->w, PyBytes_AS_STRING(bytes));
    Py_DECREF(bytes);
    if (st != FT_OK) {
        ft_py_raise(st);
        return -1;
    }
    return 0;
}

static ft_record_writer *open_writer(writer_object *o) {
    if (o->closing) {
        PyErr_SetString(PyExc_ValueError, "the record writer is being closed");
        return NULL;
    }
    if (writer_wait(o) < 0)
        return NULL;
    if (!o->w)
        PyErr_SetString(PyExc_ValueError, "the record writer is closed");
    return o->w;
}

/* Waits for a running add before close() or abort(), refusing new ones
 * meanwhile so that a thread adding in a loop cannot keep the writer busy. */
static int writer_wait_to_end(writer_object *o) {
    o->closing = 1;
    int r = writer_wait(o);
    o->closing = 0;
    return r;
}

/* _add(kind, data (buffer), label, height, width, channels) */
static PyObject *writer_add(PyObject *self, PyObject *args) {
    writer_object *o = (writer_object *)self;
    int kind;
    Py_buffer data;
    long long label;
    unsigned int h = 0, wd = 0, c = 0;
    if (!PyArg_ParseTuple(args, "iy*L|III:_add", &kind, &data, &label, &h, &wd, &c))
        return NULL;
    /* Checked after parsing, which can run Python code that closes the writer. */
    ft_record_writer *w = open_writer(o);
    if (!w) {
        PyBuffer_Release(&data);
        return NULL;
    }
    ft_status st;
    if (data.len >= FT_GIL_FREE_BYTES) {
        o->busy = 1;
        Py_BEGIN_ALLOW_THREADS
        st = ft_record_writer_add(w, (ft_sample_kind)kind, data.buf, (size_t)data.len, label, h, wd, c);
        Py_END_ALLOW_THREADS
        o->busy = 0;
    } else {
        st = ft_record_writer_add(w, (ft_sample_kind)kind, data.buf, (size_t)data.len, label, h, wd, c);
    }
    PyBuffer_Release(&data);
    return st == FT_OK ? Py_NewRef(Py_None) : ft_py_raise(st);
}

static PyObject *writer_close(PyObject *self, PyObject *args) {
    writer_object *o = (writer_object *)self;
    Py_buffer meta = {0};
    if (!PyArg_ParseTuple(args, "|y*:close", &meta))
        return NULL;
    if (writer_wait_to_end(o) < 0) {
        PyBuffer_Release(&meta);
        return NULL;
    }
    if (!o->w) {
        PyBuffer_Release(&meta);
        Py_RETURN_NONE; /* closing twice is harmless */
    }
    ft_record_writer *w = o->w;
    o->w = NULL;
    ft_status st;
    Py_BEGIN_ALLOW_THREADS
    st = ft_record_writer_close(w, meta.buf, meta.buf ? (size_t)meta.len : 0);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&meta);
    return st == FT_OK ? Py_NewRef(Py_None) : ft_py_raise(st);
}

static PyObject *writer_abort(PyObject *self, PyObject *unused) {
    writer_object *o = (writer_object *)self;
    if (writer_wait_to_end(o) < 0)
        return NULL;
    if (o->w)
        ft_record_writer_abort(o->w);
    o->w = NULL;
    Py_RETURN_NONE;
}

static PyObject *writer_get_count(PyObject *self, void *closure) {
    (void)closure;
    writer_object *o = (writer_object *)self;
    if (writer_wait(o) < 0)
        return NULL;
    return PyLong_FromLongLong(o->w ? ft_record_writer_count(o->w) : -1);
}

static PyMethodDef writer_methods[] = {
    {"_add", writer_add, METH_VARARGS, "_add(kind, data, label, height=0, width=0, channels=0)"},
    {"close", writer_close, METH_VARARGS, "close(meta=b'') writes the index and moves the file into place."},
    {"abort", writer_abort, METH_NOARGS, "Drops the partial file."},
    {NULL},
};

static PyGetSetDef writer_getset[] = {
    {"count", writer_get_count, NULL, "records written so far (-1 once closed)", NULL},
    {NULL},
};

static PyType_Slot writer_slots[] = {
    {Py_tp_new, PyType_GenericNew},
    {Py_tp_init, writer_init},
    {Py_tp_dealloc, writer_dealloc},
    {Py_tp_methods, writer_methods},
    {Py_tp_getset, writer_getset},
    {Py_tp_doc, "The C half of fasttrain.data.RecordWriter."},
    {0, NULL},
};

static PyType_Spec writer_spec = {
    .name = "fasttrain._C.RecordWriterBase",
    .basicsize = sizeof(writer_object),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .slots = writer_slots,
};

/* ---- JPEG helpers ---- */

static PyObject *py_jpeg_info(PyObject *module, PyObject *arg) {
    Py_buffer b;
    if (PyObject_GetBuffer(arg, &b, PyBUF_SIMPLE) < 0)
        return NULL;
    ft_jpeg_info info;
    ft_status st = ft_jpeg_read_info(b.buf, (size_t)b.len, &info);
    PyBuffer_Release(&b);
    if (st != FT_OK)
        return ft_py_raise(st);
    return Py_BuildValue("{sisisisO}", "height", info.height, "width", info.width, "components", info.components,
                         "progressive", info.progressive ? Py_True : Py_False);
}

/* jpeg_decode(data, scale_num=8, bpp=3) -> uint8 array (H, W, bpp) */
static PyObject *py_jpeg_decode(PyObject *module, PyObject *args) {
    Py_buffer b;
    int num = 8, bpp = 3;
    if (!PyArg_ParseTuple(args, "y*|ii:jpeg_decode", &b, &num, &bpp))
        return NULL;
    ft_jpeg_info info;
    ft_status st = ft_jpeg_read_info(b.buf, (size_t)b.len, &info);
    PyObject *arr = NULL;
    if (st == FT_OK && (num < 1 || num > 16 || !(bpp == 1 || bpp == 3 || bpp == 4)))
        st = ft_fail(FT_ERR_VALUE, "scale must be n/8 with n in 1..16 and bpp 1, 3 or 4");
    if (st == FT_OK) {
        npy_intp dims[3] = {ft_jpeg_scaled(info.height, num), ft_jpeg_scaled(info.width, num), bpp};
        arr = PyArray_SimpleNew(3, dims, NPY_UINT8);
        if (!arr) {
            PyBuffer_Release(&b);
            return NULL;
        }
        ft_jpeg_decoder *d = NULL;
        Py_BEGIN_ALLOW_THREADS
        st = ft_jpeg_decoder_new(&d);
        if (st == FT_OK)
            st = ft_jpeg_decode(d, b.buf, (size_t)b.len, &info, num, bpp, PyArray_DATA((PyArrayObject *)arr),
                                (size_t)dims[1] * bpp);
        ft_jpeg_decoder_free(d);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&b);
    if (st != FT_OK) {
        Py_XDECREF(arr);
        return ft_py_raise(st);
    }
    return arr;
}

/* jpeg_encode(array (H, W) or (H, W, 1|3) uint8, quality=90, subsampling="420", progressive=False) -> bytes */
static PyObject *py_jpeg_encode(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"pixels", "quality", "subsampling", "progressive", NULL};
    PyObject *obj;
    int quality = 90, progressive = 0;
    const char *samp = "420";
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|isp:jpeg_encode", kwlist, &obj, &quality, &samp, &progressive))
        return NULL;
    PyArrayObject *a = (PyArrayObject *)PyArray_FROMANY(obj, NPY_UINT8, 2, 3, NPY_ARRAY_C_CONTIGUOUS);
    if (!a)
        return NULL;
    int h = (int)PyArray_DIM(a, 0), w = (int)PyArray_DIM(a, 1), c = PyArray_NDIM(a) == 3 ? (int)PyArray_DIM(a, 2) : 1;
    uint8_t *out = NULL;
    size_t n = 0;
    ft_status st;
    Py_BEGIN_ALLOW_THREADS
    st = ft_jpeg_encode(PyArray_DATA(a), h, w, c, quality, samp, progressive, &out, &n);
    Py_END_ALLOW_THREADS
    Py_DECREF(a);
    if (st != FT_OK)
        return ft_py_raise(st);
    PyObject *r = PyBytes_FromStringAndSize((const char *)out, (Py_ssize_t)n);
    free(out);
    return r;
}

typedef struct {
    Py_buffer *files;
    Py_ssize_t nfiles, start, step;
    double seconds;
    int64_t decoded;
    ft_status st;
    char err[256];
} rate_job;

static void *rate_worker(void *arg) {
    rate_job *j = arg;
    ft_jpeg_decoder *d = NULL;
    uint8_t *buf = NULL;
    size_t cap = 0;
    j->st = ft_jpeg_decoder_new(&d);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (Py_ssize_t i = j->start; j->st == FT_OK && i < j->nfiles; i += j->step) {
        ft_jpeg_info info;
        j->st = ft_jpeg_read_info(j->files[i].buf, (size_t)j->files[i].len, &info);
        size_t need = (size_t)info.width * info.height * 3;
        if (j->st == FT_OK && need > cap) {
            free(buf);
            cap = need;
            buf = malloc(cap);
            if (!buf)
                j->st = ft_fail(FT_ERR_NOMEM, "out of memory");
        }
        if (j->st == FT_OK)
            j->st = ft_jpeg_decode(d, j->files[i].buf, (size_t)j->files[i].len, &info, 8, 3, buf,
                                   (size_t)info.width * 3);
        j->decoded++;
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    j->seconds = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    if (j->st != FT_OK)
        snprintf(j->err, sizeof j->err, "%s", ft_last_error());
    free(buf);
    ft_jpeg_decoder_free(d);
    return NULL;
}

/* jpeg_decode_time(files, threads) -> seconds to decode every file once to
 * RGB at full size with TurboJPEG, the files split over `threads` threads:
 * the limit a JPEG loader is measured against. */
static PyObject *py_jpeg_decode_time(PyObject *module, PyObject *args) {
    PyObject *list;
    int threads = 1;
    if (!PyArg_ParseTuple(args, "O!|i:jpeg_decode_time", &PyList_Type, &list, &threads))
        return NULL;
    if (threads < 1 || threads > 64)
        return PyErr_Format(PyExc_ValueError, "threads must be in [1, 64]");
    Py_ssize_t n = PyList_GET_SIZE(list);
    Py_buffer *files = PyMem_Calloc((size_t)n + 1, sizeof *files);
    if (!files)
        return PyErr_NoMemory();
    Py_ssize_t got = 0;
    for (; got < n; got++)
        if (PyObject_GetBuffer(PyList_GET_ITEM(list, got), &files[got], PyBUF_SIMPLE) < 0)
            break;
    rate_job jobs[64] = {0};
    pthread_t tids[64];
    ft_status st = FT_OK;
    char err[256] = "";
    double seconds = 0;
    if (got == n) {
        Py_BEGIN_ALLOW_THREADS
        for (int t = 0; t < threads; t++) {
            jobs[t] = (rate_job){files, n, t, threads};
            pthread_create(&tids[t], NULL, rate_worker, &jobs[t]);
        }
        for (int t = 0; t < threads; t++) {
            pthread_join(tids[t], NULL);
            if (jobs[t].seconds > seconds)
                seconds = jobs[t].seconds;
            if (jobs[t].st != FT_OK && st == FT_OK)
                st = jobs[t].st, snprintf(err, sizeof err, "%s", jobs[t].err);
        }
        Py_END_ALLOW_THREADS
    }
    for (Py_ssize_t i = 0; i < got; i++)
        PyBuffer_Release(&files[i]);
    PyMem_Free(files);
    if (got != n)
        return NULL;
    if (st != FT_OK)
        return ft_py_raise(ft_fail(st, "%s", err));
    return PyFloat_FromDouble(seconds);
}

static PyObject *py_crc32c(PyObject *module, PyObject *args) {
    Py_buffer b;
    unsigned int crc = 0;
    if (!PyArg_ParseTuple(args, "y*|I:crc32c", &b, &crc))
        return NULL;
    uint32_t r = ft_crc32c(crc, b.buf, (size_t)b.len);
    PyBuffer_Release(&b);
    return PyLong_FromUnsignedLong(r);
}

static PyMethodDef data_functions[] = {
    {"jpeg_info", py_jpeg_info, METH_O, "jpeg_info(data) -> dict(height, width, components, progressive)"},
    {"jpeg_decode", py_jpeg_decode, METH_VARARGS, "jpeg_decode(data, scale_num=8, bpp=3) -> uint8 (H, W, bpp)"},
    {"jpeg_encode", (PyCFunction)(void (*)(void))py_jpeg_encode, METH_VARARGS | METH_KEYWORDS,
     "jpeg_encode(pixels, quality=90, subsampling='420', progressive=False) -> bytes"},
    {"jpeg_decode_time", py_jpeg_decode_time, METH_VARARGS, "jpeg_decode_time(files, threads=1) -> seconds"},
    {"crc32c", py_crc32c, METH_VARARGS, "crc32c(data, crc=0) -> int"},
    {NULL, NULL, 0, NULL},
};

int ft_py_bind_data(PyObject *module) {
    if (ft_py_add_type(module, &source_spec) < 0 || ft_py_add_type(module, &loader_spec) < 0 ||
        ft_py_add_type(module, &writer_spec) < 0)
        return -1;
    return PyModule_AddFunctions(module, data_functions);
}
