/* dropout(x) -> (y, mask): f[0] = p. mask holds 0 (dropped, probability p) or 1 / (1 - p)
 * in x's dtype and y = x * mask; the gradient is g * mask. Element i keeps or drops by draw
 * base + i of the global generator, so the mask is the same for any number of threads. */
#include "../core/internal.h"
#include "../core/random.h"

KILN_INFER(dropout) {
    (void)nin;
    const kiln_meta *m = &in[0]->meta;
    KILN_TRY(kiln_attrs_expect("dropout", a, 0, 1));
    if (!(a->f[0] >= 0.0 && a->f[0] < 1.0))
        return kiln_error(KILN_ERR_VALUE, "dropout: probability p must be in [0, 1), got %g", a->f[0]);
    if (!kiln_dtype_is_float(m->dtype))
        return kiln_error(KILN_ERR_TYPE, "dropout: expected a floating-point tensor, got %s", kiln_dtype_name(m->dtype));
    out[0] = *m;
    out[1] = *m;
    return KILN_OK;
}

/* Draw i is dropped when its top 53 bits fall below p * 2^53. y = x * mask (NaN stays NaN). */
#define DROPOUT_LOOP(T, LOAD, STORE)                                                          \
    do {                                                                                      \
        const T *xs = x->data;                                                                \
        T *ys = out[0]->data, *ms = out[1]->data;                                             \
        _Pragma("omp parallel for schedule(static) if (n >= KILN_PARALLEL_MIN)")              \
        for (int64_t i = 0; i < n; i++) {                                                     \
            bool keep = (kiln_random_bits(&s, (uint64_t)i) >> 11) >= threshold;               \
            ms[i] = keep ? mask_value : zero;                                                 \
            ys[i] = STORE(LOAD(xs[i]) * (keep ? scale : 0));                                  \
        }                                                                                     \
    } while (0)

#define ID(v) (v)

static void fill_ones(kiln_tensor *t) {
    int64_t n = t->numel;
    switch (t->meta.dtype) {
    case KILN_DTYPE_FLOAT64: for (int64_t i = 0; i < n; i++) ((double *)t->data)[i] = 1.0; break;
    case KILN_DTYPE_FLOAT32: for (int64_t i = 0; i < n; i++) ((float *)t->data)[i] = 1.0f; break;
    case KILN_DTYPE_FLOAT16: for (int64_t i = 0; i < n; i++) ((uint16_t *)t->data)[i] = kiln_f32_to_f16(1.0f); break;
    default: for (int64_t i = 0; i < n; i++) ((uint16_t *)t->data)[i] = kiln_f32_to_bf16(1.0f); break;
    }
}

KILN_KERNEL(dropout) {
    double p = a->f[0];
    kiln_dtype dt = in[0]->meta.dtype;
    kiln_tensor *x;
    KILN_TRY(kiln_to_contiguous(in[0], dt, &x));
    int64_t n = x->numel;
    if (p == 0.0) { /* identity: no draws */
        memcpy(out[0]->data, x->data, (size_t)n * kiln_dtype_size(dt));
        kiln_tensor_release(x);
        fill_ones(out[1]);
        return KILN_OK;
    }
    uint64_t threshold = (uint64_t)(p * 0x1.0p53);
    kiln_random_stream s = kiln_random_reserve((uint64_t)n);
    switch (dt) {
    case KILN_DTYPE_FLOAT64: {
        double scale = 1.0 / (1.0 - p), mask_value = scale, zero = 0.0;
        DROPOUT_LOOP(double, ID, ID);
        break;
    }
    case KILN_DTYPE_FLOAT32: {
        float scale = (float)(1.0 / (1.0 - p)), mask_value = scale, zero = 0.0f;
        DROPOUT_LOOP(float, ID, ID);
        break;
    }
    case KILN_DTYPE_FLOAT16: {
        uint16_t mask_value = kiln_f32_to_f16((float)(1.0 / (1.0 - p))), zero = 0;
        float scale = kiln_f16_to_f32(mask_value);
        DROPOUT_LOOP(uint16_t, kiln_f16_to_f32, kiln_f32_to_f16);
        break;
    }
    default: { /* bfloat16 */
        uint16_t mask_value = kiln_f32_to_bf16((float)(1.0 / (1.0 - p))), zero = 0;
        float scale = kiln_bf16_to_f32(mask_value);
        DROPOUT_LOOP(uint16_t, kiln_bf16_to_f32, kiln_f32_to_bf16);
        break;
    }
    }
    kiln_tensor_release(x);
    return KILN_OK;
}

KILN_GRAD(dropout) {
    if (!gout[0]) return kiln_emit_full(&ctx->in_meta[0], 0.0, &gin[0]);
    return kiln_emit_binary(KILN_OP_MUL, gout[0], ctx->out[1], &gin[0]);
}
