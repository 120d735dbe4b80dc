/* The passes on a graph with symbolic sizes, run once: the optimized graph keeps its symbols (fused
 * groups and matmul epilogues with symbolic shapes, no hint baked into a size), and for each of
 * several bindings its instance (kiln_graph_instantiate: sizes evaluated, nothing optimized again)
 * runs, on both backends, like the unoptimized graph instantiated at that binding and run with no
 * passes. A binding the graph does not hold for is refused. */
#include "check.h"
#include "core/internal.h"
#include "ir/symbolic.h"
#include "kiln/passes.h"

static uint64_t rng = 0x2545f4914f6cdd1dull;
static uint64_t next_rand(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return rng;
}
static int64_t rand_in(int64_t lo, int64_t hi) { return lo + (int64_t)(next_rand() % (uint64_t)(hi - lo + 1)); }

/* s0 rows of s1 * 8 features: elementwise chains with broadcasting (fused), a softmax over the
 * rows' last axis (a row group), a mean over rows kept as a column, x * 1 and a reshape of a
 * reshape (simplify), a repeated subexpression (cse), a linear with bias and relu (a matmul
 * epilogue), a full of s0 ones (not a constant: kept) summed (a count), a slice of all but the
 * first row. */
static const char *GRAPH =
    "graph<s0 >= 2 (4), s1 >= 1 (2)>(%0: float32[s0, s1*8], %1: float32[1, s1*8], %2: float32[5, s1*8]) {\n"
    "  %3: float32[] = constant(1)\n"
    "  %4: float32[5] = constant(0.25)\n"
    "  %5: float32[s0, s1*8] = mul(%0, %3)\n"
    "  %6: float32[s0, s1*8] = add(%5, %1)\n"
    "  %7: float32[s0, s1*8] = tanh(%6)\n"
    "  %8: float32[s0, s1*8] = add(%5, %1)\n"
    "  %9: float32[s0, s1*8] = mul(%7, %8)\n"
    "  %10: float32[s0, s1*8] = softmax(%9) {1}\n"
    "  %11: float32[s0, 1] = mean(%10) {2, 1}\n"
    "  %12: float32[s0, s1*8] = sub(%10, %11)\n"
    "  %13: float32[s0*s1*8] = reshape(%12) {s0*s1*8}\n"
    "  %14: float32[s0*s1, 8] = reshape(%13) {s0*s1, 8}\n"
    "  %15: float32[s0, 5] = linear(%9, %2, %4)\n"
    "  %16: float32[s0, 5] = relu(%15)\n"
    "  %17: float32[s0] = full() {6, 1, s0; 1}\n"
    "  %18: float32[] = sum(%17) {1, 0}\n"
    "  %19: float32[s0, 5] = div(%16, %18)\n"
    "  %20: float32[s0-1, 5] = slice(%19) {1, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, s0-1, 5, 0, 0, 0, 0, 0, 0}\n"
    "  %21: float32[s0-1, 5] = exp(%20)\n"
    "  return (%14, %21)\n"
    "}\n";

static int count_ops(const kiln_graph *g, kiln_op op) {
    int n = 0;
    for (int32_t i = 0; i < g->nnodes; i++) n += g->nodes[i].op == op;
    return n;
}

/* Runs g (no passes) on inputs, outputs into out (new references). */
static void run(const kiln_graph *g, const char *backend, kiln_tensor **inputs, kiln_tensor **out) {
    kiln_compile_options co = {.order = KILN_ORDER_BFS, .backend = backend};
    kiln_executable *e = NULL;
    CHECK_OK(kiln_compile(g, &co, &e));
    if (!e) return;
    CHECK_OK(kiln_executable_run(e, g->ninputs, inputs, g->noutputs, out));
    kiln_executable_free(e);
}

static void test_optimized_once_runs_at_every_binding(void) {
    kiln_graph *g = NULL, *opt = NULL;
    CHECK_OK(kiln_graph_parse(GRAPH, &g));
    if (!g) return;
    CHECK_OK(kiln_graph_clone(g, &opt));
    kiln_pass_options o1 = {KILN_LEVEL_O1, false, false, KILN_CONV_FUSE_ALL, false};
    CHECK_OK(kiln_optimize(&opt, &o1));
    /* the passes did their work without giving up the symbols */
    CHECK(kiln_graph_is_symbolic(opt));
    CHECK(count_ops(opt, KILN_OP_FUSED) >= 2);
    CHECK(count_ops(opt, KILN_OP_MATMUL_EPILOGUE) == 1);
    CHECK(count_ops(opt, KILN_OP_FULL) + count_ops(opt, KILN_OP_FUSED) >= 1);
    bool symbolic_fused = false;
    for (int32_t i = 0; i < opt->nnodes; i++)
        if (opt->nodes[i].op == KILN_OP_FUSED && opt->nodes[i].attr_sym) symbolic_fused = true;
    CHECK(symbolic_fused);
    for (int k = 0; k < 2; k++) /* the outputs' sizes are the same expressions */
        CHECK(kiln_value_same_shape(&g->values[g->outputs[k]], &opt->values[opt->outputs[k]]));
    char *text = kiln_graph_to_string(opt);
    kiln_graph *back = NULL;
    CHECK(text != NULL);
    if (text) CHECK_OK(kiln_graph_parse(text, &back));
    kiln_graph_free(back);
    free(text);

    for (int round = 0; round < 6; round++) {
        int64_t b[2] = {round == 0 ? 2 : rand_in(2, 9), round == 1 ? 1 : rand_in(1, 4)};
        kiln_graph *ref = NULL, *inst = NULL;
        CHECK_OK(kiln_graph_instantiate(g, b, &ref));
        CHECK_OK(kiln_graph_instantiate(opt, b, &inst));
        if (!ref || !inst) break;
        CHECK(!kiln_graph_is_symbolic(inst) && inst->values[inst->outputs[0]].meta.shape[0] == b[0] * b[1]);
        kiln_tensor *in[3];
        for (int k = 0; k < 3; k++) {
            const kiln_meta *m = &ref->values[ref->inputs[k]].meta;
            in[k] = tensor_f32(m->ndim, m->shape, NULL);
            for (int64_t i = 0; i < in[k]->numel; i++) ((float *)in[k]->data)[i] = (float)rand_in(-100, 100) / 50.0f;
        }
        kiln_tensor *want[2] = {0}, *got[2] = {0}, *got_sink[2] = {0};
        run(ref, "kbk", in, want);
        run(inst, "kbk", in, got);
        run(inst, "sink", in, got_sink);
        for (int k = 0; k < 2; k++) {
            CHECK(same_values_f32(got[k], want[k], 1e-5f));
            CHECK(same_values_f32(got_sink[k], want[k], 1e-5f));
            kiln_tensor_release(want[k]), kiln_tensor_release(got[k]), kiln_tensor_release(got_sink[k]);
        }
        for (int k = 0; k < 3; k++) kiln_tensor_release(in[k]);
        kiln_graph_free(ref), kiln_graph_free(inst);
    }
    /* below a lower bound: refused, naming the symbol */
    int64_t low[2] = {1, 2};
    kiln_graph *none = NULL;
    CHECK_STATUS(kiln_graph_instantiate(opt, low, &none), KILN_ERR_VALUE);
    CHECK(none == NULL && strstr(kiln_last_error(), "s0 = 1 is below its lower bound 2"));
    kiln_clear_error();
    kiln_graph_free(g), kiln_graph_free(opt);
}

/* A slice of s0 - 1 elements from the second on holds for every s0 >= 1: zero elements at 1. */
static void test_instantiate_at_the_lower_bound(void) {
    kiln_graph *g = NULL;
    CHECK_OK(kiln_graph_parse("graph<s0 >= 1 (3)>(%0: float32[s0]) {\n"
                              "  %1: float32[s0-1] = slice(%0) {1, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, s0-1, 0, 0, 0, 0, 0, 0, 0}\n"
                              "  return (%1)\n}\n",
                              &g));
    if (!g) return;
    int64_t one[1] = {1};
    kiln_graph *inst = NULL;
    CHECK_OK(kiln_graph_instantiate(g, one, &inst));
    CHECK(inst && inst->values[inst->outputs[0]].meta.shape[0] == 0);
    kiln_graph_free(inst);
    kiln_graph_free(g);
}

/* A recording (concrete sizes) made symbolic from its inputs' and attributes' expressions: a
 * reshape's rest divided exactly, a slice's length given, a later set of an attribute winning;
 * a size-holding node that no set names is refused (its sizes were the recorded shapes'). */
static void test_symbolize_a_recording(void) {
    kiln_graph *rec = NULL;
    CHECK_OK(kiln_graph_parse("graph(%0: float32[4, 6]) {\n"
                              "  %1: float32[24] = reshape(%0) {24}\n"
                              "  %2: float32[12, 2] = reshape(%1) {12, 2}\n"
                              "  %3: float32[2, 6] = slice(%0) {1, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 6, 0, 0, 0, 0, 0, 0}\n"
                              "  return (%2, %3)\n}\n",
                              &rec));
    if (!rec) return;
    for (int named = 0; named < 2; named++) {
        kiln_symtab *t = NULL;
        kiln_sdim s0;
        CHECK_OK(kiln_symtab_new(&t));
        CHECK_OK(kiln_sym_new(t, 2, 4, &s0));
        kiln_sshape in = {.ndim = 2, .d = {s0, kiln_sdim_const(6)}};
        kiln_sdim len;
        CHECK_OK(kiln_sym_add(t, s0, kiln_sdim_const(-2), &len));
        kiln_attr_sym_set sets[5] = {
            {0, 0, KILN_ATTR_SET_REST, {0, 0}},       /* 24 = s0*6 */
            {1, 0, KILN_ATTR_SET_VALUE, {0, 99}},     /* overridden by the next */
            {1, 0, KILN_ATTR_SET_REST, {0, 0}},       /* s0*6 / 2 = s0*3 */
            {2, 16, KILN_ATTR_SET_VALUE, len},        /* s0 - 2 rows from the second */
            {2, 0, KILN_ATTR_SET_VALUE, {0, 1}},
        };
        kiln_graph *g = NULL;
        kiln_status s = kiln_graph_symbolize(rec, t, &in, named ? 5 : 3, sets, &g);
        if (named) {
            CHECK_OK(s);
            if (!g) continue;
            int64_t b[1] = {7}, shape[KILN_MAX_DIMS];
            CHECK_OK(kiln_graph_value_shape_at(g, g->outputs[0], b, shape));
            CHECK(shape[0] == 21 && shape[1] == 2);
            CHECK_OK(kiln_graph_value_shape_at(g, g->outputs[1], b, shape));
            CHECK(shape[0] == 5 && shape[1] == 6);
        } else { /* the slice (SIZED) has symbolic input and no set: refused */
            CHECK_STATUS(s, KILN_ERR_VALUE);
            CHECK(strstr(kiln_last_error(), "node 2 (slice) keeps sizes taken from shapes that no set gives") != NULL);
        }
        kiln_graph_free(g);
    }
    kiln_clear_error();
    kiln_graph_free(rec);
}

int main(void) {
    test_symbolize_a_recording();
    test_optimized_once_runs_at_every_binding();
    test_instantiate_at_the_lower_bound();
    if (check_failures) {
        fprintf(stderr, "%d check(s) failed\n", check_failures);
        return 1;
    }
    printf("test_symbolic_passes: ok\n");
    return 0;
}
