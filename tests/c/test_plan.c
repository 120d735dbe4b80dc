/* The plan as data (src/plan/): its text form for a few graphs at O0 and O1, breadth- and
 * depth-first (order, arena offsets, last uses, frees, fused groups, nested plans of a loop),
 * and both backends running one plan. */
#include "check.h"
#include "plan/plan.h"

static kiln_graph *parse(const char *text) {
    kiln_graph *g = NULL;
    if (kiln_graph_parse(text, &g) != KILN_OK) {
        fprintf(stderr, "parse: %s\n", kiln_last_error());
        exit(2);
    }
    return g;
}

/* The plan of text (optimized at `level` first), compared with want. */
static void check_plan(const char *text, kiln_jit_level level, kiln_exec_order order, const char *want) {
    kiln_graph *g = parse(text);
    kiln_pass_options popt = {level, false, false, KILN_CONV_FUSE_ALL, false};
    CHECK_OK(kiln_optimize(&g, &popt));
    kiln_compile_options opt = {order, false, "kbk"};
    kiln_plan *p = NULL;
    CHECK_OK(kiln_plan_build(g, &opt, &p));
    char *got = p ? kiln_plan_to_string(p) : NULL;
    if (got && strcmp(got, want) != 0) {
        fprintf(stderr, "plan differs at O%d %s:\n--- got\n%s--- want\n%s", (int)level,
                order == KILN_ORDER_DFS ? "dfs" : "bfs", got, want);
        CHECK(0);
    }
    free(got);
    kiln_plan_free(p);
    kiln_graph_free(g);
}

/* two chains of float32[4] (16 bytes each), traced breadth-first: a = x*y, b = x+y, c = exp(a),
 * d = exp(b), out = c - d */
static const char *two_chains =
    "graph(%0: float32[4], %1: float32[4]) {\n"
    "  %2: float32[4] = mul(%0, %1)\n"
    "  %3: float32[4] = add(%0, %1)\n"
    "  %4: float32[4] = exp(%2)\n"
    "  %5: float32[4] = exp(%3)\n"
    "  %6: float32[4] = sub(%4, %5)\n"
    "  return (%6)\n"
    "}\n";

static void test_two_chains(void) {
    /* breadth-first: both products live at once; exp writes in place into its dying input */
    check_plan(two_chains, KILN_LEVEL_O0, KILN_ORDER_BFS,
               "plan: 5 steps, arena 128 bytes, outputs 16 bytes\n"
               "  0: %2 = mul(%0, %1)  %2 @0 16B last 2\n"
               "  1: %3 = add(%0, %1)  %3 @64 16B last 3\n"
               "  2: %4 = exp(%2)  %4 @0 16B last 4\n"
               "  3: %5 = exp(%3)  %5 @64 16B last 4\n"
               "  4: %6 = sub(%4, %5)  %6 output  frees %4 %5\n");
    /* depth-first: each chain is finished before the next starts */
    check_plan(two_chains, KILN_LEVEL_O0, KILN_ORDER_DFS,
               "plan: 5 steps, arena 128 bytes, outputs 16 bytes\n"
               "  0: %2 = mul(%0, %1)  %2 @0 16B last 1\n"
               "  1: %4 = exp(%2)  %4 @0 16B last 4\n"
               "  2: %3 = add(%0, %1)  %3 @64 16B last 3\n"
               "  3: %5 = exp(%3)  %5 @64 16B last 4\n"
               "  4: %6 = sub(%4, %5)  %6 output  frees %4 %5\n");
    /* O1 fuses the whole elementwise graph into one group: nothing left to plan */
    check_plan(two_chains, KILN_LEVEL_O1, KILN_ORDER_BFS,
               "plan: 1 steps, arena 0 bytes, outputs 16 bytes\n"
               "  0: %2 = fused(%0, %1) {subgraph 0}  %2 output\n");
}

/* x doubles while sum(x) < limit: the loop's cond, body and composed iteration are nested plans */
static const char *doubling_loop =
    "graph(%0: float32[3], %1: float32[]) {\n"
    "  %2: float32[3] = while(%0, %1) {0, 1, 1}\n"
    "  return (%2)\n"
    "}\n"
    "subgraph 0: graph(%0: float32[3], %1: float32[]) {\n"
    "  %2: float32[] = sum(%0) {1, 0}\n"
    "  %3: bool[] = lt(%2, %1)\n"
    "  return (%3)\n"
    "}\n"
    "subgraph 1: graph(%0: float32[3], %1: float32[]) {\n"
    "  %2: float32[] = constant(2)\n"
    "  %3: float32[3] = mul(%0, %2)\n"
    "  return (%3)\n"
    "}\n";

static void test_loop_bodies(void) {
    check_plan(doubling_loop, KILN_LEVEL_O0, KILN_ORDER_BFS,
               "plan: 1 steps, arena 0 bytes, outputs 12 bytes\n"
               "  0: %2 = while(%0, %1)  %2 output\n"
               "    cond:\n"
               "      plan: 2 steps, arena 64 bytes, outputs 1 bytes\n"
               "        0: %2 = sum(%0)  %2 @0 4B last 1\n"
               "        1: %3 = lt(%2, %1)  %3 output  frees %2\n"
               "    body:\n"
               "      plan: 1 steps, arena 0 bytes, outputs 12 bytes\n"
               "        0: %3 = mul(%0, %2)  %3 output\n"
               "    step:\n"
               "      plan: 3 steps, arena 64 bytes, outputs 13 bytes\n"
               "        0: %3 = mul(%0, %2)  %3 output\n"
               "        1: %4 = sum(%3)  %4 @0 4B last 2\n"
               "        2: %5 = lt(%4, %1)  %5 output  frees %4\n");
}

/* the same plan run by both backends gives the same results */
static void test_backends_share_a_plan(void) {
    kiln_graph *g = parse(two_chains);
    kiln_executable *k = NULL, *s = NULL;
    CHECK_OK(kiln_compile(g, &(kiln_compile_options){KILN_ORDER_DFS, true, "kbk"}, &k));
    CHECK_OK(kiln_compile(g, &(kiln_compile_options){KILN_ORDER_DFS, true, "sink"}, &s));
    CHECK(k && s && strcmp(kiln_executable_backend(k), "kbk") == 0 && strcmp(kiln_executable_backend(s), "sink") == 0);
    char *pk = k ? kiln_executable_plan_string(k) : NULL, *ps = s ? kiln_executable_plan_string(s) : NULL;
    CHECK(pk && ps && strcmp(pk, ps) == 0);
    free(pk), free(ps);
    int64_t n = 4;
    kiln_tensor *x = tensor_f32(1, &n, (float[]){1, 2, 3, 4}), *y = tensor_f32(1, &n, (float[]){-1, 0, 0.5f, 2});
    for (int run = 0; run < 2 && k && s; run++) {
        kiln_tensor *a = NULL, *b = NULL;
        CHECK_OK(kiln_executable_run(k, 2, (kiln_tensor *[]){x, y}, 1, &a));
        CHECK_OK(kiln_executable_run(s, 2, (kiln_tensor *[]){x, y}, 1, &b));
        for (int i = 0; a && b && i < 4; i++) CHECK(((float *)a->data)[i] == ((float *)b->data)[i]);
        kiln_tensor_release(a), kiln_tensor_release(b);
    }
    kiln_tensor_release(x), kiln_tensor_release(y);
    kiln_executable_free(k), kiln_executable_free(s);
    kiln_graph_free(g);
}

int main(void) {
    test_two_chains();
    test_loop_bodies();
    test_backends_share_a_plan();
    if (check_failures) {
        fprintf(stderr, "%d check(s) failed\n", check_failures);
        return 1;
    }
    printf("test_plan: ok\n");
    return 0;
}
