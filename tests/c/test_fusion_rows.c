/* Row fusion: the fusion pass on graphs with reductions over the innermost axis and the softmax
 * family, as "input text -> expected output text"; every fused graph computes what the input
 * does, through generated code (within float tolerance) and through the interpreted path
 * (bitwise); every row group the pass makes is one the C emitter handles. And O2's
 * duplicate_producers before fusion. */
#define _POSIX_C_SOURCE 200809L

#include "rewrite_check.h"
#include "codegen/codegen.h"
#include "codegen/fused.h"
#include "core/internal.h"
#include "kiln/graph.h"
#include "kiln/passes.h"

static const kiln_pass_options o1 = {KILN_LEVEL_O1, false, false, KILN_CONV_FUSE_ALL, false};

/* Outputs of a and b on the same random inputs: within tolerance (rtol < 0: bitwise). */
static int same_results(const kiln_graph *a, const kiln_graph *b, double rtol) {
    kiln_executable *ea = NULL, *eb = NULL;
    int ok = kiln_compile(a, NULL, &ea) == KILN_OK && kiln_compile(b, NULL, &eb) == KILN_OK;
    if (!ok) fprintf(stderr, "compile failed: %s\n", kiln_last_error());
    kiln_tensor *in[16] = {0}, *oa[16] = {0}, *ob[16] = {0};
    int nin = a->ninputs, nout = a->noutputs;
    if (nin > 16 || nout > 16) ok = 0;
    for (int k = 0; k < nin && ok; k++) in[k] = rc_random_tensor(&a->values[a->inputs[k]].meta);
    ok = ok && kiln_executable_run(ea, nin, in, nout, oa) == KILN_OK && kiln_executable_run(eb, nin, in, nout, ob) == KILN_OK;
    for (int k = 0; k < nout && ok; k++) {
        ok = oa[k]->numel == ob[k]->numel && oa[k]->meta.dtype == ob[k]->meta.dtype;
        size_t isz = kiln_dtype_size(oa[k]->meta.dtype);
        for (int64_t i = 0; i < oa[k]->numel && ok; i++) {
            double x = kiln_tensor_get_double(oa[k], i), y = kiln_tensor_get_double(ob[k], i);
            if (rtol < 0) ok = memcmp((char *)oa[k]->data + i * isz, (char *)ob[k]->data + i * isz, isz) == 0;
            else ok = fabs(x - y) <= rtol * (fabs(y) + 1e-3);
            if (!ok) fprintf(stderr, "  output %d element %lld: %.9g vs %.9g\n", k, (long long)i, y, x);
        }
    }
    kiln_release_all(in, nin), kiln_release_all(oa, nout), kiln_release_all(ob, nout);
    kiln_executable_free(ea), kiln_executable_free(eb);
    return ok;
}

static void set_codegen(bool on) {
    if (on) unsetenv("KILN_DISABLE_CODEGEN");
    else setenv("KILN_DISABLE_CODEGEN", "1", 1);
}

/* Runs fuse_elementwise on the parsed input; the result must print as `want` (canonical), each
 * of its groups run natively, and it must compute what the input does (natively within
 * tolerance, interpreted bitwise). */
static int fused_same(const kiln_graph *orig, const kiln_graph *g) {
    int ok = 1;
    bool compiler = kiln_codegen_available();
    for (int32_t k = 0; k < g->nsubgraphs && compiler; k++) {
        kiln_fused_kernel *fk = NULL;
        CHECK_OK(kiln_fused_prepare(g->subgraphs[k], &fk));
        if (!kiln_fused_is_native(fk)) {
            fprintf(stderr, "  group %d runs interpreted\n", k);
            ok = 0;
        }
        kiln_fused_free(fk);
    }
    bool f64 = g->ninputs > 0 && g->values[g->inputs[0]].meta.dtype == KILN_DTYPE_FLOAT64;
    if (!same_results(orig, g, f64 ? 1e-12 : 2e-5)) {
        fprintf(stderr, "  the generated kernels compute something else\n");
        ok = 0;
    }
    set_codegen(false);
    if (!same_results(orig, g, -1)) {
        fprintf(stderr, "  the interpreted groups differ from the unfused graph\n");
        ok = 0;
    }
    set_codegen(true);
    return ok;
}

#define expect_fused(input, want) rc_expect_rewrite_at(__LINE__, "fuse_elementwise", &o1, input, want, fused_same)
#define expect_passes(passes, input, want) rc_expect_rewrite_at(__LINE__, passes, &o1, input, want, fused_same)

/* softmax written out: (x + b) - max, exp, sum, divide: one group. */
static void test_softmax_written_out(void) {
    expect_fused("graph(%0: float32[6, 40], %1: float32[40]) {\n"
                 "  %2: float32[6, 40] = add(%0, %1)\n"
                 "  %3: float32[6, 1] = max(%2) {2, 1}\n"
                 "  %4: float32[6, 40] = sub(%2, %3)\n"
                 "  %5: float32[6, 40] = exp(%4)\n"
                 "  %6: float32[6, 1] = sum(%5) {2, 1}\n"
                 "  %7: float32[6, 40] = div(%5, %6)\n"
                 "  return (%7)\n"
                 "}\n",
                 "graph(%0: float32[6, 40], %1: float32[40]) {\n"
                 "  %2: float32[6, 40] = fused(%0, %1) {0, 6, 2, 6, 40}\n"
                 "  return (%2)\n"
                 "}\n"
                 "subgraph 0: graph(%0: float32[6, 40], %1: float32[40]) {\n"
                 "  %2: float32[6, 40] = add(%0, %1)\n"
                 "  %3: float32[6, 1] = max(%2) {2, 1}\n"
                 "  %4: float32[6, 40] = sub(%2, %3)\n"
                 "  %5: float32[6, 40] = exp(%4)\n"
                 "  %6: float32[6, 1] = sum(%5) {2, 1}\n"
                 "  %7: float32[6, 40] = div(%5, %6)\n"
                 "  return (%7)\n"
                 "}\n");
}

/* attention's scores: a scale, then the softmax op; and its backward with the scale after */
static void test_scaled_softmax(void) {
    expect_fused("graph(%0: float32[2, 3, 33], %1: float32[2, 3, 33]) {\n"
                 "  %2: float32[] = constant(8)\n"
                 "  %3: float32[2, 3, 33] = div(%0, %2)\n"
                 "  %4: float32[2, 3, 33] = softmax(%3) {2}\n"
                 "  %5: float32[2, 3, 33] = softmax_backward(%1, %4) {2}\n"
                 "  %6: float32[2, 3, 33] = div(%5, %2)\n"
                 "  return (%4, %6)\n"
                 "}\n",
                 "graph(%0: float32[2, 3, 33], %1: float32[2, 3, 33]) {\n"
                 "  %2: float32[] = constant(8)\n"
                 "  %3: float32[2, 3, 33] = fused(%0, %2) {0, 6, 3, 2, 3, 33}\n"
                 "  %4: float32[2, 3, 33] = fused(%1, %3, %2) {1, 6, 3, 2, 3, 33}\n"
                 "  return (%3, %4)\n"
                 "}\n"
                 "subgraph 0: graph(%0: float32[2, 3, 33], %1: float32[]) {\n"
                 "  %2: float32[2, 3, 33] = div(%0, %1)\n"
                 "  %3: float32[2, 3, 33] = softmax(%2) {2}\n"
                 "  return (%3)\n"
                 "}\n"
                 "subgraph 1: graph(%0: float32[2, 3, 33], %1: float32[2, 3, 33], %2: float32[]) {\n"
                 "  %3: float32[2, 3, 33] = softmax_backward(%0, %1) {2}\n"
                 "  %4: float32[2, 3, 33] = div(%3, %2)\n"
                 "  return (%4)\n"
                 "}\n");
}

/* rms norm: the group starts at the last multiply (one value per row below it) and grows into
 * the rows of the mean; float64; log_softmax with a prologue */
static void test_norms(void) {
    expect_fused("graph(%0: float64[4, 5, 64], %1: float64[64]) {\n"
                 "  %2: float64[4, 5, 64] = mul(%0, %0)\n"
                 "  %3: float64[4, 5, 1] = mean(%2) {4, 1}\n"
                 "  %4: float64[] = constant(1e-06)\n"
                 "  %5: float64[4, 5, 1] = add(%3, %4)\n"
                 "  %6: float64[4, 5, 1] = rsqrt(%5)\n"
                 "  %7: float64[4, 5, 64] = mul(%0, %6)\n"
                 "  %8: float64[4, 5, 64] = mul(%7, %1)\n"
                 "  return (%8)\n"
                 "}\n",
                 "graph(%0: float64[4, 5, 64], %1: float64[64]) {\n"
                 "  %2: float64[] = constant(1e-06)\n"
                 "  %3: float64[4, 5, 64] = fused(%0, %2, %1) {0, 7, 3, 4, 5, 64}\n"
                 "  return (%3)\n"
                 "}\n"
                 "subgraph 0: graph(%0: float64[4, 5, 64], %1: float64[], %2: float64[64]) {\n"
                 "  %3: float64[4, 5, 64] = mul(%0, %0)\n"
                 "  %4: float64[4, 5, 1] = mean(%3) {4, 1}\n"
                 "  %5: float64[4, 5, 1] = add(%4, %1)\n"
                 "  %6: float64[4, 5, 1] = rsqrt(%5)\n"
                 "  %7: float64[4, 5, 64] = mul(%0, %6)\n"
                 "  %8: float64[4, 5, 64] = mul(%7, %2)\n"
                 "  return (%8)\n"
                 "}\n");
    expect_fused("graph(%0: float32[3, 300]) {\n"
                 "  %1: float32[3, 300] = tanh(%0)\n"
                 "  %2: float32[3, 300] = log_softmax(%1) {1}\n"
                 "  %3: float32[3, 300] = log_softmax_backward(%0, %2) {1}\n"
                 "  return (%3)\n"
                 "}\n",
                 "graph(%0: float32[3, 300]) {\n"
                 "  %1: float32[3, 300] = fused(%0) {0, 6, 2, 3, 300}\n"
                 "  return (%1)\n"
                 "}\n"
                 "subgraph 0: graph(%0: float32[3, 300]) {\n"
                 "  %1: float32[3, 300] = tanh(%0)\n"
                 "  %2: float32[3, 300] = log_softmax(%1) {1}\n"
                 "  %3: float32[3, 300] = log_softmax_backward(%0, %2) {1}\n"
                 "  return (%3)\n"
                 "}\n");
}

/* Where row fusion stops: a reduction over another axis; a reduction that drops its axis (it
 * ends a group: its result cannot broadcast back along rows); a row op whose rows are not the
 * group's (the reduced value broadcasts into a larger space); min. */
static void test_boundaries(void) {
    expect_fused("graph(%0: float32[4, 8], %1: float32[3, 4, 8]) {\n"
                 "  %2: float32[4, 8] = exp(%0)\n"
                 "  %3: float32[1, 8] = sum(%2) {1, 1}\n"
                 "  %4: float32[4, 8] = mul(%0, %3)\n"
                 "  %5: float32[4] = min(%4) {2, 0}\n"
                 "  %6: float32[4, 1] = max(%0) {2, 1}\n"
                 "  %7: float32[3, 4, 8] = sub(%1, %6)\n"
                 "  %8: float32[3, 4, 8] = exp(%7)\n"
                 "  return (%5, %8)\n"
                 "}\n",
                 "graph(%0: float32[4, 8], %1: float32[3, 4, 8]) {\n"
                 "  %2: float32[4, 8] = exp(%0)\n"
                 "  %3: float32[1, 8] = sum(%2) {1, 1}\n"
                 "  %4: float32[4] = fused(%0, %3) {0, 6, 1, 4}\n"
                 "  %5: float32[4, 1] = max(%0) {2, 1}\n"
                 "  %6: float32[3, 4, 8] = fused(%1, %5) {1, 6, 3, 3, 4, 8}\n"
                 "  return (%4, %6)\n"
                 "}\n"
                 "subgraph 0: graph(%0: float32[4, 8], %1: float32[1, 8]) {\n"
                 "  %2: float32[4, 8] = mul(%0, %1)\n"
                 "  %3: float32[4] = min(%2) {2, 0}\n"
                 "  return (%3)\n"
                 "}\n"
                 "subgraph 1: graph(%0: float32[3, 4, 8], %1: float32[4, 1]) {\n"
                 "  %2: float32[3, 4, 8] = sub(%0, %1)\n"
                 "  %3: float32[3, 4, 8] = exp(%2)\n"
                 "  return (%3)\n"
                 "}\n");
}

/* O2: a cheap producer read by two kernels is computed in each (a chain of them too: the scale
 * read only by the shift); an exp is not copied (a math-library call), nor a producer read by a
 * matmul, nor one that is a graph output. */
static void test_duplicate_producers(void) {
    expect_passes("duplicate_producers,fuse_elementwise",
                  "graph(%0: float32[4, 8], %1: float32[4, 8], %2: float32[8, 8]) {\n"
                  "  %3: float32[] = constant(2)\n"
                  "  %4: float32[4, 8] = mul(%0, %3)\n"
                  "  %5: float32[4, 8] = add(%4, %3)\n"
                  "  %6: float32[4, 8] = tanh(%5)\n"
                  "  %7: float32[4, 8] = mul(%6, %1)\n"
                  "  %8: float32[4, 8] = softmax(%5) {1}\n"
                  "  %9: float32[4, 8] = exp(%1)\n"
                  "  %10: float32[4, 8] = add(%9, %7)\n"
                  "  %11: float32[4, 8] = sub(%9, %8)\n"
                  "  %12: float32[4, 8] = neg(%1)\n"
                  "  %13: float32[4, 8] = matmul(%12, %2)\n"
                  "  %14: float32[4, 8] = sigmoid(%12)\n"
                  "  %15: float32[4, 8] = add(%14, %13)\n"
                  "  return (%10, %11, %15)\n"
                  "}\n",
                  "graph(%0: float32[4, 8], %1: float32[4, 8], %2: float32[8, 8]) {\n"
                  "  %3: float32[] = constant(2)\n"
                  "  %4: float32[4, 8] = exp(%1)\n"
                  "  %5: float32[4, 8] = fused(%0, %3, %1, %4) {0, 6, 2, 4, 8}\n"
                  "  %6: float32[4, 8] = fused(%0, %3, %4) {1, 6, 2, 4, 8}\n"
                  "  %7: float32[4, 8] = neg(%1)\n"
                  "  %8: float32[4, 8] = matmul(%7, %2)\n"
                  "  %9: float32[4, 8] = fused(%7, %8) {2, 6, 2, 4, 8}\n"
                  "  return (%5, %6, %9)\n"
                  "}\n"
                  "subgraph 0: graph(%0: float32[4, 8], %1: float32[], %2: float32[4, 8], %3: float32[4, 8]) {\n"
                  "  %4: float32[4, 8] = mul(%0, %1)\n"
                  "  %5: float32[4, 8] = add(%4, %1)\n"
                  "  %6: float32[4, 8] = tanh(%5)\n"
                  "  %7: float32[4, 8] = mul(%6, %2)\n"
                  "  %8: float32[4, 8] = add(%3, %7)\n"
                  "  return (%8)\n"
                  "}\n"
                  "subgraph 1: graph(%0: float32[4, 8], %1: float32[], %2: float32[4, 8]) {\n"
                  "  %3: float32[4, 8] = mul(%0, %1)\n"
                  "  %4: float32[4, 8] = add(%3, %1)\n"
                  "  %5: float32[4, 8] = softmax(%4) {1}\n"
                  "  %6: float32[4, 8] = sub(%2, %5)\n"
                  "  return (%6)\n"
                  "}\n"
                  "subgraph 2: graph(%0: float32[4, 8], %1: float32[4, 8]) {\n"
                  "  %2: float32[4, 8] = sigmoid(%0)\n"
                  "  %3: float32[4, 8] = add(%2, %1)\n"
                  "  return (%3)\n"
                  "}\n");
}

/* Subgraphs the pass does not make but a graph text can hold: the emitter declines them (they
 * run interpreted). */
static void test_emitter_declines(void) {
    static const char *const texts[] = {
        /* the output is not the space nor one value per row */
        "graph(%0: float32[4, 8], %1: float32[8]) {\n"
        "  %2: float32[4, 1] = max(%0) {2, 1}\n"
        "  %3: float32[8] = add(%1, %1)\n"
        "  return (%3)\n"
        "}\n",
        /* a reduction over another axis */
        "graph(%0: float32[4, 8]) {\n"
        "  %1: float32[1, 8] = sum(%0) {1, 1}\n"
        "  %2: float32[4, 8] = sub(%0, %1)\n"
        "  return (%2)\n"
        "}\n",
        /* a reduction dropping its axis inside the group */
        "graph(%0: float32[4, 8]) {\n"
        "  %1: float32[4] = sum(%0) {2, 0}\n"
        "  %2: float32[4] = exp(%1)\n"
        "  return (%2)\n"
        "}\n",
        /* rows of two different lengths */
        "graph(%0: float32[4, 8], %1: float32[4, 1, 3]) {\n"
        "  %2: float32[4, 1] = max(%0) {2, 1}\n"
        "  %3: float32[4, 4, 3] = add(%1, %2)\n"
        "  %4: float32[4, 4, 1] = sum(%3) {4, 1}\n"
        "  return (%4)\n"
        "}\n",
    };
    for (size_t k = 0; k < sizeof texts / sizeof texts[0]; k++) {
        kiln_graph *g = NULL;
        CHECK_OK(kiln_graph_parse(texts[k], &g));
        if (!g) continue;
        CHECK(!kiln_codegen_supports(g));
        kiln_fused_kernel *fk = NULL;
        CHECK_OK(kiln_fused_prepare(g, &fk));
        CHECK(fk && !kiln_fused_is_native(fk));
        kiln_fused_free(fk);
        kiln_graph_free(g);
    }
}

int main(void) {
    test_softmax_written_out();
    test_scaled_softmax();
    test_norms();
    test_boundaries();
    test_duplicate_producers();
    test_emitter_declines();
    CHECK_DONE();
}
