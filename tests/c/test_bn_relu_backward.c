/* BatchNorm+ReLU backward fusion: the fuse_bn_relu_backward pass as "input text -> expected output
 * text", each fused graph computing what the unfused one does (relu_backward then
 * batch_norm_backward: the reference), compiled and run on random inputs with half the mask
 * negative, for every loop of the kernel (S = 1, short S expanded per channel, long S by rows;
 * batch and running statistics), and the cases left alone. */
#include "rewrite_check.h"
#include "core/internal.h"

/* Outputs agree to float32 rounding of sums over random inputs (rewrite_check.h), two runs. */
static int same_results(const kiln_graph *a, const kiln_graph *b) { return rc_same_results(a, b, 2); }

static const kiln_pass_options o1 = {KILN_LEVEL_O1, false, false, KILN_CONV_FUSE_ALL, false};

#define expect_fused(input, want) rc_expect_rewrite_at(__LINE__, "fuse_bn_relu_backward", &o1, input, want, same_results)

/* relu_backward(gy, r) feeding batch_norm_backward of x shaped `shape`, with training flag `train` */
static void fused_case(const char *shape, const char *channels, int train) {
    char input[2048], want[2048];
    snprintf(input, sizeof input,
             "graph(%%0: float32[%s], %%1: float32[%s], %%2: float32[%s], %%3: float32[%s], %%4: float32[%s], "
             "%%5: float32[%s]) {\n"
             "  %%6: float32[%s] = relu_backward(%%0, %%5)\n"
             "  %%7: float32[%s], %%8: float32[%s], %%9: float32[%s] = batch_norm_backward(%%6, %%1, %%2, %%3, %%4) {%d}\n"
             "  return (%%7, %%8, %%9)\n"
             "}\n",
             shape, shape, channels, channels, channels, shape, shape, shape, channels, channels, train);
    snprintf(want, sizeof want,
             "graph(%%0: float32[%s], %%1: float32[%s], %%2: float32[%s], %%3: float32[%s], %%4: float32[%s], "
             "%%5: float32[%s]) {\n"
             "  %%6: float32[%s], %%7: float32[%s], %%8: float32[%s] = batch_norm_relu_backward(%%0, %%1, %%2, %%3, %%4, %%5) {%d}\n"
             "  return (%%6, %%7, %%8)\n"
             "}\n",
             shape, shape, channels, channels, channels, shape, shape, channels, channels, train);
    expect_fused(input, want);
}

static void test_fused(void) {
    fused_case("2, 3, 4, 5", "3", 1);  /* S = 20: coefficients expanded per (c, s) */
    fused_case("2, 3, 4, 5", "3", 0);  /* running statistics */
    fused_case("2, 3, 40", "3", 1);    /* S = 40: row by row */
    fused_case("8, 3", "3", 1);        /* S = 1 */
    fused_case("3, 2, 300", "2", 1);   /* longer rows, vector loops and their tails */
}

/* gy, x, gamma, mean, invstd and the mask (of shape `mask`) followed by `body`: left as it is */
static void unchanged_case(const char *mask, const char *body) {
    char input[2048];
    snprintf(input, sizeof input,
             "graph(%%0: float32[2, 3, 4], %%1: float32[2, 3, 4], %%2: float32[3], %%3: float32[3], %%4: float32[3], "
             "%%5: float32[%s]) {\n%s}\n",
             mask, body);
    expect_fused(input, NULL);
}

static void test_left_alone(void) {
    /* the masked gradient is read elsewhere too (a graph output) */
    unchanged_case("2, 3, 4", "  %6: float32[2, 3, 4] = relu_backward(%0, %5)\n"
                              "  %7: float32[2, 3, 4], %8: float32[3], %9: float32[3] = batch_norm_backward(%6, %1, %2, %3, %4) {1}\n"
                              "  return (%7, %8, %9, %6)\n");
    /* relu_backward broadcasting its mask */
    unchanged_case("3, 4", "  %6: float32[2, 3, 4] = relu_backward(%0, %5)\n"
                           "  %7: float32[2, 3, 4], %8: float32[3], %9: float32[3] = batch_norm_backward(%6, %1, %2, %3, %4) {1}\n"
                           "  return (%7, %8, %9)\n");
    /* the masked gradient as x, not gy */
    unchanged_case("2, 3, 4", "  %6: float32[2, 3, 4] = relu_backward(%0, %5)\n"
                              "  %7: float32[2, 3, 4], %8: float32[3], %9: float32[3] = batch_norm_backward(%1, %6, %2, %3, %4) {1}\n"
                              "  return (%7, %8, %9)\n");
    /* a node with side effects (a random draw) in between */
    unchanged_case("2, 3, 4", "  %6: float32[2, 3, 4] = relu_backward(%0, %5)\n"
                              "  %7: float32[4] = rand() {6, 1, 4; 0, 1}\n"
                              "  %8: float32[2, 3, 4], %9: float32[3], %10: float32[3] = batch_norm_backward(%6, %1, %2, %3, %4) {1}\n"
                              "  return (%8, %9, %10, %7)\n");
}

/* The fused op's bad input is a clear error naming it. */
static void test_op_errors(void) {
    int64_t x[3] = {2, 3, 4}, c[1] = {3}, other[3] = {2, 3, 5};
    kiln_tensor *in[6] = {tensor_f32(3, x, NULL), tensor_f32(3, x, NULL), tensor_f32(1, c, NULL),
                          tensor_f32(1, c, NULL), tensor_f32(1, c, NULL), tensor_f32(3, other, NULL)};
    kiln_tensor *out[3] = {0};
    kiln_attrs at;
    kiln_attrs_clear(&at);
    kiln_attrs_push_int(&at, 1);
    CHECK_STATUS(kiln_apply(KILN_OP_BATCH_NORM_RELU_BACKWARD, 6, in, &at, out), KILN_ERR_VALUE);
    CHECK(strstr(kiln_last_error(), "batch_norm_relu_backward"));
    CHECK(strstr(kiln_last_error(), "relu input"));
    kiln_release_all(in, 6);
}

int main(void) {
    test_fused();
    test_left_alone();
    test_op_errors();
    CHECK_DONE();
}
