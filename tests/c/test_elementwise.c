/* Elementwise kernels against plain loops: broadcasting, strided inputs, dtype promotion. */
#include "check.h"
#include "core/internal.h"

static void test_add_broadcast(void) {
    int64_t sa[2] = {2, 3}, sb[1] = {3};
    float va[6] = {1, 2, 3, 4, 5, 6}, vb[3] = {10, 20, 30};
    kiln_tensor *a = tensor_f32(2, sa, va), *b = tensor_f32(1, sb, vb), *c = NULL;
    CHECK_OK(kiln_apply2(KILN_OP_ADD, a, b, NULL, &c));
    float want[6] = {11, 22, 33, 14, 25, 36};
    CHECK(c && c->meta.ndim == 2 && c->meta.shape[0] == 2 && c->meta.shape[1] == 3);
    CHECK(c && close_f32(c->data, want, 6, 0));
    kiln_tensor_release(a), kiln_tensor_release(b), kiln_tensor_release(c);
}

static void test_bad_broadcast(void) {
    int64_t sa[2] = {2, 3}, sb[1] = {4};
    kiln_tensor *a = tensor_f32(2, sa, NULL), *b = tensor_f32(1, sb, NULL), *c = NULL;
    CHECK_STATUS(kiln_apply2(KILN_OP_MUL, a, b, NULL, &c), KILN_ERR_VALUE);
    CHECK(c == NULL);
    CHECK(strstr(kiln_last_error(), "(2, 3)") && strstr(kiln_last_error(), "(4,)"));
    kiln_tensor_release(a), kiln_tensor_release(b);
}

static void test_large_parallel_exp(void) {
    int64_t n = 1 << 20;
    kiln_tensor *a = tensor_f32(1, &n, NULL), *c = NULL;
    float *pa = a->data;
    for (int64_t i = 0; i < n; i++) pa[i] = (float)(i % 100) / 50.0f - 1.0f;
    CHECK_OK(kiln_apply1(KILN_OP_EXP, a, NULL, &c));
    int bad = 0;
    for (int64_t i = 0; c && i < n; i++)
        if (fabsf(((float *)c->data)[i] - expf(pa[i])) > 1e-6f * expf(pa[i])) bad++;
    CHECK(bad == 0);
    kiln_tensor_release(a), kiln_tensor_release(c);
}

static void test_transposed_input_and_promotion(void) {
    int64_t sa[2] = {2, 3};
    float va[6] = {1, 2, 3, 4, 5, 6};
    kiln_tensor *a = tensor_f32(2, sa, va), *at = NULL, *i = NULL, *c = NULL;
    int64_t perm[2] = {1, 0};
    CHECK_OK(kiln_emit_permute(a, perm, &at));
    int64_t si[2] = {3, 2};
    CHECK_OK(kiln_tensor_empty(KILN_DTYPE_INT32, 2, si, &i));
    for (int k = 0; k < 6; k++) ((int32_t *)i->data)[k] = k;
    CHECK_OK(kiln_apply2(KILN_OP_SUB, at, i, NULL, &c));
    /* at = [[1,4],[2,5],[3,6]] minus [[0,1],[2,3],[4,5]] */
    float want[6] = {1, 3, 0, 2, -1, 1};
    CHECK(c && c->meta.dtype == KILN_DTYPE_FLOAT32 && close_f32(c->data, want, 6, 0));
    kiln_tensor_release(a), kiln_tensor_release(at), kiln_tensor_release(i), kiln_tensor_release(c);
}

int main(void) {
    test_add_broadcast();
    test_bad_broadcast();
    test_large_parallel_exp();
    test_transposed_input_and_promotion();
    CHECK_DONE();
}
