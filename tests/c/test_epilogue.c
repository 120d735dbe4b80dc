/* Epilogue fusion into matmul and linear: the fuse_matmul_epilogue pass as "input text ->
 * expected output text", each fused graph computing exactly what the original does (compiled and
 * run on random inputs), and the rules that keep chains apart (other uses of an intermediate,
 * graph outputs, shape or dtype changes, in-place writes in between). */
#include "rewrite_check.h"
#include "core/internal.h"

/* Runs both graphs on the same random inputs: outputs must be bitwise equal (an epilogue runs
 * the ops' own kernels) and inputs written in place must end equal too. */
static int same_results(const kiln_graph *a, const kiln_graph *b) {
    kiln_compile_options copt = {KILN_ORDER_BFS, true, "kbk"};
    kiln_executable *ea = NULL, *eb = NULL;
    int ok = kiln_compile(a, &copt, &ea) == KILN_OK && kiln_compile(b, &copt, &eb) == KILN_OK;
    if (!ok) fprintf(stderr, "compile failed: %s\n", kiln_last_error());
    int nin = a->ninputs, nout = a->noutputs;
    if (nin > 8 || nout > 8) return 0;
    for (int run = 0; run < 2 && ok; run++) {
        kiln_tensor *ia[8] = {0}, *ib[8] = {0}, *oa[8] = {0}, *ob[8] = {0};
        for (int k = 0; k < nin; k++) {
            ia[k] = rc_random_tensor(&a->values[a->inputs[k]].meta);
            CHECK_OK(kiln_tensor_empty(ia[k]->meta.dtype, ia[k]->meta.ndim, ia[k]->meta.shape, &ib[k]));
            CHECK_OK(kiln_copy_into(ib[k], ia[k]));
        }
        ok = kiln_executable_run(ea, nin, ia, nout, oa) == KILN_OK && kiln_executable_run(eb, nin, ib, nout, ob) == KILN_OK;
        if (!ok) fprintf(stderr, "run failed: %s\n", kiln_last_error());
        for (int k = 0; k < nout && ok; k++)
            ok = oa[k]->numel == ob[k]->numel && memcmp(oa[k]->data, ob[k]->data, (size_t)oa[k]->numel * kiln_dtype_size(oa[k]->meta.dtype)) == 0;
        for (int k = 0; k < nin && ok; k++)
            ok = memcmp(ia[k]->data, ib[k]->data, (size_t)ia[k]->numel * kiln_dtype_size(ia[k]->meta.dtype)) == 0;
        kiln_release_all(ia, nin), kiln_release_all(ib, nin), kiln_release_all(oa, nout), kiln_release_all(ob, nout);
    }
    kiln_executable_free(ea), kiln_executable_free(eb);
    return ok;
}

static const kiln_pass_options o1 = {KILN_LEVEL_O1, false, false, KILN_CONV_FUSE_ALL, false};

/* fuse_matmul_epilogue on the parsed input must print `want` (NULL: the graph is unchanged)
 * and compute what the input does. */
#define expect_fused(input, want) rc_expect_rewrite_at(__LINE__, "fuse_matmul_epilogue", &o1, input, want, same_results)

static void test_linear_bias_activation_residual(void) {
    /* x @ w.T + b, then relu, then + residual: one node; the product's operand positions kept */
    expect_fused("graph(%0: float32[2, 40, 64], %1: float32[96, 64], %2: float32[96], %3: float32[2, 40, 96]) {\n"
                 "  %4: float32[2, 40, 96] = linear(%0, %1, %2)\n"
                 "  %5: float32[2, 40, 96] = relu(%4)\n"
                 "  %6: float32[2, 40, 96] = add(%3, %5)\n"
                 "  return (%6)\n"
                 "}\n",
                 "graph(%0: float32[2, 40, 64], %1: float32[96, 64], %2: float32[96], %3: float32[2, 40, 96]) {\n"
                 "  %4: float32[2, 40, 96] = matmul_epilogue(%0, %1, %2, %3) {1, 3, 2, 6, -1, 0, 0, 3, 1}\n"
                 "  return (%4)\n"
                 "}\n");
    /* linear without bias; the bias added afterwards (broadcast), then gelu */
    expect_fused("graph(%0: float32[300, 64], %1: float32[96, 64], %2: float32[96]) {\n"
                 "  %3: float32[300, 96] = linear(%0, %1)\n"
                 "  %4: float32[300, 96] = add(%3, %2)\n"
                 "  %5: float32[300, 96] = gelu(%4)\n"
                 "  return (%5)\n"
                 "}\n",
                 "graph(%0: float32[300, 64], %1: float32[96, 64], %2: float32[96]) {\n"
                 "  %3: float32[300, 96] = matmul_epilogue(%0, %1, %2) {1, 2, 2, 0, 2, 0, 7, -1, 0}\n"
                 "  return (%3)\n"
                 "}\n");
}

static void test_matmul_scale_and_sums(void) {
    /* attention scores: batched q @ k^T divided by a constant; the constant stays a node */
    expect_fused("graph(%0: float64[4, 50, 16], %1: float64[4, 16, 50]) {\n"
                 "  %2: float64[] = full() {7, 0; 4}\n"
                 "  %3: float64[4, 50, 50] = matmul(%0, %1)\n"
                 "  %4: float64[4, 50, 50] = div(%3, %2)\n"
                 "  %5: float64[4, 50, 50] = softmax(%4) {2}\n"
                 "  return (%5)\n"
                 "}\n",
                 "graph(%0: float64[4, 50, 16], %1: float64[4, 16, 50]) {\n"
                 "  %2: float64[] = full() {7, 0; 4}\n"
                 "  %3: float64[4, 50, 50] = matmul_epilogue(%0, %1, %2) {0, 2, 1, 3, 2, 0}\n"
                 "  %4: float64[4, 50, 50] = softmax(%3) {2}\n"
                 "  return (%4)\n"
                 "}\n");
    /* gradient sums: mm1 + mm2 + mm3 becomes mm1's epilogue; a repeated operand is passed once;
     * the product as the second operand of sub */
    expect_fused("graph(%0: float32[30, 20], %1: float32[20, 70], %2: float32[30, 70]) {\n"
                 "  %3: float32[30, 70] = matmul(%0, %1)\n"
                 "  %4: float32[30, 70] = matmul(%0, %1)\n"
                 "  %5: float32[30, 70] = add(%3, %4)\n"
                 "  %6: float32[30, 70] = mul(%5, %2)\n"
                 "  %7: float32[30, 70] = sub(%2, %6)\n"
                 "  return (%7)\n"
                 "}\n",
                 "graph(%0: float32[30, 20], %1: float32[20, 70], %2: float32[30, 70]) {\n"
                 "  %3: float32[30, 70] = matmul(%0, %1)\n"
                 "  %4: float32[30, 70] = matmul_epilogue(%0, %1, %3, %2) {0, 2, 3, 0, 2, 0, 2, 3, 0, 1, 3, 1}\n"
                 "  return (%4)\n"
                 "}\n");
    /* matrix @ vector: the epilogue walks the vector result */
    expect_fused("graph(%0: float32[3, 60, 40], %1: float32[40], %2: float32[3, 1]) {\n"
                 "  %3: float32[3, 60] = matmul(%0, %1)\n"
                 "  %4: float32[3, 60] = maximum(%3, %2)\n"
                 "  return (%4)\n"
                 "}\n",
                 "graph(%0: float32[3, 60, 40], %1: float32[40], %2: float32[3, 1]) {\n"
                 "  %3: float32[3, 60] = matmul_epilogue(%0, %1, %2) {0, 2, 1, 4, 2, 0}\n"
                 "  return (%3)\n"
                 "}\n");
}

static void test_left_alone(void) {
    /* the product has another use (a gradient rule would need it) */
    expect_fused("graph(%0: float32[8, 16], %1: float32[16, 8]) {\n"
                 "  %2: float32[8, 8] = matmul(%0, %1)\n"
                 "  %3: float32[8, 8] = relu(%2)\n"
                 "  %4: float32[8, 8] = mul(%2, %3)\n"
                 "  return (%4)\n"
                 "}\n",
                 NULL);
    /* the product is a graph output */
    expect_fused("graph(%0: float32[8, 16], %1: float32[16, 8]) {\n"
                 "  %2: float32[8, 8] = matmul(%0, %1)\n"
                 "  %3: float32[8, 8] = tanh(%2)\n"
                 "  return (%3, %2)\n"
                 "}\n",
                 NULL);
    /* the next op broadcasts to a larger shape, changes dtype, has attributes, or is no epilogue op */
    expect_fused("graph(%0: float32[8, 16], %1: float32[16, 1], %2: float32[8, 5], %3: float64[8, 1]) {\n"
                 "  %4: float32[8, 1] = matmul(%0, %1)\n"
                 "  %5: float32[8, 5] = add(%4, %2)\n"
                 "  %6: float32[8, 1] = matmul(%0, %1)\n"
                 "  %7: float64[8, 1] = add(%6, %3)\n"
                 "  %8: float32[8, 1] = matmul(%0, %1)\n"
                 "  %9: float32[8, 1] = clamp(%8) {; -1, 1}\n"
                 "  %10: float32[8, 1] = matmul(%0, %1)\n"
                 "  %11: float32[8, 1] = exp(%10)\n"
                 "  return (%5, %7, %9, %11)\n"
                 "}\n",
                 NULL);
    /* integer products */
    expect_fused("graph(%0: int64[4, 4], %1: int64[4, 4]) {\n"
                 "  %2: int64[4, 4] = matmul(%0, %1)\n"
                 "  %3: int64[4, 4] = add(%2, %0)\n"
                 "  return (%3)\n"
                 "}\n",
                 NULL);
    /* an in-place write between the product and the next op: the chain stops before it */
    expect_fused("graph(%0: float32[6, 6], %1: float32[6, 6], %2: float32[6]) {\n"
                 "  %3: float32[6, 6] = matmul(%0, %1)\n"
                 "  %4: float32[6, 6] = slice_assign(%1, %2) {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 6, 6, 0, 0, 0, 0, 0, 0}\n"
                 "  %5: float32[6, 6] = add(%3, %1)\n"
                 "  return (%5, %4)\n"
                 "}\n",
                 NULL);
}

/* The op itself: bad attributes and operands are errors naming the op, not crashes. */
static void test_op_errors(void) {
    int64_t sa[2] = {3, 4}, sb[2] = {4, 5}, sc[1] = {6};
    kiln_tensor *a = NULL, *b = NULL, *c = NULL, *y = NULL;
    CHECK_OK(kiln_tensor_zeros(KILN_DTYPE_FLOAT32, 2, sa, &a));
    CHECK_OK(kiln_tensor_zeros(KILN_DTYPE_FLOAT32, 2, sb, &b));
    CHECK_OK(kiln_tensor_zeros(KILN_DTYPE_FLOAT32, 1, sc, &c));
    kiln_tensor *in[3] = {a, b, c};
    kiln_attrs at = {0};
    int64_t bad_shape[] = {0, 2, 1, 0, 2, 0}, bad_code[] = {0, 2, 1, 99, -1, 0}, bad_operand[] = {0, 2, 1, 0, 1, 0};
    const int64_t *cases[] = {bad_shape, bad_code, bad_operand};
    const char *msgs[] = {"cannot be broadcast", "unknown code", "bad operands"};
    for (int k = 0; k < 3; k++) {
        at.ni = 6;
        memcpy(at.i, cases[k], sizeof bad_shape);
        kiln_status s = kiln_apply(KILN_OP_MATMUL_EPILOGUE, 3, in, &at, &y);
        CHECK(s == KILN_ERR_VALUE && strstr(kiln_last_error(), "matmul_epilogue") && strstr(kiln_last_error(), msgs[k]));
        if (s == KILN_OK) kiln_tensor_release(y);
    }
    kiln_tensor_release(a), kiln_tensor_release(b), kiln_tensor_release(c);
}

int main(void) {
    test_linear_bias_activation_residual();
    test_matmul_scale_and_sums();
    test_left_alone();
    test_op_errors();
    CHECK_DONE();
}
