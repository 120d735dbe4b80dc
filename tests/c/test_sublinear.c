/* Recomputation and its checkpoint search on a forward chain whose values a backward-like chain
 * reads in reverse: the rewritten graph must verify, plan the peak the search reported, lower it,
 * and compute bitwise the same outputs; the search must not depend on the worker count; lb_memory
 * at or above the peak leaves the graph alone; Cell.recompute marks are honoured; bad settings are
 * errors. Run under ASan/UBSan in CI (the search runs on several threads). */
#include "check.h"
#include "core/internal.h"

#define LAYERS 8

/* x -> (matmul, tanh) x LAYERS, then g = t8*t8, g = g*t_k, g = g*m_k down to the first layer */
static kiln_graph *chain(void) {
    char text[8192];
    int n = 0, v = LAYERS + 1;
    n += snprintf(text + n, sizeof text - (size_t)n, "graph(%%0: float32[8, 16]");
    for (int k = 1; k <= LAYERS; k++) n += snprintf(text + n, sizeof text - (size_t)n, ", %%%d: float32[16, 16]", k);
    n += snprintf(text + n, sizeof text - (size_t)n, ") {\n");
    int m[LAYERS], t[LAYERS], prev = 0;
    for (int k = 0; k < LAYERS; k++) {
        m[k] = v++, t[k] = v++;
        n += snprintf(text + n, sizeof text - (size_t)n, "  %%%d: float32[8, 16] = matmul(%%%d, %%%d)\n", m[k], prev, k + 1);
        n += snprintf(text + n, sizeof text - (size_t)n, "  %%%d: float32[8, 16] = tanh(%%%d)\n", t[k], m[k]);
        prev = t[k];
    }
    int g = v++;
    n += snprintf(text + n, sizeof text - (size_t)n, "  %%%d: float32[8, 16] = mul(%%%d, %%%d)\n", g, prev, prev);
    for (int k = LAYERS - 1; k >= 0; k--) {
        int a = v++, b = v++;
        n += snprintf(text + n, sizeof text - (size_t)n, "  %%%d: float32[8, 16] = mul(%%%d, %%%d)\n", a, g, t[k]);
        n += snprintf(text + n, sizeof text - (size_t)n, "  %%%d: float32[8, 16] = mul(%%%d, %%%d)\n", b, a, m[k]);
        g = b;
    }
    snprintf(text + n, sizeof text - (size_t)n, "  return (%%%d)\n}\n", g);
    kiln_graph *out = NULL;
    CHECK_OK(kiln_graph_parse(text, &out));
    return out;
}

static kiln_tensor *run(const kiln_graph *g) {
    kiln_tensor *in[LAYERS + 1], *out = NULL;
    int64_t xs[2] = {8, 16}, ws[2] = {16, 16};
    for (int k = 0; k <= LAYERS; k++) {
        in[k] = tensor_f32(2, k ? ws : xs, NULL);
        for (int64_t i = 0; i < in[k]->numel; i++) ((float *)in[k]->data)[i] = 0.3f * (float)((i * 7 + k) % 11) / 11.0f - 0.1f;
    }
    kiln_executable *e = NULL;
    kiln_compile_options opt = {KILN_ORDER_BFS, false, "kbk"};
    CHECK_OK(kiln_compile(g, &opt, &e));
    if (e) CHECK_OK(kiln_executable_run(e, LAYERS + 1, in, 1, &out));
    kiln_executable_free(e);
    for (int k = 0; k <= LAYERS; k++) kiln_tensor_release(in[k]);
    return out;
}

static bool same(kiln_tensor *a, kiln_tensor *b) {
    return a && b && a->numel == b->numel && memcmp(a->data, b->data, sizeof(float) * (size_t)a->numel) == 0;
}

static char *searched(int workers, kiln_sublinear_report *rep) {
    kiln_graph *g = chain();
    kiln_sublinear_config cfg = {10, 3, 6, 0, workers, 7};
    CHECK_OK(kiln_sublinear_optimize(&g, KILN_ORDER_BFS, &cfg, rep));
    char *text = kiln_graph_to_string(g);
    kiln_graph_free(g);
    return text;
}

static void test_search(void) {
    kiln_graph *g = chain();
    kiln_tensor *want = run(g);
    kiln_graph *s = NULL;
    CHECK_OK(kiln_graph_clone(g, &s));
    kiln_sublinear_config cfg = {10, 3, 6, 0, 2, 7};
    kiln_sublinear_report rep;
    CHECK_OK(kiln_sublinear_optimize(&s, KILN_ORDER_BFS, &cfg, &rep));
    CHECK(rep.recomputed_ops > 0 && rep.extra_flops > 0 && rep.candidates > 10);
    CHECK(rep.peak_after < rep.peak_before && rep.peak_after <= rep.peak_greedy);
    CHECK(s->nnodes == g->nnodes + rep.recomputed_ops);
    CHECK_OK(kiln_graph_verify(s));
    size_t peak = 0;
    CHECK_OK(kiln_plan_arena_bytes(s, KILN_ORDER_BFS, &peak));
    CHECK(peak == rep.peak_after);
    kiln_tensor *got = run(s);
    CHECK(same(got, want));
    kiln_tensor_release(got);
    /* the same plan from one worker and from three */
    kiln_sublinear_report r1, r3;
    char *t1 = searched(1, &r1), *t3 = searched(3, &r3);
    CHECK(t1 && t3 && strcmp(t1, t3) == 0 && r1.peak_after == r3.peak_after && r1.candidates == r3.candidates);
    free(t1), free(t3);
    /* lb_memory at the peak: nothing changes */
    kiln_graph *kept = g;
    kiln_sublinear_config lb = {10, 0, 6, (int64_t)rep.peak_before, 2, 7};
    CHECK_OK(kiln_sublinear_optimize(&g, KILN_ORDER_BFS, &lb, &rep));
    CHECK(g == kept && rep.recomputed_ops == 0 && rep.peak_after == rep.peak_before);
    /* bad settings */
    kiln_sublinear_config bad = {10, 0, 6, 0, 0, 7};
    CHECK_STATUS(kiln_sublinear_optimize(&g, KILN_ORDER_BFS, &bad, &rep), KILN_ERR_VALUE);
    kiln_tensor_release(want);
    kiln_graph_free(g), kiln_graph_free(s);
}

static void test_marked(void) {
    kiln_graph *g = chain(), *out = NULL;
    kiln_tensor *want = run(g);
    kiln_recompute_stats st;
    CHECK_OK(kiln_recompute_marked(g, &out, &st));
    CHECK(out == NULL && st.recomputed_ops == 0); /* nothing marked */
    for (int32_t i = 0; i < 2 * LAYERS; i++) g->nodes[i].recompute = i / 4 + 1; /* two layers a call */
    CHECK_OK(kiln_recompute_marked(g, &out, &st));
    CHECK(out && st.recomputed_ops == LAYERS / 2 * 3); /* each call: all but its last node */
    if (out) {
        CHECK_OK(kiln_graph_verify(out));
        size_t before = 0, after = 0;
        CHECK_OK(kiln_plan_arena_bytes(g, KILN_ORDER_BFS, &before));
        CHECK_OK(kiln_plan_arena_bytes(out, KILN_ORDER_BFS, &after));
        CHECK(after < before);
        kiln_tensor *got = run(out);
        CHECK(same(got, want));
        kiln_tensor_release(got);
    }
    /* no in-place updates: nothing to move */
    kiln_graph *hoisted = NULL;
    CHECK_OK(kiln_hoist_updates(g, &hoisted));
    CHECK(hoisted == NULL);
    kiln_tensor_release(want);
    kiln_graph_free(g), kiln_graph_free(out);
}

/* the work recomputation counts (the op table's footprints): 2*M*N*K for a product (and one more
 * per result for a bias), an operation per element for elementwise ops, nothing for views */
static void test_flops(void) {
    kiln_graph *g = NULL;
    CHECK_OK(kiln_graph_parse("graph(%0: float32[8, 16], %1: float32[32, 16], %2: float32[32]) {\n"
                              "  %3: float32[8, 32] = linear(%0, %1, %2)\n"
                              "  %4: float32[8, 32] = mul(%3, %3)\n"
                              "  %5: float32[32, 8] = permute(%4) {1, 0}\n"
                              "  %6: float32[32, 32] = matmul(%5, %4)\n"
                              "  return (%6)\n}\n",
                              &g));
    if (!g) return;
    CHECK(kiln_node_flops(g, 0) == (2 * 16 + 1) * 8 * 32);
    CHECK(kiln_node_flops(g, 1) == 8 * 32);
    CHECK(kiln_node_flops(g, 2) == 0);
    CHECK(kiln_node_flops(g, 3) == 2 * 32 * 8 * 32);
    kiln_graph_free(g);
}

int main(void) {
    test_flops();
    test_search();
    test_marked();
    CHECK_DONE();
}
