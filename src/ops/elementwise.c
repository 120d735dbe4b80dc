/* Elementwise ops: inference (broadcasting, promotion) and kernels generated from the C
 * expressions in ops.def, for every compute type; the float32 loops are compiled per instruction
 * set (isa_dispatch.h: "elementwise_f32"). Ops with float16 or bfloat16 operands or results
 * (float32 operands beside them) compute in float32 registers on blocks, each result rounded to
 * its 16-bit dtype as it is stored (run_half); 16-bit floats mixed with other dtypes compute
 * through float32 copies of the operands (run_elementwise). float32 exp, erf,
 * tanh and log are src/core/approx_f32.h's, as in generated C: eager and compiled agree bit for
 * bit. */
#include <tgmath.h>

#include "../core/internal.h"
#include "elementwise_loops.h"
#include "isa_dispatch.h"
#include "lowp_pass.h"
/* last: float32 exp, erf, tanh and log of the C expressions become generated C's vectorizable
 * ones (float64 stays on libm, and is the reference the tests hold float32 to) */
#define KILN_APPROX_F32_NAMES
#include "../core/approx_f32.h"

/* ---- inference -------------------------------------------------------------------------- */

/* Messages here leave out the op's name: kiln_infer prefixes it for elementwise ops. */

static kiln_status reject_bool(kiln_tensor *const *in, int nin) {
    for (int k = 0; k < nin; k++)
        if (in[k]->meta.dtype == KILN_DTYPE_BOOL) {
            char buf[512];
            return kiln_error(KILN_ERR_TYPE, "not supported for bool tensors (shapes %s); cast to a numeric dtype first",
                              kiln_shapes_str(in, nin, buf, sizeof buf));
        }
    return KILN_OK;
}

static kiln_dtype float_of(kiln_dtype d) { return kiln_dtype_is_float(d) ? d : KILN_DTYPE_FLOAT32; }

static kiln_status infer_broadcast(kiln_tensor *const *in, int nin, kiln_dtype dtype, kiln_meta *out) {
    out->dtype = dtype;
    return kiln_broadcast_shape(NULL, nin, in, &out->ndim, out->shape);
}

KILN_INFER(unary_same) {
    KILN_TRY(reject_bool(in, nin));
    *out = in[0]->meta;
    return KILN_OK;
}

KILN_INFER(unary_float) {
    *out = in[0]->meta;
    out->dtype = float_of(in[0]->meta.dtype);
    return KILN_OK;
}

KILN_INFER(unary_bool) {
    *out = in[0]->meta;
    out->dtype = KILN_DTYPE_BOOL;
    return KILN_OK;
}

KILN_INFER(unary_any) {
    *out = in[0]->meta;
    return KILN_OK;
}

KILN_INFER(cast) {
    KILN_TRY(kiln_attrs_expect("cast", a, 1, 0));
    if (a->i[0] < 0 || a->i[0] >= KILN_DTYPE_COUNT)
        return kiln_error(KILN_ERR_TYPE, "invalid target dtype %lld", (long long)a->i[0]);
    *out = in[0]->meta;
    out->dtype = (kiln_dtype)a->i[0];
    return KILN_OK;
}

KILN_INFER(binary_arith) {
    return infer_broadcast(in, nin, kiln_dtype_promote(in[0]->meta.dtype, in[1]->meta.dtype), out);
}

/* as NumPy: subtracting bools is an error (add and mul of bools are logical or / and) */
KILN_INFER(binary_sub) {
    if (in[0]->meta.dtype == KILN_DTYPE_BOOL && in[1]->meta.dtype == KILN_DTYPE_BOOL) return reject_bool(in, nin);
    return kiln_infer_binary_arith(in, nin, a, out);
}

KILN_INFER(binary_float) {
    return infer_broadcast(in, nin, float_of(kiln_dtype_promote(in[0]->meta.dtype, in[1]->meta.dtype)), out);
}

KILN_INFER(compare) { return infer_broadcast(in, nin, KILN_DTYPE_BOOL, out); }

/* bitwise ops take integer and bool tensors only (NumPy's TypeError for floats) */
static kiln_status reject_float(kiln_tensor *const *in, int nin) {
    for (int k = 0; k < nin; k++)
        if (kiln_dtype_is_float(in[k]->meta.dtype)) {
            char buf[512];
            return kiln_error(KILN_ERR_TYPE, "not supported for %s%s%s tensors (shapes %s): bitwise ops take integer or bool "
                              "tensors", kiln_dtype_name(in[0]->meta.dtype), nin > 1 ? " and " : "",
                              nin > 1 ? kiln_dtype_name(in[1]->meta.dtype) : "", kiln_shapes_str(in, nin, buf, sizeof buf));
        }
    return KILN_OK;
}

/* and, or, xor: NumPy promotion (two bools give bool: the logical op) */
KILN_INFER(bitwise) {
    KILN_TRY(reject_float(in, nin));
    return kiln_infer_binary_arith(in, nin, a, out);
}

KILN_INFER(bitwise_not) {
    KILN_TRY(reject_float(in, nin));
    *out = in[0]->meta;
    return KILN_OK;
}

/* shifts: NumPy promotion, two bools giving int8 (NumPy's) */
KILN_INFER(shift) {
    KILN_TRY(reject_float(in, nin));
    kiln_dtype d = kiln_dtype_promote(in[0]->meta.dtype, in[1]->meta.dtype);
    return infer_broadcast(in, nin, d == KILN_DTYPE_BOOL ? KILN_DTYPE_INT8 : d, out);
}

KILN_INFER(where) { return infer_broadcast(in, nin, kiln_dtype_promote(in[1]->meta.dtype, in[2]->meta.dtype), out); }

/* ---- generated inner loops -------------------------------------------------------------- */

typedef struct {
    double f0, f1;
} ew_ctx;

enum { CT_BOOL, CT_I8, CT_I32, CT_I64, CT_F32, CT_F64, CT_COUNT };

static int compute_index(kiln_dtype d) {
    switch (d) {
    case KILN_DTYPE_BOOL: return CT_BOOL;
    case KILN_DTYPE_INT8: return CT_I8;
    case KILN_DTYPE_INT32: return CT_I32;
    case KILN_DTYPE_INT64: return CT_I64;
    case KILN_DTYPE_FLOAT64: return CT_F64;
    default: return CT_F32; /* float16, bfloat16 and float32 */
    }
}

static kiln_dtype compute_dtype(kiln_dtype d) {
    return d == KILN_DTYPE_FLOAT16 || d == KILN_DTYPE_BFLOAT16 ? KILN_DTYPE_FLOAT32 : d;
}

/* Output conversions: bool outputs hold 0 or 1. */
#define STORE_SAME(OT, v) ((OT)(v))
#define STORE_BOOL(OT, v) ((OT)((v) != 0))

#define EW_LOOP1(FN, CT, OT, STORE, EXPR)                                                    \
    static void FN(void *vctx, int64_t n, char **p, const int64_t *s) {                      \
        typedef CT T;                                                                        \
        const ew_ctx *ctx = vctx;                                                            \
        const double f0 = ctx->f0, f1 = ctx->f1;                                             \
        (void)f0, (void)f1;                                                                  \
        OT *o = (OT *)p[0]; /* may alias an input exactly (in-place plans) */                                                         \
        if (s[0] == sizeof(OT) && s[1] == sizeof(T)) {                                       \
            const T *restrict A = (const T *)p[1];                                           \
            _Pragma("omp simd") for (int64_t i = 0; i < n; i++) {                            \
                T a = A[i];                                                                  \
                o[i] = STORE(OT, EXPR);                                                      \
            }                                                                                \
        } else {                                                                             \
            for (int64_t i = 0; i < n; i++) {                                                \
                T a = *(const T *)(p[1] + i * s[1]);                                         \
                *(OT *)(p[0] + i * s[0]) = STORE(OT, EXPR);                                  \
            }                                                                                \
        }                                                                                    \
    }

#define EW_LOOP2(FN, CT, OT, STORE, EXPR)                                                    \
    static void FN(void *vctx, int64_t n, char **p, const int64_t *s) {                      \
        typedef CT T;                                                                        \
        const ew_ctx *ctx = vctx;                                                            \
        const double f0 = ctx->f0, f1 = ctx->f1;                                             \
        (void)f0, (void)f1;                                                                  \
        OT *o = (OT *)p[0]; /* may alias an input exactly (in-place plans) */                                                         \
        const T *restrict A = (const T *)p[1], *restrict B = (const T *)p[2];                \
        if (s[0] == sizeof(OT) && s[1] == sizeof(T) && s[2] == sizeof(T)) {                 \
            _Pragma("omp simd") for (int64_t i = 0; i < n; i++) {                            \
                T a = A[i], b = B[i];                                                        \
                o[i] = STORE(OT, EXPR);                                                      \
            }                                                                                \
        } else if (s[0] == sizeof(OT) && s[1] == sizeof(T) && s[2] == 0) {                   \
            const T b = *B;                                                                  \
            _Pragma("omp simd") for (int64_t i = 0; i < n; i++) {                            \
                T a = A[i];                                                                  \
                o[i] = STORE(OT, EXPR);                                                      \
            }                                                                                \
        } else if (s[0] == sizeof(OT) && s[1] == 0 && s[2] == sizeof(T)) {                   \
            const T a = *A;                                                                  \
            _Pragma("omp simd") for (int64_t i = 0; i < n; i++) {                            \
                T b = B[i];                                                                  \
                o[i] = STORE(OT, EXPR);                                                      \
            }                                                                                \
        } else {                                                                             \
            for (int64_t i = 0; i < n; i++) {                                                \
                T a = *(const T *)(p[1] + i * s[1]), b = *(const T *)(p[2] + i * s[2]);      \
                *(OT *)(p[0] + i * s[0]) = STORE(OT, EXPR);                                  \
            }                                                                                \
        }                                                                                    \
    }

#define EW_LOOP3(FN, CT, OT, STORE, EXPR)                                                    \
    static void FN(void *vctx, int64_t n, char **p, const int64_t *s) {                      \
        typedef CT T;                                                                        \
        const ew_ctx *ctx = vctx;                                                            \
        const double f0 = ctx->f0, f1 = ctx->f1;                                             \
        (void)f0, (void)f1;                                                                  \
        for (int64_t i = 0; i < n; i++) {                                                    \
            T a = *(const T *)(p[1] + i * s[1]), b = *(const T *)(p[2] + i * s[2]),          \
              c = *(const T *)(p[3] + i * s[3]);                                             \
            *(OT *)(p[0] + i * s[0]) = STORE(OT, EXPR);                                      \
        }                                                                                    \
    }

/* One loop per compute type; bool computes as uint8_t. */
#define EW_LOOPS(NAME, NIN, OUTKIND, EXPR)                                                   \
    EW_LOOP##NIN(ew_##NAME##_bool, uint8_t, EW_OT_##OUTKIND(uint8_t), EW_STORE_##OUTKIND, EXPR) \
    EW_LOOP##NIN(ew_##NAME##_i8, int8_t, EW_OT_##OUTKIND(int8_t), EW_STORE_##OUTKIND, EXPR)     \
    EW_LOOP##NIN(ew_##NAME##_i32, int32_t, EW_OT_##OUTKIND(int32_t), EW_STORE_##OUTKIND, EXPR)  \
    EW_LOOP##NIN(ew_##NAME##_i64, int64_t, EW_OT_##OUTKIND(int64_t), EW_STORE_##OUTKIND, EXPR)  \
    EW_LOOP##NIN(ew_##NAME##_f32, float, EW_OT_##OUTKIND(float), EW_STORE_##OUTKIND, EXPR)      \
    EW_LOOP##NIN(ew_##NAME##_f64, double, EW_OT_##OUTKIND(double), EW_STORE_##OUTKIND, EXPR)
#define EW_OT_SAME(CT) CT
#define EW_OT_BOOL(CT) uint8_t
#define EW_STORE_SAME STORE_SAME
#define EW_STORE_BOOL STORE_BOOL

/* Which ops get generated kernels, and whether they output bool: selected by pasting the
 * fusion class and the inference name of each ops.def entry. */
#define EW_IF_KILN_FUSE_ELEMENTWISE(...) __VA_ARGS__
#define EW_IF_KILN_FUSE_REDUCTION(...)
#define EW_IF_KILN_FUSE_VIEW(...)
#define EW_IF_KILN_FUSE_OPAQUE(...)
#define EW_GEN_unary_same(G, ...) G(SAME, __VA_ARGS__)
#define EW_GEN_unary_float(G, ...) G(SAME, __VA_ARGS__)
#define EW_GEN_unary_bool(G, ...) G(BOOL, __VA_ARGS__)
#define EW_GEN_binary_arith(G, ...) G(SAME, __VA_ARGS__)
#define EW_GEN_binary_sub(G, ...) G(SAME, __VA_ARGS__)
#define EW_GEN_binary_float(G, ...) G(SAME, __VA_ARGS__)
#define EW_GEN_compare(G, ...) G(BOOL, __VA_ARGS__)
#define EW_GEN_bitwise(G, ...) G(SAME, __VA_ARGS__)
#define EW_GEN_bitwise_not(G, ...) G(SAME, __VA_ARGS__)
#define EW_GEN_shift(G, ...) G(SAME, __VA_ARGS__)
#define EW_GEN_where(G, ...) G(SAME, __VA_ARGS__)
#define EW_GEN_cast(G, ...)       /* own kernel below */
#define EW_GEN_unary_any(G, ...)  /* own kernel below */

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wbool-operation"
#pragma GCC diagnostic ignored "-Wfloat-conversion"
#pragma GCC diagnostic ignored "-Wsign-compare"
#pragma GCC diagnostic ignored "-Wtype-limits"
#pragma GCC diagnostic ignored "-Wint-in-bool-context"
#pragma GCC diagnostic ignored "-Wabsolute-value"
#define GEN_LOOPS(OUTKIND, name, nin, cexpr) EW_LOOPS(name, nin, OUTKIND, cexpr)
#define KILN_OP(ENUM, name_, nin, nout, fusion, flags, infer, kernel, grad, cexpr)          \
    EW_IF_##fusion(EW_GEN_##infer(GEN_LOOPS, kernel, nin, cexpr))
#include "ops.def"
#undef KILN_OP

/* float32's loops, the hot ones, also compiled per instruction set (isa_dispatch.h: family
 * "elementwise_f32"): each variant is a table of them by op. ops.def is read per variant, for
 * its loops (EW_PART = EW_F32_LOOP, inside the variant's target pragma) and for its table
 * (EW_PART = EW_F32_ENTRY); EW_SFX names the variant's functions. */
typedef struct {
    kiln_inner_fn f32[KILN_OP_COUNT];
} ew_kernels;
#define EW_F32_LOOP(OUTKIND, name, nin, ENUM, cexpr, SFX) \
    EW_LOOP##nin(ew_##name##_##SFX, float, EW_OT_##OUTKIND(float), EW_STORE_##OUTKIND, cexpr)
#define EW_F32_ENTRY(OUTKIND, name, nin, ENUM, cexpr, SFX) [KILN_OP_##ENUM] = ew_##name##_##SFX,
#define KILN_OP(ENUM, name_, nin, nout, fusion, flags, infer, kernel, grad, cexpr)          \
    EW_IF_##fusion(EW_GEN_##infer(EW_PART, kernel, nin, ENUM, cexpr, EW_SFX))

#define EW_SFX f32
#define EW_PART EW_F32_ENTRY
static const ew_kernels elementwise_f32_baseline = {{
#include "ops.def"
}};
#undef EW_PART
#undef EW_SFX
#if KILN_ISA_VARIANTS
#define EW_SFX f32_avx2
KILN_ISA_BEGIN_AVX2
KILN_APPROX_F32_DEFINE(kf_avx2_) /* this variant's exp, erf, tanh, log */
#undef KILN_APPROX_F32
#define KILN_APPROX_F32 kf_avx2_
#define EW_PART EW_F32_LOOP
#include "ops.def"
#undef EW_PART
#undef KILN_APPROX_F32
#define KILN_APPROX_F32 kf_
KILN_ISA_END
#define EW_PART EW_F32_ENTRY
static const ew_kernels elementwise_f32_avx2 = {{
#include "ops.def"
}};
#undef EW_PART
#undef EW_SFX
#define EW_SFX f32_avx512
KILN_ISA_BEGIN_AVX512
KILN_APPROX_F32_DEFINE(kf_avx512_) /* this variant's exp, erf, tanh, log */
#undef KILN_APPROX_F32
#define KILN_APPROX_F32 kf_avx512_
#define EW_PART EW_F32_LOOP
#include "ops.def"
#undef EW_PART
#undef KILN_APPROX_F32
#define KILN_APPROX_F32 kf_
KILN_ISA_END
#define EW_PART EW_F32_ENTRY
static const ew_kernels elementwise_f32_avx512 = {{
#include "ops.def"
}};
#undef EW_PART
#undef EW_SFX
#endif
#undef KILN_OP
#pragma GCC diagnostic pop

/* ---- the shared kernel ------------------------------------------------------------------ */

static ew_ctx ew_ctx_of(const kiln_attrs *a) {
    ew_ctx ctx = {a && a->nf > 0 ? a->f[0] : 0, a && a->nf > 1 ? a->f[1] : 0};
    return ctx;
}

/* Runs fn over out and operands[0..nin) broadcast to out's shape (operand items isz bytes).
 * Inlined: it is on every eager elementwise call's path. */
static inline __attribute__((always_inline)) void iterate_operands(kiln_tensor *out, int nin, kiln_tensor *const *operands, size_t isz_in,
                             kiln_inner_fn fn, void *ctx) {
    int nd = out->meta.ndim;
    int64_t strides[4][KILN_MAX_DIMS];
    char *base[4];
    size_t isz[4];
    memcpy(strides[0], out->strides, sizeof(int64_t) * (size_t)nd);
    base[0] = out->data;
    isz[0] = kiln_dtype_size(out->meta.dtype);
    for (int k = 0; k < nin; k++) {
        kiln_broadcast_strides(operands[k], nd, out->meta.shape, strides[k + 1]);
        base[k + 1] = operands[k]->data;
        isz[k + 1] = isz_in;
    }
    kiln_iterate(nin + 1, base, isz, (const int64_t(*)[KILN_MAX_DIMS])strides, nd, out->meta.shape, fn, ctx);
}

/* loops by compute type, except float32's: f32, the variant chosen for this CPU */
static kiln_status run_elementwise(const kiln_inner_fn *loops, kiln_inner_fn f32, int nin, kiln_tensor *const *in,
                                   const kiln_attrs *a, kiln_tensor *out, kiln_dtype cdtype) {
    /* inputs converted to the compute dtype where needed (keeping their own shapes) */
    kiln_tensor *conv[3] = {0};
    kiln_tensor *result = out;
    kiln_status s = KILN_OK;
    for (int k = 0; k < nin && s == KILN_OK; k++) {
        if (in[k]->meta.dtype == cdtype) continue;
        s = kiln_tensor_empty(cdtype, in[k]->meta.ndim, in[k]->meta.shape, &conv[k]);
        if (s == KILN_OK) s = kiln_copy_into(conv[k], in[k]);
    }
    bool bool_out = out->meta.dtype == KILN_DTYPE_BOOL && cdtype != KILN_DTYPE_BOOL;
    if (s == KILN_OK && !bool_out && out->meta.dtype != cdtype) /* float16/bfloat16 output */
        s = kiln_tensor_empty(cdtype, out->meta.ndim, out->meta.shape, &result);
    if (s == KILN_OK) {
        kiln_tensor *operands[3];
        for (int k = 0; k < nin; k++) operands[k] = conv[k] ? conv[k] : in[k];
        ew_ctx ctx = ew_ctx_of(a);
        int ci = compute_index(cdtype);
        iterate_operands(result, nin, operands, kiln_dtype_size(cdtype), ci == CT_F32 ? f32 : loops[ci], &ctx);
        if (result != out) s = kiln_copy_into(out, result);
    }
    if (result != out) kiln_tensor_release(result);
    for (int k = 0; k < nin; k++) kiln_tensor_release(conv[k]);
    return s;
}

/* ---- 16-bit float operands ------------------------------------------------------------------ */

/* An op over float16, bfloat16 and float32 operands with at least one 16-bit float among its
 * operands and result (its result float16, bfloat16, float32 or bool; computed in float32) runs
 * its float32 loop on blocks: each 16-bit operand's block read into float32 registers' worth of
 * stack (kiln_f16_row: F16C; bfloat16 widened exactly), float32 operands read in place, each
 * 16-bit result rounded as it is stored (float16 to nearest even; bfloat16 as kiln_f32_to_bf16).
 * The same float32 loop on the same values and the same rounding as run_elementwise's copies, bit
 * for bit, without float32 copies of whole tensors (tests/python/test_amp_elementwise_blocks.py).
 * Other mixes take run_elementwise's copies (the plain path). */
enum { HALF_BLOCK = 256 };

typedef enum { HK_F32, HK_F16, HK_BF16, HK_BOOL } half_kind;

typedef struct {
    kiln_inner_fn f32;
    ew_ctx ew;
    int nin;
    unsigned char kind[4]; /* [0] the result, [1..nin] the operands */
} half_ctx;

static void half_rows(void *vctx, int64_t n, char **p, const int64_t *s) {
    const half_ctx *h = vctx;
    float buf[4][HALF_BLOCK];
    char *q[4];
    int64_t qs[4];
    for (int64_t i0 = 0; i0 < n; i0 += HALF_BLOCK) {
        int64_t m = n - i0 < HALF_BLOCK ? n - i0 : HALF_BLOCK;
        for (int k = 1; k <= h->nin; k++) {
            char *src = p[k] + i0 * s[k];
            if (h->kind[k] == HK_F32) {
                q[k] = src, qs[k] = s[k];
                continue;
            }
            int64_t len = s[k] == 0 ? 1 : m; /* a broadcast operand: one value */
            if (h->kind[k] == HK_F16) kiln_f16_row(buf[k], src, s[k], len);
            else kiln_bf16_row(buf[k], src, s[k], len);
            q[k] = (char *)buf[k];
            qs[k] = s[k] == 0 ? 0 : (int64_t)sizeof(float);
        }
        if (h->kind[0] == HK_F32 || h->kind[0] == HK_BOOL) {
            q[0] = p[0] + i0 * s[0], qs[0] = s[0];
            h->f32((void *)&h->ew, m, q, qs);
        } else {
            q[0] = (char *)buf[0], qs[0] = sizeof(float);
            h->f32((void *)&h->ew, m, q, qs);
            if (h->kind[0] == HK_F16) kiln_f16_store_row(p[0] + i0 * s[0], s[0], buf[0], m);
            else kiln_bf16_store_row(p[0] + i0 * s[0], s[0], buf[0], m);
        }
    }
}

static int half_kind_of(kiln_dtype d) {
    switch (d) {
    case KILN_DTYPE_FLOAT32: return HK_F32;
    case KILN_DTYPE_FLOAT16: return HK_F16;
    case KILN_DTYPE_BFLOAT16: return HK_BF16;
    case KILN_DTYPE_BOOL: return HK_BOOL;
    default: return -1;
    }
}

/* Whether the op takes the block path (above): cdtype float32, operands 16-bit or float32 floats,
 * a 16-bit float among the operands and the result. */
static bool half_blocks(kiln_tensor *const *in, int nin, const kiln_tensor *out, kiln_dtype cdtype, half_ctx *h) {
    if (cdtype != KILN_DTYPE_FLOAT32 || nin < 1 || nin > 3) return false;
    int ko = half_kind_of(out->meta.dtype);
    if (ko < 0) return false;
    bool sixteen = ko == HK_F16 || ko == HK_BF16;
    h->kind[0] = (unsigned char)ko;
    for (int k = 0; k < nin; k++) {
        int kk = half_kind_of(in[k]->meta.dtype);
        if (kk < 0 || kk == HK_BOOL) return false;
        sixteen |= kk != HK_F32;
        h->kind[k + 1] = (unsigned char)kk;
    }
    h->nin = nin;
    return sixteen;
}

static kiln_status run_half(kiln_inner_fn f32, half_ctx *h, kiln_tensor *const *in, const kiln_attrs *a,
                            kiln_tensor *out) {
    h->f32 = f32;
    h->ew = ew_ctx_of(a);
    /* iterate_operands' item sizes only scale the strides: each operand's own */
    int nd = out->meta.ndim;
    int64_t strides[4][KILN_MAX_DIMS];
    char *base[4];
    size_t isz[4];
    memcpy(strides[0], out->strides, sizeof(int64_t) * (size_t)nd);
    base[0] = out->data;
    isz[0] = kiln_dtype_size(out->meta.dtype);
    for (int k = 0; k < h->nin; k++) {
        kiln_broadcast_strides(in[k], nd, out->meta.shape, strides[k + 1]);
        base[k + 1] = in[k]->data;
        isz[k + 1] = kiln_dtype_size(in[k]->meta.dtype);
    }
    kiln_iterate(h->nin + 1, base, isz, (const int64_t(*)[KILN_MAX_DIMS])strides, nd, out->meta.shape, half_rows, h);
    return KILN_OK;
}

/* The compute dtype of an op: its output dtype, except for bool-valued ops, which compute in
 * the promoted input dtype; 16-bit floats compute through float32. */
static kiln_dtype op_compute_dtype(kiln_tensor *const *in, int nin, const kiln_tensor *out) {
    kiln_dtype d = out->meta.dtype;
    if (d == KILN_DTYPE_BOOL) {
        d = in[0]->meta.dtype;
        for (int k = 1; k < nin; k++) d = kiln_dtype_promote(d, in[k]->meta.dtype);
    }
    return compute_dtype(d);
}

KILN_ISA_FAMILY(elementwise_f32)

/* float32 through the variant chosen (elementwise_f32_chosen), the other types as built */
#define GEN_KERNEL(OUTKIND, name, nin_, ENUM)                                                \
    KILN_KERNEL(name) {                                                                      \
        static const kiln_inner_fn loops[CT_COUNT] = {ew_##name##_bool, ew_##name##_i8,      \
                                                      ew_##name##_i32,  ew_##name##_i64,     \
                                                      NULL,             ew_##name##_f64};    \
        kiln_inner_fn f32 = ((const ew_kernels *)elementwise_f32_chosen)->f32[KILN_OP_##ENUM]; \
        kiln_dtype cdtype = op_compute_dtype(in, nin, out[0]);                               \
        half_ctx h;                                                                          \
        if (half_blocks(in, nin, out[0], cdtype, &h)) return run_half(f32, &h, in, a, out[0]); \
        return run_elementwise(loops, f32, nin, in, a, out[0], cdtype);                      \
    }
#define KILN_OP(ENUM, name_, nin, nout, fusion, flags, infer, kernel, grad, cexpr)          \
    EW_IF_##fusion(EW_GEN_##infer(GEN_KERNEL, kernel, nin, ENUM))
#include "ops.def"
#undef KILN_OP

/* ---- the loops for other kernels (elementwise_loops.h) -------------------------------------- */

#define EW_F64_ENTRY_SAME(name, ENUM) [KILN_OP_##ENUM] = ew_##name##_f64,
#define EW_F64_ENTRY_BOOL(name, ENUM)
#define EW_F64_ENTRY(OUTKIND, name, nin_, ENUM) EW_F64_ENTRY_##OUTKIND(name, ENUM)
#define KILN_OP(ENUM, name_, nin, nout, fusion, flags, infer, kernel, grad, cexpr)          \
    EW_IF_##fusion(EW_GEN_##infer(EW_F64_ENTRY, kernel, nin, ENUM))
/* float64 loops of the ops whose result has the operands' dtype */
static const kiln_inner_fn ew_f64_same[KILN_OP_COUNT] = {
#include "ops.def"
};
#undef KILN_OP

static const ew_ctx ew_no_attrs;
const void *const kiln_elementwise_no_attrs = &ew_no_attrs;

kiln_inner_fn kiln_elementwise_loop(kiln_op op, kiln_dtype dtype) {
    if ((unsigned)op >= KILN_OP_COUNT || !ew_f64_same[op]) return NULL;
    if (dtype == KILN_DTYPE_FLOAT64) return ew_f64_same[op];
    if (dtype == KILN_DTYPE_FLOAT32) return ((const ew_kernels *)elementwise_f32_chosen)->f32[op];
    return NULL;
}

KILN_KERNEL(cast) {
    (void)nin, (void)a;
    return kiln_lowp_copy_into(out[0], in[0]); /* float32 <-> 16-bit in one parallel pass, else kiln_copy_into */
}

KILN_KERNEL(contiguous) {
    (void)nin, (void)a;
    return kiln_copy_into(out[0], in[0]);
}
