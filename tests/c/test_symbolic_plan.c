/* One plan for every binding (issue 16 part 1): a graph with symbolic sizes, optimized and planned
 * once (kiln_plan_build_symbolic), bound at several bindings (kiln_executable_bind: larger than any
 * before, then smaller again) runs on both backends like the unoptimized graph instantiated at that
 * binding and compiled for it, with an arena of its own or sharing what the bindings share (the arena,
 * grown to the largest binding seen, and the sink's generated function; all of them run again at the
 * end); binding plans nothing and compiles no code (sharing, it does not even look code up); a bound plan's buffers are the ones planning the instantiated graph gives (same order, sizes
 * evaluated); a binding the graph does not hold for is refused. */
#include "check.h"
#include "codegen/codegen.h"
#include "core/internal.h"
#include "ir/symbolic.h"
#include "kiln/passes.h"
#include "runtime/backend.h"

/* Elementwise chains with broadcasting (a fused group), a softmax and a mean over rows (a row group),
 * a linear with bias and relu (a matmul epilogue), a slice of all but the first row. */
static const char *GRAPH =
    "graph<s0 >= 2 (4), s1 >= 1 (2)>(%0: float32[s0, s1*8], %1: float32[1, s1*8], %2: float32[5, s1*8]) {\n"
    "  %3: float32[5] = constant(0.25)\n"
    "  %4: float32[s0, s1*8] = add(%0, %1)\n"
    "  %5: float32[s0, s1*8] = tanh(%4)\n"
    "  %6: float32[s0, s1*8] = mul(%5, %0)\n"
    "  %7: float32[s0, s1*8] = softmax(%6) {1}\n"
    "  %8: float32[s0, 1] = mean(%7) {2, 1}\n"
    "  %9: float32[s0, s1*8] = sub(%7, %8)\n"
    "  %10: float32[s0, 5] = linear(%6, %2, %3)\n"
    "  %11: float32[s0, 5] = relu(%10)\n"
    "  %12: float32[s0-1, 5] = slice(%11) {1, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, s0-1, 5, 0, 0, 0, 0, 0, 0}\n"
    "  %13: float32[s0-1, 5] = exp(%12)\n"
    "  return (%9, %13)\n"
    "}\n";

static void test_one_plan_runs_every_binding(kiln_exec_order order) {
    kiln_graph *g = NULL, *opt = NULL;
    CHECK_OK(kiln_graph_parse(GRAPH, &g));
    if (!g) return;
    CHECK_OK(kiln_graph_clone(g, &opt));
    kiln_pass_options o1 = {KILN_LEVEL_O1, false, false, KILN_CONV_FUSE_ALL, false};
    CHECK_OK(kiln_optimize(&opt, &o1));
    CHECK(kiln_graph_is_symbolic(opt));
    kiln_compile_options co = {.order = order, .backend = "kbk"};
    kiln_plan *p = NULL;
    CHECK_STATUS(kiln_plan_build(opt, &co, &p), KILN_ERR_VALUE); /* a plain plan would bake the hints in */
    kiln_clear_error();
    CHECK_OK(kiln_plan_build_symbolic(opt, &co, &p));
    if (!p) return;
    CHECK(p->symbolic);
    /* s0 grows past every size seen, then shrinks; s1 changes too */
    enum { NB = 6 };
    static const int64_t bindings[NB][2] = {{4, 2}, {2, 1}, {9, 3}, {17, 4}, {3, 1}, {6, 2}};
    kiln_bindings *shared[2] = {NULL, NULL}; /* per backend: what its bindings share (arena, sink code) */
    CHECK_OK(kiln_bindings_new(&shared[0]));
    CHECK_OK(kiln_bindings_new(&shared[1]));
    kiln_executable *kept[NB][2] = {{NULL}};
    kiln_tensor *kept_in[NB][3] = {{NULL}}, *kept_want[NB][2] = {{NULL}};
    size_t largest = 0;
    for (size_t r = 0; r < NB; r++) {
        const int64_t *b = bindings[r];
        kiln_graph *ref = NULL, *inst = NULL;
        CHECK_OK(kiln_graph_instantiate(g, b, &ref));
        CHECK_OK(kiln_graph_instantiate(opt, b, &inst));
        if (!ref || !inst) break;
        kiln_tensor *in[3];
        for (int k = 0; k < 3; k++) {
            const kiln_meta *m = &ref->values[ref->inputs[k]].meta;
            in[k] = tensor_f32(m->ndim, m->shape, NULL);
            for (int64_t i = 0; i < in[k]->numel; i++) ((float *)in[k]->data)[i] = (float)((i * 7 + k * 3) % 23 - 11) / 9.0f;
        }
        kiln_tensor *want[2] = {0};
        kiln_executable *ref_exe = NULL, *planned = NULL;
        CHECK_OK(kiln_compile(ref, &co, &ref_exe));
        if (ref_exe) CHECK_OK(kiln_executable_run(ref_exe, 3, in, 2, want));
        CHECK_OK(kiln_compile(inst, &co, &planned)); /* the instance planned for itself: the same buffers */
        for (int backend = 0; backend < 2; backend++) {
            int64_t built0, bound0, built1, bound1;
            kiln_codegen_stats cg0, cg1;
            kiln_plan_counts(&built0, &bound0);
            kiln_codegen_get_stats(&cg0);
            kiln_executable *e = NULL;
            CHECK_OK(kiln_executable_bind(p, b, backend ? &kiln_backend_sink : &kiln_backend_kbk, NULL, &e));
            kiln_plan_counts(&built1, &bound1);
            kiln_codegen_get_stats(&cg1);
            CHECK(built1 == built0 && bound1 == bound0 + 1); /* bound, not planned */
            if (r > 0) CHECK(cg1.compiles == cg0.compiles); /* the code of the first binding serves */
            if (!e) continue;
            if (planned) CHECK(kiln_executable_arena_bytes(e) == kiln_executable_arena_bytes(planned));
            if (backend == 0 && planned) largest = kiln_executable_arena_bytes(planned) > largest ? kiln_executable_arena_bytes(planned) : largest;
            kiln_tensor *got[2] = {0};
            CHECK_OK(kiln_executable_run(e, 3, in, 2, got));
            for (int k = 0; k < 2; k++) {
                CHECK(same_values_f32(got[k], want[k], 1e-5f));
                kiln_tensor_release(got[k]);
            }
            kiln_executable_free(e);
            /* the same binding in the arena shared with the earlier ones: grown to the largest seen */
            kiln_codegen_get_stats(&cg0);
            CHECK_OK(kiln_executable_bind(p, b, backend ? &kiln_backend_sink : &kiln_backend_kbk, shared[backend],
                                          &kept[r][backend]));
            kiln_codegen_get_stats(&cg1);
            CHECK(kiln_bindings_arena_bytes(shared[backend]) == largest);
            /* the sink's function of the first shared binding serves: nothing compiled or even looked up */
            if (r > 0) CHECK(cg1.compiles == cg0.compiles && cg1.memory_hits == cg0.memory_hits);
            if (kept[r][backend] && backend == 1 && kiln_codegen_available())
                CHECK(kiln_executable_is_native(kept[r][backend]));
        }
        for (int k = 0; k < 2; k++) kept_want[r][k] = want[k];
        for (int k = 0; k < 3; k++) kept_in[r][k] = in[k];
        kiln_executable_free(ref_exe), kiln_executable_free(planned);
        kiln_graph_free(ref), kiln_graph_free(inst);
    }
    /* every binding kept, run again in turn, newest first: those sharing an arena (and those left with
     * the arena before it grew) compute what the concrete graph does */
    for (int pass = 0; pass < 2; pass++)
        for (int r = NB - 1; r >= 0; r--)
            for (int backend = 0; backend < 2; backend++) {
                if (!kept[r][backend]) continue;
                kiln_tensor *got[2] = {0};
                CHECK_OK(kiln_executable_run(kept[r][backend], 3, kept_in[r], 2, got));
                for (int k = 0; k < 2; k++) {
                    CHECK(same_values_f32(got[k], kept_want[r][k], 1e-5f));
                    kiln_tensor_release(got[k]);
                }
            }
    for (int r = 0; r < NB; r++) {
        kiln_executable_free(kept[r][0]), kiln_executable_free(kept[r][1]);
        kiln_release_all(kept_in[r], 3), kiln_release_all(kept_want[r], 2);
    }
    kiln_bindings_free(shared[0]), kiln_bindings_free(shared[1]);
    /* below a lower bound: refused, naming the symbol */
    int64_t low[2] = {1, 2};
    kiln_executable *none = NULL;
    CHECK_STATUS(kiln_executable_bind(p, low, &kiln_backend_kbk, NULL, &none), KILN_ERR_VALUE);
    CHECK(none == NULL && strstr(kiln_last_error(), "s0 = 1 is below its lower bound 2"));
    kiln_clear_error();
    kiln_plan_free(p);
    kiln_graph_free(g), kiln_graph_free(opt);
}

int main(void) {
    test_one_plan_runs_every_binding(KILN_ORDER_BFS);
    test_one_plan_runs_every_binding(KILN_ORDER_DFS);
    if (check_failures) {
        fprintf(stderr, "%d check(s) failed\n", check_failures);
        return 1;
    }
    printf("test_symbolic_plan: ok\n");
    return 0;
}
