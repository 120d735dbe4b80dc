/* Backends by name (src/runtime/backends.def): the registry lists them, an unknown name is refused
 * naming the registered ones, and the reference backend (src/runtime/reference/: each node's op
 * table kernel, fused groups node by node) gives what kbk and the sink give on the same plan: a
 * fused group, an if, a while (its iteration composed and run into buffers), a view returned. */
#include "check.h"
#include "sample_graphs.h"
#include "core/internal.h"

static kiln_graph *parse(const char *text) {
    kiln_graph *g = NULL;
    if (kiln_graph_parse(text, &g) != KILN_OK) {
        fprintf(stderr, "parse: %s\n", kiln_last_error());
        exit(2);
    }
    return g;
}

static kiln_tensor *ramp(int ndim, const int64_t *shape, float base) {
    kiln_tensor *t = tensor_f32(ndim, shape, NULL);
    for (int64_t i = 0; i < t->numel; i++) ((float *)t->data)[i] = base + 0.25f * (float)(i % 13) - 0.01f * (float)i;
    return t;
}

static kiln_tensor *scalar(float v) { return tensor_f32(0, NULL, &v); }

static void test_names(void) {
    CHECK(strcmp(kiln_backend_names(), "kbk, sink, reference") == 0);
    CHECK(kiln_backend_count() == 3);
    CHECK(strcmp(kiln_backend_name_at(2), "reference") == 0 && kiln_backend_name_at(3) == NULL);
    kiln_graph *g = parse(SAMPLE_ABC);
    kiln_executable *e = NULL;
    CHECK_STATUS(kiln_compile(g, &(kiln_compile_options){.backend = "nope"}, &e), KILN_ERR_VALUE);
    CHECK(e == NULL);
    CHECK(strstr(kiln_last_error(), "unknown backend 'nope'") &&
          strstr(kiln_last_error(), "registered backends: kbk, sink, reference"));
    const char *names[] = {NULL, "kbk", "sink", "reference"}, *want[] = {"kbk", "kbk", "sink", "reference"};
    for (int k = 0; k < 4; k++) { /* NULL is kbk */
        CHECK_OK(kiln_compile(g, &(kiln_compile_options){.backend = names[k]}, &e));
        if (e) CHECK(strcmp(kiln_executable_backend(e), want[k]) == 0);
        kiln_executable_free(e);
        e = NULL;
    }
    kiln_graph_free(g);
}

/* g (optimized at level) compiled for every backend and run on in[]: each output within tol of kbk's,
 * over two calls; every backend's plan prints the same (the plan does not depend on who runs it). */
static void compare(const char *text, kiln_jit_level level, const char *must_have, int nin, kiln_tensor **in, float tol) {
    kiln_graph *g = parse(text);
    kiln_pass_options popt = {level, false, false, KILN_CONV_FUSE_ALL, false};
    CHECK_OK(kiln_optimize(&g, &popt));
    char *gtext = kiln_graph_to_string(g);
    CHECK(gtext && strstr(gtext, must_have));
    free(gtext);
    const char *backends[] = {"kbk", "sink", "reference"};
    kiln_executable *e[3] = {0};
    for (int b = 0; b < 3; b++) CHECK_OK(kiln_compile(g, &(kiln_compile_options){.backend = backends[b]}, &e[b]));
    if (!e[0] || !e[1] || !e[2]) goto done;
    char *plan0 = kiln_executable_plan_string(e[0]);
    for (int b = 1; b < 3; b++) {
        char *plan = kiln_executable_plan_string(e[b]);
        CHECK(plan0 && plan && strcmp(plan0, plan) == 0);
        free(plan);
    }
    free(plan0);
    int nout = kiln_executable_num_outputs(e[0]);
    for (int call = 0; call < 2; call++) {
        kiln_tensor *out[3][4] = {{0}};
        for (int b = 0; b < 3; b++) CHECK_OK(kiln_executable_run(e[b], nin, in, nout, out[b]));
        for (int b = 1; b < 3; b++)
            for (int k = 0; k < nout; k++) {
                kiln_tensor *got = NULL, *want = NULL;
                if (out[b][k] && out[0][k]) {
                    CHECK_OK(kiln_to_contiguous(out[b][k], KILN_DTYPE_FLOAT32, &got));
                    CHECK_OK(kiln_to_contiguous(out[0][k], KILN_DTYPE_FLOAT32, &want));
                }
                if (!same_values_f32(got, want, tol)) {
                    fprintf(stderr, "  %s, output %d differs from kbk's\n", backends[b], k);
                    CHECK(false);
                }
                kiln_tensor_release(got), kiln_tensor_release(want);
            }
        for (int b = 0; b < 3; b++) kiln_release_all(out[b], nout);
    }
done:
    for (int b = 0; b < 3; b++) kiln_executable_free(e[b]);
    kiln_graph_free(g);
}

static void test_fused_group(void) {
    int64_t s0[2] = {64, 33}, s1[1] = {33}, s2[2] = {64, 1};
    kiln_tensor *in[3] = {ramp(2, s0, -1.0f), ramp(1, s1, 0.5f), ramp(2, s2, 0.1f)};
    compare("graph(%0: float32[64, 33], %1: float32[33], %2: float32[64, 1]) {\n"
            "  %3: float32[64, 33] = mul(%0, %1)\n"
            "  %4: float32[64, 33] = add(%3, %2)\n"
            "  %5: float32[64, 33] = gelu(%4)\n"
            "  %6: float32[64] = sum(%5) {2, 0}\n"
            "  %7: float32[64] = tanh(%6)\n"
            "  %8: float32[33, 64] = permute(%5) {1, 0}\n"
            "  return (%7, %5, %8)\n"
            "}\n",
            KILN_LEVEL_O1, "= fused(", 3, in, 1e-5f);
    kiln_release_all(in, 3);
}

static void test_if_and_while(void) {
    static const char *branch = /* x * 2 when sum(x) < 10, else x + 1 */
        "graph(%0: float32[3]) {\n"
        "  %1: float32[] = constant(10)\n"
        "  %2: float32[] = sum(%0) {1, 0}\n"
        "  %3: bool[] = lt(%2, %1)\n"
        "  %4: float32[3] = if(%3, %0) {0, 1, 1}\n"
        "  return (%4)\n"
        "}\n"
        "subgraph 0: graph(%0: float32[3]) {\n"
        "  %1: float32[] = constant(2)\n"
        "  %2: float32[3] = mul(%0, %1)\n"
        "  return (%2)\n"
        "}\n"
        "subgraph 1: graph(%0: float32[3]) {\n"
        "  %1: float32[] = constant(1)\n"
        "  %2: float32[3] = add(%0, %1)\n"
        "  return (%2)\n"
        "}\n";
    int64_t three[1] = {3};
    float small[3] = {1, 2, 3}, large[3] = {4, 5, 6};
    kiln_tensor *a = tensor_f32(1, three, small), *b = tensor_f32(1, three, large);
    compare(branch, KILN_LEVEL_O0, "= if(", 1, &a, 0.0f);
    compare(branch, KILN_LEVEL_O0, "= if(", 1, &b, 0.0f);
    kiln_tensor *loop[2] = {scalar(0.5f), scalar(7.0f)};
    compare(SAMPLE_COUNTING_LOOP, KILN_LEVEL_O0, "= while(", 2, loop, 0.0f);
    /* and the value itself: 0.5 counts up to 7.5 */
    kiln_graph *g = parse(SAMPLE_COUNTING_LOOP);
    kiln_executable *e = NULL;
    kiln_tensor *out = NULL;
    CHECK_OK(kiln_compile(g, &(kiln_compile_options){.backend = "reference"}, &e));
    if (e) CHECK_OK(kiln_executable_run(e, 2, loop, 1, &out));
    CHECK(out && kiln_tensor_get_double(out, 0) == 7.5);
    kiln_tensor_release(out), kiln_executable_free(e), kiln_graph_free(g);
    kiln_release_all(loop, 2);
    kiln_tensor_release(a), kiln_tensor_release(b);
}

int main(void) {
    test_names();
    test_fused_group();
    test_if_and_while();
    CHECK_DONE();
}
