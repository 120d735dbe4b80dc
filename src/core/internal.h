/* Internal helpers shared by the library's sources (not installed). */
#ifndef KILN_INTERNAL_H
#define KILN_INTERNAL_H

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/core.h"
#include "kiln/ops.h"

/* ---- errors -------------------------------------------------------------------------- */

/* Sets this thread's error message and returns `status`. */
kiln_status kiln_error(kiln_status status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Prefixes the current message with "context: " (keeps the status). */
kiln_status kiln_error_context(kiln_status status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* KILN_ERR_CHECK for the check op with this id (see kiln_last_check). */
kiln_status kiln_error_check(int64_t id);

#define KILN_TRY(expr)                                                                      \
    do {                                                                                    \
        kiln_status kiln_try_s_ = (expr);                                                   \
        if (kiln_try_s_ != KILN_OK) return kiln_try_s_;                                     \
    } while (0)

/* Broken internal invariants only; never for user errors. */
#define KILN_ASSERT(cond)                                                                   \
    do {                                                                                    \
        if (!(cond)) kiln_assert_fail(#cond, __FILE__, __LINE__);                           \
    } while (0)
_Noreturn void kiln_assert_fail(const char *what, const char *file, int line);

/* ---- interrupts (interrupt.c) --------------------------------------------------------- */

extern _Atomic int kiln_interrupt_flag; /* nonzero: kiln_interrupt() asked runs to stop */
/* The slow path of kiln_check_interrupt: KILN_ERR_INTERRUPTED when the request is for this thread. */
kiln_status kiln_interrupt_status(void);

/* Between kernels and loop iterations: one load and a branch taken only after an interrupt. */
static inline kiln_status kiln_check_interrupt(void) {
    if (__builtin_expect(atomic_load_explicit(&kiln_interrupt_flag, memory_order_relaxed) != 0, 0))
        return kiln_interrupt_status();
    return KILN_OK;
}

/* ---- allocation ----------------------------------------------------------------------- */

/* Every allocation of the library goes through these (src/core/alloc.c), never straight to
 * malloc: on failure they return NULL with a KILN_ERR_MEMORY message set, and tests can make the
 * n-th one fail (kiln_alloc_fail_nth). */
void *kiln_malloc(size_t nbytes); /* freed with free() */
void *kiln_calloc(size_t count, size_t size);
void *kiln_realloc(void *p, size_t nbytes); /* on failure p stays valid */

#define KILN_ALIGN 64
void *kiln_alloc(size_t nbytes); /* 64-byte aligned; NULL on failure (message set) */
void kiln_free(void *p);
/* Returns cached free blocks to the system. */
void kiln_alloc_trim(void);

/* Fault injection, for tests: the n-th allocation from now on (n >= 1) fails, and with persist
 * every later one too (memory stays exhausted); 0 turns it off. kiln_alloc_count says how many
 * allocations were made since, kiln_alloc_fault_fired whether the n-th was reached. */
void kiln_alloc_fail_nth(int64_t n, bool persist);
int64_t kiln_alloc_count(void);
bool kiln_alloc_fault_fired(void);

/* A malloc'd copy of s (strdup is not C11); NULL when out of memory. */
static inline char *kiln_strdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *c = kiln_malloc(n);
    if (c) memcpy(c, s, n);
    return c;
}

/* ---- shapes --------------------------------------------------------------------------- */

static inline void kiln_meta_set(kiln_meta *m, kiln_dtype dtype, int ndim, const int64_t *shape) {
    m->dtype = dtype;
    m->ndim = ndim;
    for (int d = 0; d < ndim; d++) m->shape[d] = shape[d];
}
static inline int64_t kiln_meta_numel(const kiln_meta *m) {
    return kiln_shape_numel(m->ndim, m->shape);
}
void kiln_contiguous_strides(int ndim, const int64_t *shape, int64_t *strides);
/* Whether a shape of 0..KILN_MAX_DIMS dimensions passes kiln_shape_numel_checked, which says why
 * not; inline for the checks on every op's output (the product of the nonzero dimensions
 * within KILN_MAX_NUMEL, none negative). */
static inline bool kiln_shape_fits(int ndim, const int64_t *shape) {
    int64_t nonzero = 1;
    bool ok = true;
    for (int d = 0; d < ndim; d++) {
        int64_t s = shape[d];
        ok &= s >= 0;
        if (s > 0) ok &= !__builtin_mul_overflow(nonzero, s, &nonzero) && nonzero <= KILN_MAX_NUMEL;
    }
    return ok;
}
/* m has shape (ndim, shape). Inline: run-time input checks of compiled graphs call it per input. */
static inline bool kiln_shape_equal(const kiln_meta *m, int ndim, const int64_t *shape) {
    if (m->ndim != ndim) return false;
    for (int d = 0; d < ndim; d++)
        if (m->shape[d] != shape[d]) return false;
    return true;
}
/* Same dtype and shape. */
static inline bool kiln_meta_equal(const kiln_meta *a, const kiln_meta *b) {
    return a->dtype == b->dtype && kiln_shape_equal(a, b->ndim, b->shape);
}
/* Broadcast shape of n metas, NumPy rules; error names `op` (NULL: the caller adds it) and the shapes. */
kiln_status kiln_broadcast_shape(const char *op, int n, kiln_tensor *const *in, int *ndim,
                                 int64_t *shape);
/* Strides of t viewed as broadcast to (ndim, shape): 0 on broadcast axes. */
void kiln_broadcast_strides(const kiln_tensor *t, int ndim, const int64_t *shape,
                            int64_t *strides);
/* Normalizes axis into [0, ndim); error names op and the tensor shape. */
kiln_status kiln_normalize_axis(const char *op, int64_t *axis, const kiln_meta *m);
/* "(2, 3) and (4,)" style list of input shapes for error messages. */
char *kiln_shapes_str(kiln_tensor *const *in, int nin, char *buf, size_t size);

/* KILN_OK when t may be written in place; else KILN_ERR_VALUE ("op: assignment destination is
 * read-only (what ...)") when its storage is read-only or its layout overlaps (a broadcast view).
 * Every kernel that writes an input in place calls it first, before writing anything. */
kiln_status kiln_check_writable(const char *op, const char *what, const kiln_tensor *t);

/* ---- strided iteration ---------------------------------------------------------------- */

/* Inner loop over n elements: ptrs[k] advances by strides[k] bytes. */
typedef void (*kiln_inner_fn)(void *ctx, int64_t n, char **ptrs, const int64_t *strides);
/* Runs `fn` over every innermost row of an (ndim, shape) iteration of nops operands with the
 * given element strides and item sizes; merges contiguous axes; rows are spread over
 * threads when the total is large. Operand 0 is the output. */
void kiln_iterate(int nops, char *const *base, const size_t *itemsize,
                  const int64_t (*strides)[KILN_MAX_DIMS], int ndim, const int64_t *shape,
                  kiln_inner_fn fn, void *ctx);
#define KILN_PARALLEL_MIN 32768 /* elements below which loops stay single-threaded */

/* ---- copies and conversions (no autograd, no dispatch: for kernels) ------------------- */

/* dst[...] = (dst dtype) src[...], src broadcast to dst's shape; any layouts. */
kiln_status kiln_copy_into(kiln_tensor *dst, const kiln_tensor *src);
/* New reference to a contiguous tensor of `dtype` holding t's values (t itself if it is
 * already so). */
kiln_status kiln_to_contiguous(kiln_tensor *t, kiln_dtype dtype, kiln_tensor **out);
kiln_status kiln_tensor_empty_like_meta(const kiln_meta *m, kiln_tensor **out);
/* Value of element `index` (row-major over t's shape) as a double. */
double kiln_tensor_get_double(const kiln_tensor *t, int64_t index);

/* half and bfloat16 <-> float */
#ifdef __FLT16_MAX__
static inline float kiln_f16_to_f32(uint16_t h) {
    _Float16 v;
    memcpy(&v, &h, 2);
    return (float)v;
}
static inline uint16_t kiln_f32_to_f16(float f) {
    _Float16 v = (_Float16)f;
    uint16_t h;
    memcpy(&h, &v, 2);
    return h;
}
#else
/* Compilers without _Float16 on this target (clang 14 on x86, which builds the fuzzers): the
 * same conversions in integer arithmetic, rounding to nearest even (F. Giesen's). */
static inline float kiln_f16_to_f32(uint16_t h) {
    const uint32_t shifted_exp = 0x7c00u << 13;
    uint32_t o = ((uint32_t)h & 0x7fffu) << 13, exp = o & shifted_exp;
    o += (uint32_t)(127 - 15) << 23;
    if (exp == shifted_exp) {
        o += (uint32_t)(128 - 16) << 23; /* inf, NaN */
    } else if (exp == 0) {               /* zero, subnormal: renormalize */
        const uint32_t magic_u = 113u << 23;
        float f, magic;
        o += 1u << 23;
        memcpy(&f, &o, 4);
        memcpy(&magic, &magic_u, 4);
        f -= magic;
        memcpy(&o, &f, 4);
    }
    o |= ((uint32_t)h & 0x8000u) << 16;
    float r;
    memcpy(&r, &o, 4);
    return r;
}
static inline uint16_t kiln_f32_to_f16(float f) {
    const uint32_t inf = 255u << 23, f16max = (127u + 16) << 23, denorm_magic_u = ((127u - 15) + (23 - 10) + 1) << 23;
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = u & 0x80000000u;
    u ^= sign;
    uint16_t o;
    if (u >= f16max) {
        o = u > inf ? 0x7e00 : 0x7c00; /* NaN, or too large: inf */
    } else if (u < (113u << 23)) {     /* subnormal or zero: the float addition rounds */
        float v, magic;
        memcpy(&v, &u, 4);
        memcpy(&magic, &denorm_magic_u, 4);
        v += magic;
        memcpy(&u, &v, 4);
        o = (uint16_t)(u - denorm_magic_u);
    } else {
        uint32_t mant_odd = (u >> 13) & 1;
        u += ((uint32_t)(15 - 127) << 23) + 0xfff + mant_odd;
        o = (uint16_t)(u >> 13);
    }
    return (uint16_t)(o | (sign >> 16));
}
#endif
/* Rows of n float16 values at src (stride bytes apart) read as float32 into dst, and float32
 * rows stored as float16 (rounded to nearest even); F16C where the CPU has it (src/core/half.c),
 * else the plain *_ref rows. */
void kiln_f16_row(float *dst, const char *src, int64_t stride, int64_t n);
void kiln_f16_store_row(char *dst, int64_t stride, const float *src, int64_t n);
void kiln_f16_row_ref(float *dst, const char *src, int64_t stride, int64_t n);
void kiln_f16_store_row_ref(char *dst, int64_t stride, const float *src, int64_t n);
static inline float kiln_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline uint16_t kiln_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest even */
    return (uint16_t)(u >> 16);
}
/* The same for bfloat16 rows (src/core/half.c): widened exactly, rounded as kiln_f32_to_bf16. */
void kiln_bf16_row(float *dst, const char *src, int64_t stride, int64_t n);
void kiln_bf16_store_row(char *dst, int64_t stride, const float *src, int64_t n);

/* ---- attrs ---------------------------------------------------------------------------- */

static inline void kiln_attrs_clear(kiln_attrs *a) { a->ni = 0, a->nf = 0; }
static inline void kiln_attrs_push_int(kiln_attrs *a, int64_t v) { a->i[a->ni++] = v; }
static inline void kiln_attrs_push_float(kiln_attrs *a, double v) { a->f[a->nf++] = v; }
/* Checks the count of attrs an op received. */
kiln_status kiln_attrs_expect(const char *op, const kiln_attrs *a, int min_ints, int min_floats);

/* ---- op helpers that emit ops through kiln_apply (for gradient rules and composites) --- */

kiln_status kiln_emit_unary(kiln_op op, kiln_tensor *a, kiln_tensor **out);
kiln_status kiln_emit_binary(kiln_op op, kiln_tensor *a, kiln_tensor *b, kiln_tensor **out);
kiln_status kiln_emit_cast(kiln_tensor *a, kiln_dtype dtype, kiln_tensor **out);
kiln_status kiln_emit_scalar(double value, kiln_dtype dtype, kiln_tensor **out);
kiln_status kiln_emit_full(const kiln_meta *m, double value, kiln_tensor **out);
kiln_status kiln_emit_reshape(kiln_tensor *a, int ndim, const int64_t *shape, kiln_tensor **out);
kiln_status kiln_emit_permute(kiln_tensor *a, const int64_t *perm, kiln_tensor **out);
kiln_status kiln_emit_expand(kiln_tensor *a, int ndim, const int64_t *shape, kiln_tensor **out);
/* Reduction `op` (SUM, MEAN, ...) over the axes in `mask`. */
kiln_status kiln_emit_reduce(kiln_op op, kiln_tensor *a, uint64_t mask, bool keepdims,
                             kiln_tensor **out);
/* Sums g down to the shape of `target` (undoing broadcasting), reshaping as needed. */
kiln_status kiln_emit_sum_to(kiln_tensor *g, const kiln_meta *target, kiln_tensor **out);
/* Swaps the last two axes. */
kiln_status kiln_emit_transpose_last(kiln_tensor *a, kiln_tensor **out);

/* Releases an array of n tensors (NULL entries allowed) and sets them to NULL. */
void kiln_release_all(kiln_tensor **ts, int n);

/* -x in ops.def's C expressions: integers wrap as NumPy's do (-INT64_MIN is INT64_MIN) instead of
 * overflowing (undefined behaviour); generated C gets the same macro (src/codegen/emit_c.c). */
#define KILN_NEG(x) _Generic((x), int64_t: (int64_t)(0ull - (uint64_t)(x)), int32_t: (int32_t)(0u - (uint32_t)(x)), int8_t: (int8_t)(0u - (uint32_t)(x)), default: -(x))

#include "floordiv.h" /* KILN_FLOORDIV, KILN_MOD: Python's // and % in ops.def's C expressions */
#include "rounding.h" /* KILN_FLOOR, KILN_ROUND, KILN_ISNAN, ...: rounding and classifying in C expressions */
#include "bitwise.h" /* KILN_BITAND, KILN_SHL, ...: bitwise ops and shifts in C expressions */

/* Every kernel, inference function and gradient rule named in ops.def. */
#define KILN_OP(ENUM, name, nin, nout, fusion, flags, infer, kernel, grad, cexpr)           \
    kiln_status kiln_infer_##infer(kiln_tensor *const *in, int nin_, const kiln_attrs *a,   \
                                   kiln_meta *out);                                          \
    kiln_status kiln_kernel_##kernel(kiln_tensor *const *in, int nin_, const kiln_attrs *a, \
                                     kiln_tensor **out);                                     \
    kiln_status kiln_grad_##grad(const kiln_grad_ctx *ctx, kiln_tensor *const *gout,         \
                                 kiln_tensor **gin);
#include "ops.def"
#undef KILN_OP

/* Signatures, for definitions outside the X-macro (every op shares them, so any parameter
 * may go unused). */
#define KILN_UNUSED __attribute__((unused))
#define KILN_INFER(name)                                                                    \
    kiln_status kiln_infer_##name(kiln_tensor *const *in KILN_UNUSED, int nin KILN_UNUSED,  \
                                  const kiln_attrs *a KILN_UNUSED, kiln_meta *out)
#define KILN_KERNEL(name)                                                                   \
    kiln_status kiln_kernel_##name(kiln_tensor *const *in KILN_UNUSED, int nin KILN_UNUSED, \
                                   const kiln_attrs *a KILN_UNUSED, kiln_tensor **out)
#define KILN_GRAD(name)                                                                     \
    kiln_status kiln_grad_##name(const kiln_grad_ctx *ctx KILN_UNUSED,                      \
                                 kiln_tensor *const *gout KILN_UNUSED, kiln_tensor **gin)

/* Thread-level random generator (src/core/random.c), seeded by kiln_manual_seed. */
uint64_t kiln_random_next(void);
/* The uid the next tensor made will get: tensors made from now on have this uid or a higher one. */
uint64_t kiln_tensor_next_uid(void);
double kiln_random_uniform(void);  /* [0, 1) */
double kiln_random_normal(void);

#endif
