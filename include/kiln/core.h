/* kiln — the core of the C API: status codes, dtypes, tensors (kiln/kiln.h includes every public
 * header; inside kiln, each layer includes the headers of its own and lower layers only).
 *
 * Ownership: every function that returns a kiln_tensor ** gives the caller a new
 * reference; release it with kiln_tensor_release(). Functions taking tensors borrow them.
 */
#ifndef KILN_CORE_H
#define KILN_CORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KILN_API __attribute__((visibility("default")))
#define KILN_MAX_DIMS 8

/* ---- status -------------------------------------------------------------------------- */

typedef enum kiln_status {
    KILN_OK = 0,
    KILN_ERR_VALUE,           /* bad value: shapes, axes, arguments  -> ValueError */
    KILN_ERR_TYPE,            /* bad dtype or argument kind          -> TypeError */
    KILN_ERR_INDEX,           /* index out of range                  -> IndexError */
    KILN_ERR_MEMORY,          /* allocation failed                   -> MemoryError */
    KILN_ERR_NOT_IMPLEMENTED, /*                                      -> NotImplementedError */
    KILN_ERR_RUNTIME,         /* anything else (e.g. a library call) -> RuntimeError */
    KILN_ERR_CHECK,           /* a check op's condition held: kiln_last_check() names it
                                 -> the exception the user's code raises there */
    KILN_ERR_INTERRUPTED,     /* kiln_interrupt() stopped a run       -> KeyboardInterrupt */
    KILN_ERR_LIMIT,           /* a fixed capacity outgrown (a symbolic size's terms, factors or
                                 table entries): the caller may fall back  -> ValueError */
} kiln_status;

/* The message of the last error set on this thread ("" when none). */
KILN_API const char *kiln_last_error(void);
/* The id (attribute i[0]) of the check op behind the last KILN_ERR_CHECK on this thread. */
KILN_API int64_t kiln_last_check(void);
KILN_API void kiln_clear_error(void);

/* ---- interrupts ----------------------------------------------------------------------- */

/* Asks the runs in progress to stop: the executors (kernel by kernel, the sink's function, the
 * loops of control flow, eagerly too) check between kernels and loop iterations and return
 * KILN_ERR_INTERRUPTED, leaving what they run usable. Async-signal-safe (meant for a SIGINT
 * handler); the request stays until kiln_interrupt_clear(). */
KILN_API void kiln_interrupt(void);
KILN_API bool kiln_interrupt_requested(void);
KILN_API void kiln_interrupt_clear(void);
/* Only runs on the thread with this id ((uint64_t)pthread_self(), what Python calls a thread's
 * ident) stop; 0 (the default): runs on every thread. */
KILN_API void kiln_interrupt_only_thread(uint64_t id);

/* ---- dtypes --------------------------------------------------------------------------- */

typedef enum kiln_dtype {
    KILN_DTYPE_BOOL = 0,
    KILN_DTYPE_INT8,
    KILN_DTYPE_INT32,
    KILN_DTYPE_INT64,
    KILN_DTYPE_FLOAT16,
    KILN_DTYPE_BFLOAT16,
    KILN_DTYPE_FLOAT32,
    KILN_DTYPE_FLOAT64,
    KILN_DTYPE_COUNT
} kiln_dtype;

KILN_API size_t kiln_dtype_size(kiln_dtype dtype);
KILN_API const char *kiln_dtype_name(kiln_dtype dtype);
KILN_API bool kiln_dtype_is_float(kiln_dtype dtype);
/* NumPy-like promotion of two tensor dtypes (int64 + float16 -> float16, like PyTorch). */
KILN_API kiln_dtype kiln_dtype_promote(kiln_dtype a, kiln_dtype b);

/* ---- tensors -------------------------------------------------------------------------- */

/* The dtype and shape of a value: all shape/dtype inference works on this. */
typedef struct kiln_meta {
    kiln_dtype dtype;
    int32_t ndim;
    int64_t shape[KILN_MAX_DIMS];
} kiln_meta;

typedef struct kiln_storage kiln_storage;
struct kiln_grad_node;
struct kiln_tensor;

/* A function run on a gradient during a backward pass (Tensor.register_hook; kiln/autograd.h's
 * kiln_autograd_add_hook adds one): fn(ctx, grad, &out) sets out to a new reference that replaces
 * grad (same shape), or leaves it NULL to keep grad. release(ctx) runs once, when the hook is removed
 * or what holds it is freed. A tensor's hooks are a list run in the order they were added. */
typedef struct kiln_grad_hook {
    kiln_status (*fn)(void *ctx, struct kiln_tensor *grad, struct kiln_tensor **out);
    void (*release)(void *ctx);
    void *ctx;
    int64_t id;                  /* given when added: what removes it */
    int32_t output_nr;           /* held by an op's node: the output whose gradient it sees */
    struct kiln_grad_hook *next;
} kiln_grad_hook;

/* Frees a list of hooks, running each one's release. */
KILN_API void kiln_grad_hooks_free(kiln_grad_hook *list);

typedef struct kiln_tensor {
    kiln_meta meta;
    int64_t strides[KILN_MAX_DIMS]; /* in elements; 0 for broadcast dimensions */
    int64_t numel;
    int64_t offset;                 /* in elements, from the start of the storage */
    void *data;                     /* = storage data + offset * itemsize */
    kiln_storage *storage;
    int64_t refcount;               /* atomic */
    uint64_t uid;                   /* unique for the life of the process (tracing identifies tensors by it) */
    bool literal;                   /* made from a Python number: a constant when traced */
    bool amp_exact;                 /* derived from integers only (arange, casts of ints): amp keeps it
                                     * float32 (kiln_amp_output_exact, src/ops/amp.c) */
    /* autograd */
    bool requires_grad;
    int32_t output_nr;              /* which output of grad_fn this is */
    struct kiln_grad_node *grad_fn; /* NULL for leaves; owned reference */
    struct kiln_tensor *grad;       /* accumulated gradient of a leaf (Tensor.backward) */
    kiln_grad_hook *grad_hooks;     /* a leaf's gradient hooks (a non-leaf's are its grad_fn's); NULL: none */
} kiln_tensor;

/* New contiguous tensor, uninitialized (zeroed when `zero`). */
KILN_API kiln_status kiln_tensor_empty(kiln_dtype dtype, int ndim, const int64_t *shape,
                                       kiln_tensor **out);
KILN_API kiln_status kiln_tensor_zeros(kiln_dtype dtype, int ndim, const int64_t *shape,
                                       kiln_tensor **out);
/* Wrap memory owned by someone else without copying. `release(ctx)` runs when the last
 * tensor viewing it goes away. Strides in elements; NULL means contiguous. */
KILN_API kiln_status kiln_tensor_wrap(kiln_dtype dtype, int ndim, const int64_t *shape,
                                      const int64_t *strides, void *data,
                                      void (*release)(void *ctx), void *ctx, kiln_tensor **out);
/* A view of `base`'s storage with the given layout (no checks on bounds beyond the storage). */
KILN_API kiln_status kiln_tensor_view(kiln_tensor *base, int ndim, const int64_t *shape,
                                      const int64_t *strides, int64_t offset, kiln_tensor **out);
/* A new tensor object sharing storage and layout, without autograd history. */
KILN_API kiln_status kiln_tensor_detach(kiln_tensor *t, kiln_tensor **out);

KILN_API void kiln_tensor_retain(kiln_tensor *t);
KILN_API void kiln_tensor_release(kiln_tensor *t);

KILN_API bool kiln_tensor_is_contiguous(const kiln_tensor *t);
/* Storage version: bumped by every in-place write, checked by autograd. */
KILN_API int64_t kiln_tensor_version(const kiln_tensor *t);
KILN_API void kiln_tensor_bump_version(kiln_tensor *t);
/* Marks t's storage as handed out writable (the buffer protocol, DLPack): from then on it may be
 * written without a version bump. */
KILN_API void kiln_tensor_mark_escaped(kiln_tensor *t);
/* Whether every write to t's storage bumps its version: owned memory never handed out writable
 * (not wrapped from another owner, not exported). Only then may a value computed from t be
 * reused while its version is unchanged (src/runtime/weight_cache.c). */
KILN_API bool kiln_tensor_version_complete(const kiln_tensor *t);
/* A float32 copy of a 16-bit storage kept beside it, for the fp32-compute fallback's products
 * (src/ops/lowp_pass.c: kiln_lowp_widen): kiln_tensor_keep_widened(t) lets t's storage keep one (the
 * runtime's kept weight casts, src/runtime/weight_cache.c); kiln_tensor_keeps_widened(t) says whether
 * t may have one (its storage keeps them and t's elements are the whole storage, from offset 0);
 * kiln_tensor_widened(t) gives it (borrowed; its element i is storage element i widened) while the
 * storage is at the version it was made at, else NULL; kiln_tensor_set_widened(t, w) keeps w
 * (contiguous float32, t's element count), made from the storage's current contents, at the current
 * version; a tensor t cannot keep one for is ignored. A write that bumps the version makes it stale. */
KILN_API void kiln_tensor_keep_widened(kiln_tensor *t);
KILN_API bool kiln_tensor_keeps_widened(const kiln_tensor *t);
KILN_API kiln_tensor *kiln_tensor_widened(const kiln_tensor *t);
KILN_API void kiln_tensor_set_widened(kiln_tensor *t, kiln_tensor *widened);
/* Whether t lives in `storage` and that storage is at `version`. */
KILN_API bool kiln_tensor_same_version(const kiln_tensor *t, const kiln_storage *storage, int64_t version);
/* Read-only storage: memory its owner does not let kiln write (a read-only buffer, an mmap opened
 * for reading, an immutable bytes object). Marks the storage t views, for every tensor sharing it,
 * for good; ops that write in place then fail with KILN_ERR_VALUE instead of writing. */
KILN_API void kiln_tensor_set_read_only(kiln_tensor *t);
KILN_API bool kiln_tensor_is_read_only(const kiln_tensor *t);
/* Whether t's layout makes several elements share memory: a broadcast view, a stride of 0 on an
 * axis longer than 1. Such tensors are read as they are but never written in place. */
KILN_API bool kiln_tensor_overlaps(const kiln_tensor *t);
/* Whether two tensors share storage. */
KILN_API bool kiln_tensor_same_storage(const kiln_tensor *a, const kiln_tensor *b);

/* "(2, 3)" into buf; returns buf. */
KILN_API char *kiln_shape_str(const kiln_meta *m, char *buf, size_t size);
/* The element count of a shape already known to be valid (a tensor's, an inferred one). */
KILN_API int64_t kiln_shape_numel(int ndim, const int64_t *shape);
/* The most elements a tensor may have (2^59): its size in bytes, and any offset into it, then
 * fit in int64_t for every dtype. */
#define KILN_MAX_NUMEL ((int64_t)1 << 59)
/* The element count of a shape from outside (a user, attributes, a text): KILN_ERR_VALUE, with a
 * message naming the shape, for more than KILN_MAX_DIMS dimensions, a negative dimension, or more
 * than KILN_MAX_NUMEL elements; the product of the nonzero dimensions is bounded too, so any
 * product of some of its dimensions fits (a shape (0, 2^40, 2^40) is refused). Every place that
 * multiplies dimensions it did not get from a tensor checks them here first. */
KILN_API kiln_status kiln_shape_numel_checked(int ndim, const int64_t *shape, int64_t *numel);

/* How far `got` is from `expected` (same dtype and shape, else KILN_ERR_VALUE naming both):
 * the largest absolute difference, and the largest |got - expected| / max(|expected|, 1e-3 *
 * max|expected|, tiny). NaN where expected has NaN counts as equal; elsewhere as infinitely far. */
KILN_API kiln_status kiln_tensor_max_error(const kiln_tensor *got, const kiln_tensor *expected, double *max_abs,
                                           double *max_rel);

/* ---- grad mode ------------------------------------------------------------------------ */

/* Grad mode (thread-local, on by default). Returns the previous value. */
KILN_API bool kiln_grad_enabled(void);
KILN_API bool kiln_set_grad_enabled(bool enabled);

/* ---- memory accounting of the allocator (for peak-memory comparisons) ------------------- */

KILN_API size_t kiln_memory_in_use(void);
KILN_API size_t kiln_memory_peak(void);
KILN_API void kiln_memory_reset_peak(void);

/* ---- random --------------------------------------------------------------------------- */

/* Seeds the generator behind rand, randn and dropout (deterministic streams). */
KILN_API void kiln_manual_seed(uint64_t seed);
/* The generator's state (its key and the number of draws made), saved and put back by a caller
 * that ran random ops it will run again (a capture whose compiled graph then runs). */
KILN_API void kiln_random_get_state(uint64_t *key, uint64_t *counter);
KILN_API void kiln_random_set_state(uint64_t key, uint64_t counter);

/* ---- threads -------------------------------------------------------------------------- */

/* The most threads kernels may be given: far more than any CPU kiln runs on has cores, and
 * few enough that OpenMP can start them (it crashes, or aborts the process, when it cannot). */
#define KILN_MAX_THREADS 1024

KILN_API int kiln_num_threads(void);
/* Threads kernels may use: KILN_ERR_VALUE (and no change) unless 1 <= n <= KILN_MAX_THREADS. */
KILN_API kiln_status kiln_set_num_threads(int64_t n);

/* ---- oneDNN ---------------------------------------------------------------------------- */

/* oneDNN primitives (convolutions and reorders) kiln created whose implementation is oneDNN's
 * reference one (its name starts with "ref"): correct but one to three orders of magnitude
 * slower than its JIT kernels, a sign that a layout does not suit the CPU. Each distinct one
 * is also reported on stderr, once. The count of those created in this process (a problem
 * whose primitive is evicted from the cache and made again counts again). */
KILN_API int64_t kiln_dnnl_ref_count(void);
/* The description (op, shapes, layouts, implementation) of the i-th distinct one, in order of
 * creation, or NULL for i past the last; valid for the life of the process. */
KILN_API const char *kiln_dnnl_ref_describe(int64_t i);

/* The convolutions run through kiln's own Winograd kernel (inference graphs on CPUs without
 * AVX-512, see src/ops/conv_winograd.c) in this process: tells tests and benchmarks which
 * kernel served. */
KILN_API int64_t kiln_conv_winograd_count(void);

#ifdef __cplusplus
}
#endif

#endif
