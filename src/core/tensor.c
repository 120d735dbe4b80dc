/* Tensors and their storage: allocation, views, reference counting. */
#include "internal.h"

#include "hooks.h"

#include <stdatomic.h>

struct kiln_storage {
    _Atomic int64_t refcount;
    _Atomic int64_t version; /* bumped by in-place writes; autograd checks it */
    void *data;
    size_t nbytes;
    void (*release)(void *ctx); /* external memory: called when the storage dies (may be NULL) */
    void *release_ctx;
    bool external;              /* data is not ours: the header was malloc'd on its own */
    _Atomic bool read_only;     /* wraps memory its owner does not let us write (a read-only buffer) */
    _Atomic bool escaped;       /* handed out writable (buffer protocol, DLPack): writes may skip the version */
    bool keep_widened;          /* a float32 copy of this 16-bit storage may be kept beside it (weight casts) */
    kiln_tensor *widened;       /* that copy (a reference), or NULL */
    int64_t widened_version;    /* the version it was made at */
};

/* Owned storage lives in one block: the header, padded to KILN_ALIGN, then the data. */
#define STORAGE_HEADER (((sizeof(kiln_storage) + KILN_ALIGN - 1) / KILN_ALIGN) * KILN_ALIGN)

static kiln_storage *storage_new(size_t nbytes, bool zero) {
    kiln_storage *s = kiln_alloc(STORAGE_HEADER + nbytes);
    if (!s) return NULL;
    atomic_init(&s->refcount, 1);
    atomic_init(&s->version, 0);
    s->data = (char *)s + STORAGE_HEADER;
    s->nbytes = nbytes;
    s->release = NULL;
    s->release_ctx = NULL;
    s->external = false;
    atomic_init(&s->read_only, false);
    atomic_init(&s->escaped, false);
    s->keep_widened = false;
    s->widened = NULL;
    s->widened_version = 0;
    if (zero && nbytes) memset(s->data, 0, nbytes);
    return s;
}

static void storage_release(kiln_storage *s) {
    if (atomic_fetch_sub_explicit(&s->refcount, 1, memory_order_acq_rel) != 1) return;
    kiln_tensor_release(s->widened);
    if (s->external) {
        if (s->release) s->release(s->release_ctx);
        free(s);
    } else {
        kiln_free(s);
    }
}

int64_t kiln_shape_numel(int ndim, const int64_t *shape) {
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) n *= shape[d];
    return n;
}

void kiln_contiguous_strides(int ndim, const int64_t *shape, int64_t *strides) {
    int64_t s = 1;
    for (int d = ndim - 1; d >= 0; d--) {
        strides[d] = s;
        s *= shape[d] > 0 ? shape[d] : 1;
    }
}

kiln_status kiln_shape_numel_checked(int ndim, const int64_t *shape, int64_t *numel) {
    if (ndim < 0 || ndim > KILN_MAX_DIMS)
        return kiln_error(KILN_ERR_VALUE, "tensors have at most %d dimensions, got %d", KILN_MAX_DIMS, ndim);
    int64_t nonzero = 1; /* the product of the nonzero dimensions */
    bool negative = false, zero = false, large = false;
    for (int d = 0; d < ndim; d++) {
        int64_t s = shape[d];
        negative |= s < 0;
        zero |= s == 0;
        if (s > 0) large |= __builtin_mul_overflow(nonzero, s, &nonzero) || nonzero > KILN_MAX_NUMEL;
    }
    if (negative || large) {
        char buf[200];
        kiln_meta m;
        kiln_meta_set(&m, KILN_DTYPE_FLOAT32, ndim, shape);
        kiln_shape_str(&m, buf, sizeof buf);
        if (negative) return kiln_error(KILN_ERR_VALUE, "negative dimension in shape %s", buf);
        return kiln_error(KILN_ERR_VALUE, "shape %s is too large: a tensor holds at most 2^59 elements", buf);
    }
    *numel = zero ? 0 : nonzero;
    return KILN_OK;
}

static kiln_status check_shape(int ndim, const int64_t *shape) {
    if (ndim >= 0 && ndim <= KILN_MAX_DIMS && kiln_shape_fits(ndim, shape)) return KILN_OK;
    int64_t n;
    return kiln_shape_numel_checked(ndim, shape, &n); /* says why */
}

static _Atomic uint64_t next_uid = 1;

uint64_t kiln_tensor_next_uid(void) { return atomic_load_explicit(&next_uid, memory_order_relaxed); }

static kiln_tensor *tensor_new(kiln_dtype dtype, int ndim, const int64_t *shape,
                               const int64_t *strides, kiln_storage *storage, int64_t offset) {
    kiln_tensor *t = kiln_malloc(sizeof *t);
    if (!t) {
        kiln_error(KILN_ERR_MEMORY, "out of memory allocating a tensor");
        return NULL;
    }
    kiln_meta_set(&t->meta, dtype, ndim, shape);
    if (strides)
        memcpy(t->strides, strides, sizeof(int64_t) * (size_t)ndim);
    else
        kiln_contiguous_strides(ndim, shape, t->strides);
    t->numel = kiln_shape_numel(ndim, shape);
    t->offset = offset;
    t->storage = storage;
    t->data = (char *)storage->data + offset * (int64_t)kiln_dtype_size(dtype);
    t->refcount = 1;
    t->uid = atomic_fetch_add_explicit(&next_uid, 1, memory_order_relaxed);
    t->literal = false;
    t->amp_exact = false;
    t->requires_grad = false;
    t->output_nr = 0;
    t->grad_fn = NULL;
    t->grad = NULL;
    t->grad_hooks = NULL;
    return t;
}

static kiln_status tensor_alloc(kiln_dtype dtype, int ndim, const int64_t *shape, bool zero,
                                kiln_tensor **out) {
    if ((unsigned)dtype >= KILN_DTYPE_COUNT) return kiln_error(KILN_ERR_TYPE, "invalid dtype %d", (int)dtype);
    KILN_TRY(check_shape(ndim, shape));
    size_t nbytes = (size_t)kiln_shape_numel(ndim, shape) * kiln_dtype_size(dtype);
    kiln_storage *s = storage_new(nbytes, zero);
    if (!s) return KILN_ERR_MEMORY;
    *out = tensor_new(dtype, ndim, shape, NULL, s, 0);
    if (!*out) {
        storage_release(s);
        return KILN_ERR_MEMORY;
    }
    return KILN_OK;
}

kiln_status kiln_tensor_empty(kiln_dtype dtype, int ndim, const int64_t *shape, kiln_tensor **out) {
    return tensor_alloc(dtype, ndim, shape, false, out);
}

kiln_status kiln_tensor_zeros(kiln_dtype dtype, int ndim, const int64_t *shape, kiln_tensor **out) {
    return tensor_alloc(dtype, ndim, shape, true, out);
}

kiln_status kiln_tensor_empty_like_meta(const kiln_meta *m, kiln_tensor **out) {
    return tensor_alloc(m->dtype, m->ndim, m->shape, false, out);
}

kiln_status kiln_tensor_wrap(kiln_dtype dtype, int ndim, const int64_t *shape, const int64_t *strides,
                             void *data, void (*release)(void *ctx), void *ctx, kiln_tensor **out) {
    if ((unsigned)dtype >= KILN_DTYPE_COUNT) return kiln_error(KILN_ERR_TYPE, "invalid dtype %d", (int)dtype);
    KILN_TRY(check_shape(ndim, shape));
    kiln_storage *s = kiln_malloc(sizeof *s);
    if (!s) return kiln_error(KILN_ERR_MEMORY, "out of memory allocating a storage");
    atomic_init(&s->refcount, 1);
    atomic_init(&s->version, 0);
    s->data = data;
    s->nbytes = 0; /* unknown extent */
    s->release = release;
    s->release_ctx = ctx;
    s->external = true;
    atomic_init(&s->read_only, false);
    atomic_init(&s->escaped, false);
    s->keep_widened = false;
    s->widened = NULL;
    s->widened_version = 0;
    *out = tensor_new(dtype, ndim, shape, strides, s, 0);
    if (!*out) {
        s->release = NULL; /* the caller keeps ownership on failure */
        free(s);
        return KILN_ERR_MEMORY;
    }
    return KILN_OK;
}

kiln_status kiln_tensor_view(kiln_tensor *base, int ndim, const int64_t *shape, const int64_t *strides,
                             int64_t offset, kiln_tensor **out) {
    KILN_TRY(check_shape(ndim, shape));
    kiln_tensor *t = tensor_new(base->meta.dtype, ndim, shape, strides, base->storage, offset);
    if (!t) return KILN_ERR_MEMORY;
    atomic_fetch_add_explicit(&base->storage->refcount, 1, memory_order_relaxed);
    *out = t;
    return KILN_OK;
}

kiln_status kiln_tensor_detach(kiln_tensor *t, kiln_tensor **out) {
    KILN_TRY(kiln_tensor_view(t, t->meta.ndim, t->meta.shape, t->strides, t->offset, out));
    (*out)->amp_exact = t->amp_exact;
    if (kiln_thread.trace_active) kiln_hooks.trace_alias(t, *out); /* a traced value keeps its identity through detach */
    return KILN_OK;
}

void kiln_tensor_retain(kiln_tensor *t) {
    atomic_fetch_add_explicit((_Atomic int64_t *)&t->refcount, 1, memory_order_relaxed);
}

void kiln_tensor_release(kiln_tensor *t) {
    if (!t) return;
    if (atomic_fetch_sub_explicit((_Atomic int64_t *)&t->refcount, 1, memory_order_acq_rel) != 1) return;
    if (t->grad_fn) kiln_hooks.grad_node_release(t->grad_fn);
    if (t->grad) kiln_tensor_release(t->grad);
    if (t->grad_hooks) kiln_grad_hooks_free(t->grad_hooks);
    storage_release(t->storage);
    free(t);
}

void kiln_grad_hooks_free(kiln_grad_hook *list) {
    while (list) {
        kiln_grad_hook *next = list->next;
        if (list->release) list->release(list->ctx);
        free(list);
        list = next;
    }
}

void kiln_release_all(kiln_tensor **ts, int n) {
    for (int k = 0; k < n; k++) {
        kiln_tensor_release(ts[k]);
        ts[k] = NULL;
    }
}

bool kiln_tensor_is_contiguous(const kiln_tensor *t) {
    int64_t s = 1;
    for (int d = t->meta.ndim - 1; d >= 0; d--) {
        if (t->meta.shape[d] != 1 && t->strides[d] != s) return false;
        s *= t->meta.shape[d];
    }
    return true;
}

int64_t kiln_tensor_version(const kiln_tensor *t) {
    return atomic_load_explicit(&t->storage->version, memory_order_relaxed);
}

void kiln_tensor_bump_version(kiln_tensor *t) {
    atomic_fetch_add_explicit(&t->storage->version, 1, memory_order_relaxed);
}

void kiln_tensor_mark_escaped(kiln_tensor *t) {
    atomic_store_explicit(&t->storage->escaped, true, memory_order_relaxed);
}

bool kiln_tensor_version_complete(const kiln_tensor *t) {
    return !t->storage->external && !atomic_load_explicit(&t->storage->escaped, memory_order_relaxed);
}

bool kiln_tensor_same_version(const kiln_tensor *t, const kiln_storage *storage, int64_t version) {
    return t->storage == storage && kiln_tensor_version(t) == version;
}

void kiln_tensor_keep_widened(kiln_tensor *t) { t->storage->keep_widened = true; }

/* Whether t's elements are its whole owned storage, from its first byte (any order of axes). */
static bool covers_storage(const kiln_tensor *t) {
    return t->offset == 0 && !t->storage->external &&
           (size_t)t->numel * kiln_dtype_size(t->meta.dtype) == t->storage->nbytes;
}

bool kiln_tensor_keeps_widened(const kiln_tensor *t) { return t->storage->keep_widened && covers_storage(t); }

kiln_tensor *kiln_tensor_widened(const kiln_tensor *t) {
    const kiln_storage *s = t->storage;
    if (!s->widened || !covers_storage(t) || s->widened_version != kiln_tensor_version(t)) return NULL;
    return s->widened;
}

void kiln_tensor_set_widened(kiln_tensor *t, kiln_tensor *widened) {
    kiln_storage *s = t->storage;
    if (!kiln_tensor_keeps_widened(t) || widened->meta.dtype != KILN_DTYPE_FLOAT32 || widened->numel != t->numel ||
        !kiln_tensor_is_contiguous(widened))
        return;
    kiln_tensor_retain(widened);
    kiln_tensor_release(s->widened);
    s->widened = widened;
    s->widened_version = kiln_tensor_version(t);
}

void kiln_tensor_set_read_only(kiln_tensor *t) {
    atomic_store_explicit(&t->storage->read_only, true, memory_order_relaxed);
}

bool kiln_tensor_is_read_only(const kiln_tensor *t) {
    return atomic_load_explicit(&t->storage->read_only, memory_order_relaxed);
}

bool kiln_tensor_overlaps(const kiln_tensor *t) {
    for (int d = 0; d < t->meta.ndim; d++)
        if (t->strides[d] == 0 && t->meta.shape[d] > 1) return true;
    return false;
}

kiln_status kiln_check_writable(const char *op, const char *what, const kiln_tensor *t) {
    if (atomic_load_explicit(&t->storage->read_only, memory_order_relaxed))
        return kiln_error(KILN_ERR_VALUE, "%s: assignment destination is read-only (%s shares the memory of a "
                          "read-only buffer; write to a copy, e.g. kiln.Tensor(array))", op, what);
    if (kiln_tensor_overlaps(t)) {
        char buf[160];
        return kiln_error(KILN_ERR_VALUE, "%s: assignment destination is read-only (%s is a broadcast view of shape %s: "
                          "a stride of 0 makes its elements share memory; write to a copy)", op, what,
                          kiln_shape_str(&t->meta, buf, sizeof buf));
    }
    return KILN_OK;
}

bool kiln_tensor_same_storage(const kiln_tensor *a, const kiln_tensor *b) {
    return a->storage == b->storage;
}
