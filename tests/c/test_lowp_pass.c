/* The whole-tensor 16-bit <-> float32 passes of the float32-computing kernels (src/ops/lowp_pass.c):
 * kiln_lowp_widen and kiln_lowp_copy_into give the plain reference loops' bits (and kiln_copy_into's)
 * for float16 and bfloat16 on awkward values (ties, NaN, infinities, subnormals, overflow), at
 * sizes split over threads with tails off the split alignment; a widened dense view (transposed,
 * permuted) keeps its strides and values; other views (sliced, broadcast) come back contiguous. */
#include <omp.h>

#include "check.h"
#include "core/internal.h"
#include "ops/lowp_pass.h"

static uint32_t rng_state = 12345;
static uint32_t next_u32(void) {
    rng_state ^= rng_state << 13, rng_state ^= rng_state >> 17, rng_state ^= rng_state << 5;
    return rng_state;
}

/* n float32 values: random bit patterns (every exponent, NaN and infinities among them), bfloat16
 * and float16 ties, and values near float16's overflow. */
static void awkward(float *v, int64_t n) {
    static const uint32_t bits[] = {0x7FC00000, 0x7F800001, 0xFFBFFFFF, 0x7F800000, 0xFF800000, 0x80000000,
                                    0x00000001, 0x3F808000, 0x3F818000, 0x3F807FFF, 0x7F7FFFFF, 0x7F7F8000,
                                    0x477FF000, 0x477FEFFF, 0x3F801000, 0x3F803000, 0x33800000};
    for (int64_t i = 0; i < n; i++) {
        uint32_t u = (i < (int64_t)(sizeof bits / sizeof bits[0])) ? bits[i] : next_u32();
        if (i % 3 == 1) u &= 0xC7FFFFFF; /* many ordinary magnitudes too */
        memcpy(&v[i], &u, 4);
    }
}

static kiln_tensor *tensor_of(kiln_dtype d, int nd, const int64_t *shape) {
    kiln_tensor *t = NULL;
    CHECK_OK(kiln_tensor_empty(d, nd, shape, &t));
    return t;
}

static bool same_bits(const void *a, const void *b, int64_t bytes) { return memcmp(a, b, (size_t)bytes) == 0; }

/* round: the pass, the reference and kiln_copy_into agree bit for bit; widen of the result: the
 * reference's bits. */
static void check_round_and_widen(kiln_dtype half, int64_t n) {
    kiln_tensor *f = tensor_of(KILN_DTYPE_FLOAT32, 1, &n), *h = tensor_of(half, 1, &n), *c = tensor_of(half, 1, &n);
    awkward(f->data, n);
    uint16_t *ref = malloc(sizeof(uint16_t) * (size_t)(n ? n : 1));
    float *wref = malloc(sizeof(float) * (size_t)(n ? n : 1));
    kiln_lowp_round_ref(half, ref, f->data, n);
    CHECK_OK(kiln_lowp_copy_into(h, f));
    CHECK_OK(kiln_copy_into(c, f));
    CHECK(same_bits(h->data, ref, n * 2));
    CHECK(same_bits(c->data, ref, n * 2));
    kiln_tensor *w = NULL;
    CHECK_OK(kiln_lowp_widen(h, false, &w));
    kiln_lowp_widen_ref(half, wref, ref, n);
    CHECK(w && w->meta.dtype == KILN_DTYPE_FLOAT32 && w->numel == n && kiln_tensor_is_contiguous(w));
    if (w) CHECK(same_bits(w->data, wref, n * 4));
    CHECK_OK(kiln_lowp_copy_into(f, h)); /* and back through the copy: the widened bits */
    CHECK(same_bits(f->data, wref, n * 4));
    kiln_tensor_release(w), kiln_tensor_release(f), kiln_tensor_release(h), kiln_tensor_release(c);
    free(ref), free(wref);
}

/* A view of a contiguous 16-bit tensor widened with keep_layout: the strides kept for dense views
 * (a transposed matrix, a permuted 4-D tensor), contiguous otherwise; the values those of
 * kiln_to_contiguous, element by element. */
static void check_view(kiln_dtype half, kiln_tensor *base, int nd, const int64_t *shape, const int64_t *strides,
                       int64_t offset, bool dense) {
    kiln_tensor *v = NULL, *w = NULL, *want = NULL, *wc = NULL;
    CHECK_OK(kiln_tensor_view(base, nd, shape, strides, offset, &v));
    CHECK_OK(kiln_lowp_widen(v, true, &w));
    CHECK_OK(kiln_to_contiguous(v, KILN_DTYPE_FLOAT32, &want));
    CHECK(w && w->meta.dtype == KILN_DTYPE_FLOAT32);
    if (w && want) {
        bool kept = true;
        for (int d = 0; d < nd; d++) kept = kept && w->strides[d] == strides[d];
        CHECK(dense ? kept : kiln_tensor_is_contiguous(w));
        CHECK_OK(kiln_to_contiguous(w, KILN_DTYPE_FLOAT32, &wc));
        if (wc) CHECK(same_bits(wc->data, want->data, want->numel * 4));
    }
    (void)half;
    kiln_tensor_release(v), kiln_tensor_release(w), kiln_tensor_release(want), kiln_tensor_release(wc);
}

static void check_views(kiln_dtype half) {
    int64_t n = 6 * 40 * 70 * 3;
    kiln_tensor *f = tensor_of(KILN_DTYPE_FLOAT32, 1, &n), *h = tensor_of(half, 1, &n);
    awkward(f->data, n);
    CHECK_OK(kiln_copy_into(h, f));
    int64_t t_shape[2] = {420, 120}, t_str[2] = {1, 420};                 /* a transposed 120 x 420 matrix */
    check_view(half, h, 2, t_shape, t_str, 0, true);
    int64_t p_shape[4] = {6, 70, 40, 3}, p_str[4] = {8400, 3, 210, 1};   /* (6, 40, 70, 3) permuted 0 2 1 3 */
    check_view(half, h, 4, p_shape, p_str, 0, true);
    int64_t k_shape[4] = {6, 3, 40, 70}, k_str[4] = {8400, 1, 210, 3};   /* the same, last two swapped */
    check_view(half, h, 4, k_shape, k_str, 0, true);
    int64_t s_shape[2] = {120, 200}, s_str[2] = {420, 2};                /* every other column: not dense */
    check_view(half, h, 2, s_shape, s_str, 7, false);
    int64_t b_shape[3] = {4, 120, 420}, b_str[3] = {0, 420, 1};          /* broadcast: not dense */
    check_view(half, h, 3, b_shape, b_str, 0, false);
    int64_t o_shape[2] = {100, 420}, o_str[2] = {420, 1};                /* contiguous at an offset */
    check_view(half, h, 2, o_shape, o_str, 420 * 13, true);
    kiln_tensor_release(f), kiln_tensor_release(h);
}

int main(void) {
    const kiln_dtype halves[2] = {KILN_DTYPE_BFLOAT16, KILN_DTYPE_FLOAT16};
    const int64_t sizes[] = {0, 1, 17, 64, 1000, KILN_PARALLEL_MIN - 1, KILN_PARALLEL_MIN + 77, 300001};
    for (int threads = 1; threads <= 3; threads += 2) {
        omp_set_num_threads(threads);
        for (int k = 0; k < 2; k++) {
            for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) check_round_and_widen(halves[k], sizes[i]);
            check_views(halves[k]);
        }
    }
    CHECK_DONE();
}
