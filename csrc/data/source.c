#include "data/source.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/copy.h"
#include "data/record.h"

typedef enum { SRC_RECORD, SRC_FOLDER, SRC_TAR, SRC_ARRAYS, SRC_TENSORS } source_kind;

/* A file-backed sample of a folder or a tar shard. */
typedef struct {
    int32_t file;  /* folder: index into paths; tar: shard */
    ft_sample_kind kind; /* FT_SAMPLE_JPEG or FT_SAMPLE_PNG */
    uint64_t offset, size; /* tar: the member's bytes inside the shard */
    int64_t label;
    char *name;    /* folder: the path; tar: the member name */
} file_entry;

typedef struct {
    int fd; /* -1 until opened */
    uint64_t size; /* at open */
    char *path;
} shard_file;

struct ft_source {
    atomic_long refcount;
    source_kind kind;
    int64_t count;
    /* record */
    ft_record_file *record;
    /* folder and tar */
    file_entry *entries;
    char **classes;
    int nclasses;
    int64_t skipped_images; /* folder: image files in a format it does not decode (BMP, ...) */
    shard_file *shards;
    int nshards;
    /* arrays: (N, H, W[, C]) uint8 images, (N,) integer labels; tensors: (N, ...) features and targets */
    ft_tensor images, labels;
    int height, width, channels;
};

static ft_source *source_new(source_kind kind) {
    ft_source *s = calloc(1, sizeof *s);
    if (s) {
        atomic_init(&s->refcount, 1);
        s->kind = kind;
    }
    return s;
}

static void source_free(ft_source *s) {
    ft_record_close(s->record);
    for (int64_t i = 0; s->entries && i < s->count; i++)
        free(s->entries[i].name);
    free(s->entries);
    for (int c = 0; c < s->nclasses; c++)
        free(s->classes[c]);
    free(s->classes);
    for (int i = 0; i < s->nshards; i++) {
        if (s->shards[i].fd >= 0)
            close(s->shards[i].fd);
        free(s->shards[i].path);
    }
    free(s->shards);
    if (s->images.storage)
        ft_tensor_release(&s->images);
    if (s->labels.storage)
        ft_tensor_release(&s->labels);
    free(s);
}

void ft_source_retain(ft_source *s) { atomic_fetch_add_explicit(&s->refcount, 1, memory_order_relaxed); }

void ft_source_release(ft_source *s) {
    if (s && atomic_fetch_sub_explicit(&s->refcount, 1, memory_order_acq_rel) == 1)
        source_free(s);
}

int64_t ft_source_count(const ft_source *s) { return s->count; }

const char *ft_source_kind(const ft_source *s) {
    static const char *names[] = {"record", "image_folder", "tar", "arrays", "tensors"};
    return names[s->kind];
}

bool ft_source_in_memory(const ft_source *s) { return s->kind != SRC_FOLDER; }

int ft_source_num_classes(const ft_source *s) { return s->nclasses; }
int64_t ft_source_skipped_images(const ft_source *s) { return s->skipped_images; }

/* The folder's entries are in label order: the class's first entry and the
 * next class's, by binary search. */
static int64_t first_of_label(const ft_source *s, int64_t label) {
    int64_t lo = 0, hi = s->count;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (s->entries[mid].label < label)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

int64_t ft_source_class_count(const ft_source *s, int c) {
    return c >= 0 && c < s->nclasses ? first_of_label(s, c + 1) - first_of_label(s, c) : 0;
}

const char *ft_source_class_name(const ft_source *s, int c) {
    return c >= 0 && c < s->nclasses ? s->classes[c] : NULL;
}

const char *ft_source_meta(const ft_source *s, size_t *len) {
    *len = 0;
    return s->record ? ft_record_meta(s->record, len) : NULL;
}

/* ---- record ---- */

ft_status ft_source_open_record(ft_source **out, const char *path, bool recover) {
    ft_source *s = source_new(SRC_RECORD);
    if (!s)
        return ft_fail(FT_ERR_NOMEM, "out of memory opening a source");
    ft_status st = ft_record_open(&s->record, path, recover);
    if (st != FT_OK) {
        free(s);
        return st;
    }
    s->count = ft_record_count(s->record);
    *out = s;
    return FT_OK;
}

/* ---- arrays ---- */

/* A source of `kind` over two arrays of N rows, shared: images or features,
 * and their labels or targets. */
static ft_source *source_of_arrays(source_kind kind, const ft_tensor *data, const ft_tensor *labels) {
    ft_source *s = source_new(kind);
    if (s) {
        ft_tensor_share(&s->images, data);
        ft_tensor_share(&s->labels, labels);
        s->count = data->shape[0];
    }
    return s;
}

ft_status ft_source_from_arrays(ft_source **out, const ft_tensor *images, const ft_tensor *labels) {
    if (images->dtype != FT_UINT8)
        return ft_fail(FT_ERR_DTYPE, "images must be uint8 (N, H, W) or (N, H, W, C), got %s",
                       ft_dtype_get(images->dtype)->name);
    if (images->ndim != 3 && images->ndim != 4)
        return ft_fail(FT_ERR_SHAPE, "uint8 arrays are images, of shape (N, H, W) or (N, H, W, C); got %d "
                                     "dimensions (uint8 features or byte tokens: give them as float32 or int64)",
                       images->ndim);
    int channels = images->ndim == 4 ? (int)images->shape[3] : 1;
    if (channels != 1 && channels != 3) {
        if (images->shape[1] == 1 || images->shape[1] == 3) /* torchvision's layout */
            return ft_fail(FT_ERR_SHAPE, "uint8 images are read as (N, H, W, C), with 1 or 3 channels last; got "
                                         "(%lld, %lld, %lld, %lld), which looks (N, C, H, W): give "
                                         "x.transpose(0, 2, 3, 1)",
                           (long long)images->shape[0], (long long)images->shape[1], (long long)images->shape[2],
                           (long long)images->shape[3]);
        return ft_fail(FT_ERR_SHAPE, "uint8 images are read as (N, H, W, C), with 1 or 3 channels last; got %d",
                       channels);
    }
    if (images->shape[1] < 1 || images->shape[2] < 1 || images->shape[1] > (1 << 24) || images->shape[2] > (1 << 24))
        return ft_fail(FT_ERR_SHAPE, "images of %lld x %lld pixels are not supported", (long long)images->shape[1],
                       (long long)images->shape[2]);
    if (ft_tensor_device(images).type != FT_DEV_CPU || ft_tensor_device(labels).type != FT_DEV_CPU)
        return ft_fail(FT_ERR_DEVICE, "images and labels must be in host memory");
    if (labels->ndim != 1 || labels->shape[0] != images->shape[0])
        return ft_fail(FT_ERR_SHAPE, "labels must have shape (%lld,), matching the images", (long long)images->shape[0]);
    switch (labels->dtype) {
    case FT_UINT8: case FT_INT8: case FT_INT16: case FT_INT32: case FT_INT64: case FT_UINT16: case FT_UINT32:
    case FT_UINT64: break;
    default:
        return ft_fail(FT_ERR_DTYPE, "labels must be integers, got %s", ft_dtype_get(labels->dtype)->name);
    }
    ft_source *s = source_of_arrays(SRC_ARRAYS, images, labels);
    if (!s)
        return ft_fail(FT_ERR_NOMEM, "out of memory opening a source");
    s->height = (int)images->shape[1];
    s->width = (int)images->shape[2];
    s->channels = channels;
    *out = s;
    return FT_OK;
}

static int64_t label_at(const ft_tensor *t, int64_t i) {
    const char *p = ft_tensor_data(t) + i * t->strides[0] * (int64_t)ft_dtype_get(t->dtype)->itemsize;
    switch (t->dtype) {
    case FT_UINT8: return *(const uint8_t *)p;
    case FT_INT8: return *(const int8_t *)p;
    case FT_INT16: return *(const int16_t *)p;
    case FT_INT32: return *(const int32_t *)p;
    case FT_UINT16: return *(const uint16_t *)p;
    case FT_UINT32: return *(const uint32_t *)p;
    case FT_UINT64: return (int64_t) * (const uint64_t *)p;
    default: return *(const int64_t *)p;
    }
}

static ft_status get_array(const ft_source *s, int64_t i, ft_fetch_buf *buf, ft_sample *out) {
    const ft_tensor *t = &s->images;
    int64_t h = s->height, w = s->width, c = s->channels;
    const int64_t *st = t->strides;
    const uint8_t *base = (const uint8_t *)ft_tensor_data(t) + i * st[0];
    int64_t cs = t->ndim == 4 ? st[3] : 1;
    out->kind = FT_SAMPLE_RAW;
    out->height = (int)h;
    out->width = (int)w;
    out->channels = (int)c;
    out->size = (size_t)(h * w * c);
    out->label = label_at(&s->labels, i);
    if ((c == 1 || cs == 1) && st[2] == c && (h == 1 || st[1] == w * c)) {
        out->data = base; /* the common case: no copy */
        return FT_OK;
    }
    FT_TRY(ft_fetch_buf_reserve(buf, out->size));
    uint8_t *d = buf->data;
    for (int64_t y = 0; y < h; y++)
        for (int64_t x = 0; x < w; x++)
            for (int64_t k = 0; k < c; k++)
                *d++ = base[y * st[1] + x * st[2] + k * cs];
    out->data = buf->data;
    return FT_OK;
}

/* ---- tensors (feature arrays) ---- */

/* FT_ERR_SHAPE unless every row of t (its dimensions after the first) has a
 * positive size and at most 2**31 elements. */
static ft_status check_rows(const ft_tensor *t, const char *what) {
    int64_t numel = 1;
    for (int d = 1; d < t->ndim; d++) {
        if (t->shape[d] < 1)
            return ft_fail(FT_ERR_SHAPE, "%s must have a positive size in every dimension of a sample, dimension %d "
                                         "has %lld", what, d, (long long)t->shape[d]);
        numel *= t->shape[d];
        if (numel > ((int64_t)1 << 31))
            return ft_fail(FT_ERR_SHAPE, "%s of more than 2**31 values per sample are not supported", what);
    }
    return FT_OK;
}

/* Whether t holds integers (token ids, class labels): neither floats, complex numbers nor bools. */
static bool integral(const ft_tensor *t) {
    return !ft_dtype_is_float(t->dtype) && !ft_dtype_is_complex(t->dtype) && t->dtype != FT_BOOL;
}

ft_status ft_source_from_tensors(ft_source **out, const ft_tensor *features, const ft_tensor *targets) {
    if (!ft_dtype_is_float(features->dtype) && !integral(features))
        return ft_fail(FT_ERR_DTYPE, "features must be floating point (float16, bfloat16, float32, float64) or "
                                     "integers (token ids), got %s",
                       ft_dtype_get(features->dtype)->name);
    if (features->ndim < 2)
        return ft_fail(FT_ERR_SHAPE, "features must have shape (N, ...) with at least one dimension per sample, "
                                     "got %d dimension(s) (one feature per sample is (N, 1))", features->ndim);
    if (ft_tensor_device(features).type != FT_DEV_CPU || ft_tensor_device(targets).type != FT_DEV_CPU)
        return ft_fail(FT_ERR_DEVICE, "features and targets must be in host memory");
    if (targets->ndim < 1 || targets->shape[0] != features->shape[0])
        return ft_fail(FT_ERR_SHAPE, "targets must have shape (%lld, ...), one per sample of the features, got %d "
                                     "dimension(s) of first size %lld",
                       (long long)features->shape[0], targets->ndim, (long long)(targets->ndim ? targets->shape[0] : 0));
    if (ft_dtype_is_complex(targets->dtype))
        return ft_fail(FT_ERR_DTYPE, "targets must be integers or floating point, got %s",
                       ft_dtype_get(targets->dtype)->name);
    FT_TRY(check_rows(features, "features"));
    FT_TRY(check_rows(targets, "targets"));
    ft_source *s = source_of_arrays(SRC_TENSORS, features, targets);
    if (!s)
        return ft_fail(FT_ERR_NOMEM, "out of memory opening a source");
    *out = s;
    return FT_OK;
}

/* Integer (and bool) targets go into batches as int64, floating ones as float32. */
static ft_dtype target_dtype(const ft_source *s) { return ft_dtype_is_float(s->labels.dtype) ? FT_FLOAT32 : FT_INT64; }

/* Integer features (token ids) go into batches as int64, floating ones in the loader's float dtype. */
static ft_dtype feature_dtype(const ft_source *s, ft_dtype loader) {
    return integral(&s->images) ? FT_INT64 : loader;
}

static void layout_of(const ft_tensor *t, ft_dtype dtype, ft_sample_layout *out) {
    out->ndim = t->ndim - 1;
    memcpy(out->shape, t->shape + 1, (size_t)out->ndim * sizeof *out->shape);
    out->dtype = dtype;
}

bool ft_source_tensor_layout(const ft_source *s, ft_sample_layout *features, ft_sample_layout *targets) {
    if (s->kind != SRC_TENSORS)
        return false;
    layout_of(&s->images, feature_dtype(s, s->images.dtype), features);
    layout_of(&s->labels, target_dtype(s), targets);
    return true;
}

/* Row i of t (its elements after the first dimension) into dst, C order, as dtype. */
static void copy_row(const ft_tensor *t, int64_t i, void *dst, ft_dtype dtype) {
    ft_copy_desc d = {.ndim = t->ndim - 1, .dst = dst, .dst_dtype = dtype, .src_dtype = t->dtype,
                      .src = ft_tensor_data(t) + i * t->strides[0] * (int64_t)ft_dtype_get(t->dtype)->itemsize};
    memcpy(d.shape, t->shape + 1, (size_t)d.ndim * sizeof *d.shape);
    memcpy(d.src_strides, t->strides + 1, (size_t)d.ndim * sizeof *d.src_strides);
    ft_contiguous_strides(d.dst_strides, d.ndim, d.shape);
    ft_copy_cpu_serial(&d);
}

ft_status ft_source_read_tensors(const ft_source *s, int64_t i, void *features, ft_dtype dtype, void *targets) {
    if (s->kind != SRC_TENSORS)
        return ft_fail(FT_ERR_VALUE, "only a source of feature arrays is read as tensors");
    if (i < 0 || i >= s->count)
        return ft_fail(FT_ERR_INDEX, "sample %lld is out of range for a source of %lld", (long long)i,
                       (long long)s->count);
    dtype = feature_dtype(s, dtype);
    FT_TRY(ft_copy_check_dtypes(dtype, s->images.dtype));
    copy_row(&s->images, i, features, dtype);
    copy_row(&s->labels, i, targets, target_dtype(s));
    return FT_OK;
}

/* ---- ImageFolder ---- */

typedef struct {
    char **items;
    size_t n, cap;
} str_list;

static int str_push(str_list *l, char *s) {
    if (!s)
        return -1;
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 64;
        char **grown = realloc(l->items, cap * sizeof *grown);
        if (!grown) {
            free(s);
            return -1;
        }
        l->items = grown;
        l->cap = cap;
    }
    l->items[l->n++] = s;
    return 0;
}

static void str_list_free(str_list *l) {
    for (size_t i = 0; i < l->n; i++)
        free(l->items[i]);
    free(l->items);
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static char *join_path(const char *dir, const char *name) {
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    if (p)
        snprintf(p, n, "%s/%s", dir, name);
    return p;
}

static bool has_extension(const char *name, const char *const *exts) {
    const char *dot = strrchr(name, '.');
    for (int i = 0; dot && exts[i]; i++)
        if (strcasecmp(dot, exts[i]) == 0)
            return true;
    return false;
}

static bool is_jpeg_name(const char *name) { return has_extension(name, (const char *const[]){".jpg", ".jpeg", 0}); }

static bool is_png_name(const char *name) { return has_extension(name, (const char *const[]){".png", 0}); }

/* Images torchvision's ImageFolder would read that fasttrain does not decode. */
static bool is_other_image_name(const char *name) {
    return has_extension(name, (const char *const[]){".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", 0});
}

static bool is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode); /* follows links, as os.walk(followlinks=True) */
}

/* Named pipes, sockets and devices are not samples: opening a pipe blocks
 * until a writer comes, which would hang a worker. */
static bool is_regular(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* Lists a directory's entries, sorted, split into subdirectories and files. */
static ft_status list_dir(const char *dir, str_list *dirs, str_list *files) {
    DIR *d = opendir(dir);
    if (!d)
        return ft_fail(FT_ERR_IO, "cannot list %s: %s", dir, strerror(errno));
    struct dirent *e;
    ft_status s = FT_OK;
    while (s == FT_OK && (e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        char *path = join_path(dir, e->d_name);
        if (!path) {
            s = ft_fail(FT_ERR_NOMEM, "out of memory listing %s", dir);
            break;
        }
        bool isdir = is_dir(path);
        free(path);
        str_list *into = isdir ? dirs : files;
        if (into && str_push(into, strdup(e->d_name)) < 0)
            s = ft_fail(FT_ERR_NOMEM, "out of memory listing %s", dir);
    }
    closedir(d);
    if (dirs && dirs->n) /* qsort's array may not be NULL, even empty */
        qsort(dirs->items, dirs->n, sizeof *dirs->items, cmp_str);
    if (files && files->n)
        qsort(files->items, files->n, sizeof *files->items, cmp_str);
    return s;
}

#define MAX_DEPTH 64

/* The order of sorted(os.walk(dir)): directories by their path, each with
 * its files sorted. Collects every (dir path) first, sorts them, then lists
 * each one's files. A link to a directory is followed, as os.walk(
 * followlinks=True) does, unless it leads back to a directory the walk is
 * inside (a loop, which `find -L` skips too): `up` holds the device and
 * inode of the directories above, `depth` of them. */
static ft_status walk_dirs(const char *dir, str_list *all, int depth, struct stat *up) {
    if (depth >= MAX_DEPTH)
        return ft_fail(FT_ERR_VALUE, "%s: directories nested more than %d deep", dir, MAX_DEPTH);
    if (stat(dir, &up[depth]) != 0)
        return ft_fail(FT_ERR_IO, "cannot read %s: %s", dir, strerror(errno));
    for (int k = 0; k < depth; k++)
        if (up[k].st_dev == up[depth].st_dev && up[k].st_ino == up[depth].st_ino)
            return FT_OK;
    if (str_push(all, strdup(dir)) < 0)
        return ft_fail(FT_ERR_NOMEM, "out of memory walking %s", dir);
    str_list subs = {0};
    ft_status s = list_dir(dir, &subs, NULL);
    for (size_t i = 0; s == FT_OK && i < subs.n; i++) {
        char *p = join_path(dir, subs.items[i]);
        s = p ? walk_dirs(p, all, depth + 1, up) : ft_fail(FT_ERR_NOMEM, "out of memory walking %s", dir);
        free(p);
    }
    str_list_free(&subs);
    return s;
}

static ft_status push_entry(ft_source *s, size_t *cap, file_entry e) {
    if ((size_t)s->count == *cap) {
        size_t grown_cap = *cap ? *cap * 2 : 1024;
        file_entry *grown = realloc(s->entries, grown_cap * sizeof *grown);
        if (!grown) {
            free(e.name);
            return ft_fail(FT_ERR_NOMEM, "out of memory listing samples");
        }
        s->entries = grown;
        *cap = grown_cap;
    }
    s->entries[s->count++] = e;
    return FT_OK;
}

ft_status ft_source_open_image_folder(ft_source **out, const char *root) {
    if (!is_dir(root))
        return ft_fail(FT_ERR_IO, "ImageFolder root %s is not a directory", root);
    ft_source *s = source_new(SRC_FOLDER);
    if (!s)
        return ft_fail(FT_ERR_NOMEM, "out of memory opening a source");
    str_list classes = {0};
    ft_status st = list_dir(root, &classes, NULL);
    size_t cap = 0;
    if (st == FT_OK && classes.n > (1u << 30))
        st = ft_fail(FT_ERR_VALUE, "%s has too many class directories", root);
    for (size_t c = 0; st == FT_OK && c < classes.n; c++) {
        char *cdir = join_path(root, classes.items[c]);
        str_list dirs = {0};
        struct stat up[MAX_DEPTH]; /* the root, then the class directory and those below it */
        if (stat(root, &up[0]) != 0)
            st = ft_fail(FT_ERR_IO, "cannot read %s: %s", root, strerror(errno));
        if (st == FT_OK)
            st = cdir ? walk_dirs(cdir, &dirs, 1, up) : ft_fail(FT_ERR_NOMEM, "out of memory");
        if (dirs.n) /* a class directory that links back to the root has none */
            qsort(dirs.items, dirs.n, sizeof *dirs.items, cmp_str);
        for (size_t d = 0; st == FT_OK && d < dirs.n; d++) {
            str_list files = {0};
            st = list_dir(dirs.items[d], NULL, &files);
            for (size_t f = 0; st == FT_OK && f < files.n; f++) {
                ft_sample_kind kind = is_jpeg_name(files.items[f])  ? FT_SAMPLE_JPEG
                                      : is_png_name(files.items[f]) ? FT_SAMPLE_PNG
                                                                    : 0;
                if (!kind) {
                    s->skipped_images += is_other_image_name(files.items[f]);
                    continue;
                }
                char *path = join_path(dirs.items[d], files.items[f]);
                if (path && !is_regular(path)) {
                    free(path);
                    continue;
                }
                st = path ? push_entry(s, &cap, (file_entry){.kind = kind, .label = (int64_t)c, .name = path})
                          : ft_fail(FT_ERR_NOMEM, "out of memory");
            }
            str_list_free(&files);
        }
        str_list_free(&dirs);
        free(cdir);
    }
    if (st == FT_OK && s->count == 0)
        st = ft_fail(FT_ERR_VALUE, "ImageFolder %s holds no .jpg, .jpeg or .png files in class subdirectories", root);
    if (st != FT_OK) {
        str_list_free(&classes);
        source_free(s);
        return st;
    }
    s->classes = classes.items;
    s->nclasses = (int)classes.n;
    *out = s;
    return FT_OK;
}

static ft_status read_file(const char *path, ft_fetch_buf *buf, size_t *size) {
    /* O_NONBLOCK: a file replaced by a named pipe after the listing must
     * not block the open; regular files ignore the flag. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return ft_fail(FT_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    struct stat st;
    ft_status s = FT_OK;
    if (fstat(fd, &st) != 0) {
        s = ft_fail(FT_ERR_IO, "cannot stat %s: %s", path, strerror(errno));
    } else if (!S_ISREG(st.st_mode)) {
        s = ft_fail(FT_ERR_IO, "%s is not a regular file", path);
    } else if ((s = ft_fetch_buf_reserve(buf, (size_t)st.st_size)) == FT_OK) {
        size_t done = 0, want = (size_t)st.st_size;
        while (done < want) {
            ssize_t r = pread(fd, buf->data + done, want - done, (off_t)done);
            if (r < 0 && errno == EINTR)
                continue;
            if (r <= 0) {
                s = ft_fail(FT_ERR_IO, "reading %s: %s", path, r < 0 ? strerror(errno) : "file shrank while read");
                break;
            }
            done += (size_t)r;
        }
        *size = done;
    }
    close(fd);
    return s;
}

/* ---- tar shards (WebDataset) ---- */

static uint64_t tar_number(const uint8_t *p, int n, bool *ok) {
    if (p[0] & 0x80) { /* GNU base-256 for sizes of 8 GiB and more */
        uint64_t v = p[0] & 0x7f;
        for (int i = 1; i < n; i++)
            v = v << 8 | p[i];
        return v;
    }
    uint64_t v = 0;
    int i = 0;
    while (i < n && (p[i] == ' ' || p[i] == 0))
        i++;
    for (; i < n && p[i] >= '0' && p[i] <= '7'; i++)
        v = v * 8 + (uint64_t)(p[i] - '0');
    for (; i < n; i++)
        if (p[i] != ' ' && p[i] != 0)
            *ok = false;
    return v;
}

/* WebDataset's split of a member path: key = up to the first dot of the
 * last component, extension = the rest. */
static void split_key(const char *path, size_t *key_len, const char **ext) {
    const char *slash = strrchr(path, '/');
    const char *base = slash ? slash + 1 : path;
    const char *dot = strchr(base, '.');
    *key_len = dot ? (size_t)(dot - path) : strlen(path);
    *ext = dot ? dot + 1 : "";
}

typedef struct {
    char *key;
    bool has_image, has_label;
    ft_sample_kind kind; /* of the image member */
    uint64_t offset, size;
    int64_t label;
    char *image_name;
} tar_group;

static ft_status flush_group(ft_source *s, size_t *cap, tar_group *g, int shard, const char *shard_path) {
    ft_status st = FT_OK;
    if (g->key && g->has_image) {
        if (!g->has_label)
            st = ft_fail(FT_ERR_FORMAT, "%s: sample '%s' has no .cls member (its label)", shard_path, g->key);
        else {
            st = push_entry(s, cap, (file_entry){.file = shard, .kind = g->kind, .offset = g->offset,
                                                 .size = g->size, .label = g->label, .name = g->image_name});
            g->image_name = NULL;
        }
    }
    free(g->key);
    free(g->image_name);
    *g = (tar_group){0};
    return st;
}

/* The decimal label in the n bytes at `off` of a shard. */
static ft_status read_label(const shard_file *sf, uint64_t off, uint64_t n, const char *name, int64_t *out) {
    char text[32];
    if (n == 0 || n >= sizeof text)
        return ft_fail(FT_ERR_FORMAT, "%s: %s does not hold a decimal label", sf->path, name);
    FT_TRY(ft_read_at(sf->fd, off, text, (size_t)n, sf->path));
    text[n] = 0;
    char *end;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    while (*end == ' ' || *end == '\n' || *end == '\r' || *end == '\t')
        end++;
    if (errno || end == text || *end)
        return ft_fail(FT_ERR_FORMAT, "%s: %s does not hold a decimal label", sf->path, name);
    *out = v;
    return FT_OK;
}

/* The largest pax extended header read (a path and a size need a few hundred bytes). */
#define PAX_MAX ((uint64_t)1 << 20)

/* Applies the "len key=value\n" records of a pax extended header. */
static ft_status parse_pax(const shard_file *sf, size_t at, const char *m, size_t end, char *long_name,
                           size_t long_cap, bool *have_long, uint64_t *pax_size, bool *have_pax_size) {
    size_t p = 0;
    while (p < end) {
        size_t len = 0, q = p;
        /* Bounded as it is read: a length near 2^64 would wrap p backwards
         * and loop forever. */
        while (q < end && m[q] >= '0' && m[q] <= '9' && len <= end - p)
            len = len * 10 + (size_t)(m[q++] - '0');
        if (q >= end || m[q] != ' ' || len <= q + 1 - p || len > end - p)
            return ft_fail(FT_ERR_FORMAT, "%s: bad pax extended header record at byte %zu", sf->path, at + p);
        const char *kv = m + q + 1;
        size_t kvlen = p + len - (q + 1);
        if (kvlen > 5 && memcmp(kv, "path=", 5) == 0 && kvlen - 6 < long_cap) {
            memcpy(long_name, kv + 5, kvlen - 6);
            long_name[kvlen - 6] = 0;
            *have_long = true;
        } else if (kvlen > 5 && memcmp(kv, "size=", 5) == 0) {
            *pax_size = strtoull(kv + 5, NULL, 10);
            *have_pax_size = true;
        }
        p += len;
    }
    return FT_OK;
}

static ft_status scan_shard(ft_source *s, size_t *cap, int shard) {
    const shard_file *sf = &s->shards[shard];
    uint64_t size = sf->size, off = 0;
    char long_name[4096];
    bool have_long = false;
    uint64_t pax_size = 0;
    bool have_pax_size = false;
    tar_group g = {0};
    ft_status st = FT_OK;
    uint8_t h[512];
    while (st == FT_OK) {
        if (size - off < 512) {
            if (off < size || off == 0)
                st = ft_fail(FT_ERR_FORMAT, "%s: truncated tar file (a header is cut at byte %llu)", sf->path,
                             (unsigned long long)off);
            break;
        }
        if ((st = ft_read_at(sf->fd, off, h, sizeof h, sf->path)) != FT_OK)
            break;
        bool zero = true;
        for (int i = 0; i < 512 && zero; i++)
            zero = h[i] == 0;
        if (zero)
            break; /* end-of-archive marker */
        unsigned sum = 0;
        for (int i = 0; i < 512; i++)
            sum += i >= 148 && i < 156 ? ' ' : h[i];
        bool ok = true;
        uint64_t stored_sum = tar_number(h + 148, 8, &ok);
        uint64_t msize = tar_number(h + 124, 12, &ok);
        if (!ok || stored_sum != sum) {
            st = ft_fail(FT_ERR_FORMAT, "%s: bad tar header at byte %llu (checksum mismatch)", sf->path,
                         (unsigned long long)off);
            break;
        }
        if (have_pax_size)
            msize = pax_size;
        uint64_t data = off + 512;
        if (msize > size - data) {
            st = ft_fail(FT_ERR_FORMAT, "%s: truncated tar file (member at byte %llu needs %llu bytes)", sf->path,
                         (unsigned long long)off, (unsigned long long)msize);
            break;
        }
        char type = (char)h[156];
        uint64_t next = data + (msize + 511) / 512 * 512;
        if (type == 'L') { /* GNU long name for the next member */
            size_t n = msize < sizeof long_name ? (size_t)msize : sizeof long_name - 1;
            if ((st = ft_read_at(sf->fd, data, long_name, n, sf->path)) != FT_OK)
                break;
            long_name[n] = 0;
            have_long = true;
            off = next;
            continue;
        }
        if (type == 'x') { /* pax extended header */
            if (msize > PAX_MAX) {
                st = ft_fail(FT_ERR_FORMAT, "%s: the pax extended header at byte %llu holds %llu bytes, more than "
                             "the %llu this reader takes", sf->path, (unsigned long long)off,
                             (unsigned long long)msize, (unsigned long long)PAX_MAX);
                break;
            }
            char *m = malloc((size_t)msize + 1);
            if (!m) {
                st = ft_fail(FT_ERR_NOMEM, "out of memory reading %s", sf->path);
                break;
            }
            m[msize] = 0; /* a value's number cannot be read past the records */
            st = ft_read_at(sf->fd, data, m, (size_t)msize, sf->path);
            if (st == FT_OK)
                st = parse_pax(sf, (size_t)data, m, (size_t)msize, long_name, sizeof long_name, &have_long,
                               &pax_size, &have_pax_size);
            free(m);
            off = next;
            continue;
        }
        char name[4096];
        if (have_long) {
            snprintf(name, sizeof name, "%s", long_name);
        } else {
            char plain[101], prefix[156];
            memcpy(plain, h, 100);
            plain[100] = 0;
            memcpy(prefix, h + 345, 155);
            prefix[155] = 0;
            bool ustar = memcmp(h + 257, "ustar", 5) == 0;
            if (ustar && prefix[0])
                snprintf(name, sizeof name, "%s/%s", prefix, plain);
            else
                snprintf(name, sizeof name, "%s", plain);
        }
        have_long = have_pax_size = false;
        off = next;
        if (!(type == '0' || type == 0 || type == '7'))
            continue; /* directories, links, global headers */
        size_t key_len;
        const char *ext;
        split_key(name, &key_len, &ext);
        if (!g.key || strlen(g.key) != key_len || memcmp(g.key, name, key_len) != 0) {
            if ((st = flush_group(s, cap, &g, shard, sf->path)) != FT_OK)
                break;
            g.key = strndup(name, key_len);
            if (!g.key) {
                st = ft_fail(FT_ERR_NOMEM, "out of memory reading %s", sf->path);
                break;
            }
        }
        bool jpeg = strcasecmp(ext, "jpg") == 0 || strcasecmp(ext, "jpeg") == 0;
        if (jpeg || strcasecmp(ext, "png") == 0) {
            g.has_image = true;
            g.kind = jpeg ? FT_SAMPLE_JPEG : FT_SAMPLE_PNG;
            g.offset = data;
            g.size = msize;
            free(g.image_name);
            g.image_name = strdup(name);
            if (!g.image_name)
                st = ft_fail(FT_ERR_NOMEM, "out of memory reading %s", sf->path);
        } else if (strcmp(ext, "cls") == 0) {
            st = read_label(sf, data, msize, name, &g.label);
            g.has_label = true;
        }
    }
    if (st == FT_OK)
        st = flush_group(s, cap, &g, shard, sf->path);
    else
        free(g.key), free(g.image_name);
    return st;
}

ft_status ft_source_open_tar(ft_source **out, const char *const *paths, int npaths) {
    if (npaths < 1)
        return ft_fail(FT_ERR_VALUE, "no tar shards given");
    ft_source *s = source_new(SRC_TAR);
    if (!s || !(s->shards = calloc((size_t)npaths, sizeof *s->shards))) {
        free(s);
        return ft_fail(FT_ERR_NOMEM, "out of memory opening a source");
    }
    size_t cap = 0;
    ft_status st = FT_OK;
    for (int i = 0; st == FT_OK && i < npaths; i++) {
        shard_file *sf = &s->shards[i];
        sf->fd = -1;
        s->nshards = i + 1;
        if (!(sf->path = strdup(paths[i]))) {
            st = ft_fail(FT_ERR_NOMEM, "out of memory");
            break;
        }
        sf->fd = open(paths[i], O_RDONLY | O_CLOEXEC);
        struct stat sb;
        if (sf->fd < 0 || fstat(sf->fd, &sb) != 0) {
            st = ft_fail(FT_ERR_IO, "cannot open tar shard %s: %s", paths[i], strerror(errno));
            break;
        }
        sf->size = (uint64_t)sb.st_size;
        st = scan_shard(s, &cap, i);
    }
    if (st == FT_OK && s->count == 0)
        st = ft_fail(FT_ERR_VALUE, "the tar shards hold no samples (members KEY.jpg or KEY.png with KEY.cls)");
    if (st != FT_OK) {
        source_free(s);
        return st;
    }
    *out = s;
    return FT_OK;
}

/* ---- access ---- */

/* The format a file's bytes are in, whatever its name says (ImageNet holds PNG files named .JPEG, which Pillow
 * reads): a PNG signature or a JPEG SOI marker, else the named one (whose decoder then says what is wrong). */
static ft_sample_kind sniffed(const uint8_t *p, size_t n, ft_sample_kind named) {
    static const uint8_t png[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    if (n >= sizeof png && memcmp(p, png, sizeof png) == 0)
        return FT_SAMPLE_PNG;
    if (n >= 2 && p[0] == 0xFF && p[1] == 0xD8)
        return FT_SAMPLE_JPEG;
    return named;
}

ft_status ft_source_get(const ft_source *s, int64_t i, bool verify, ft_fetch_buf *buf, ft_sample *out) {
    if (i < 0 || i >= s->count)
        return ft_fail(FT_ERR_INDEX, "sample %lld is out of range for a source of %lld", (long long)i,
                       (long long)s->count);
    switch (s->kind) {
    case SRC_RECORD:
        return ft_record_get(s->record, i, verify, buf, out);
    case SRC_ARRAYS:
        return get_array(s, i, buf, out);
    case SRC_TENSORS:
        return ft_fail(FT_ERR_VALUE, "a source of feature arrays holds no images or encoded files: a Loader batches "
                                     "its rows as they are");
    case SRC_FOLDER: {
        const file_entry *e = &s->entries[i];
        *out = (ft_sample){.label = e->label};
        FT_TRY(read_file(e->name, buf, &out->size));
        out->data = buf->data;
        out->kind = sniffed(out->data, out->size, e->kind);
        return FT_OK;
    }
    case SRC_TAR: {
        const file_entry *e = &s->entries[i];
        const shard_file *sf = &s->shards[e->file];
        *out = (ft_sample){.kind = e->kind, .label = e->label, .size = (size_t)e->size};
        FT_TRY(ft_fetch_buf_reserve(buf, out->size));
        FT_TRY(ft_read_at(sf->fd, e->offset, buf->data, out->size, sf->path));
        out->data = buf->data;
        out->kind = sniffed(out->data, out->size, e->kind);
        return FT_OK;
    }
    }
    return ft_fail(FT_ERR_RUNTIME, "unknown source kind");
}

void ft_source_describe(const ft_source *s, int64_t i, char *buf, size_t n) {
    if (i < 0 || i >= s->count) {
        snprintf(buf, n, "sample %lld", (long long)i);
        return;
    }
    switch (s->kind) {
    case SRC_RECORD: snprintf(buf, n, "%s#%lld", ft_record_path(s->record), (long long)i); break;
    case SRC_ARRAYS:
    case SRC_TENSORS: snprintf(buf, n, "array sample %lld", (long long)i); break;
    case SRC_FOLDER: snprintf(buf, n, "%s", s->entries[i].name); break;
    case SRC_TAR: snprintf(buf, n, "%s:%s", s->shards[s->entries[i].file].path, s->entries[i].name); break;
    }
}
