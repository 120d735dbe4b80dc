/* Graph passes of O1 (cse, constant_fold, simplify) and the IR text parser: each pass as
 * "input text -> expected output text", every optimized graph computing what the original does
 * (both compiled and run on random inputs), the effect rules (random draws and in-place writes
 * never merged, folded or dropped), and a seeded random-graph differential test of O1 vs O0. */
#include "rewrite_check.h"
#include "core/internal.h"

static const kiln_pass_options o1 = {KILN_LEVEL_O1, false, false, KILN_CONV_FUSE_ALL, false};

static int same_results_3_runs(const kiln_graph *a, const kiln_graph *b) { return rc_same_results(a, b, 3); }

/* The comma-separated passes turn input into want (NULL: unchanged), computing the same. */
#define expect_passes(passes, input, want) rc_expect_rewrite_at(__LINE__, passes, &o1, input, want, same_results_3_runs)

/* ---- parser ---------------------------------------------------------------------------------- */

static void test_parse_round_trip(void) {
    const char *text =
        "graph(%0: float32[2, 3], %1: float32[3], %2: int64[]) {\n"
        "  %3: float32[] = constant(2.5)\n"
        "  %4: float32[3] = constant(0)\n"
        "  %5: float32[3] = parameter\n"
        "  %6: float64[2] = captured\n"
        "  %7: float32[2, 3] = add(%0, %1)  # model.py:12\n"
        "  %8: float32[2, 3] = mul(%7, %3)\n"
        "  %9: float32[2, 3], %10: float32[2, 1], %11: float32[2, 1] = layer_norm(%8, %4, %5) {1; 1e-05}\n"
        "  %12: float32[2, 3] = clamp(%9) {; -1, 1}  # model.py:14\n"
        "  %13: float32[3, 2] = permute(%12) {1, 0}\n"
        "  %14: float32[3] = full() {6, 1, 3; 0.5}\n"
        "  %15: float32[2, 3] = fused(%12, %14) {0, 6, 2, 2, 3}\n"
        "  return (%13, %15, %10, %0)\n"
        "}\n"
        "subgraph 0: graph(%0: float32[2, 3], %1: float32[3]) {\n"
        "  %2: float32[2, 3] = mul(%0, %1)\n"
        "  return (%2)\n"
        "}\n";
    kiln_graph *g = NULL;
    CHECK_OK(kiln_graph_parse(text, &g));
    if (!g) return;
    char *printed = kiln_graph_to_string(g);
    CHECK(printed && strcmp(printed, text) == 0);
    if (printed && strcmp(printed, text) != 0) fprintf(stderr, "round trip:\n%s", printed);
    free(printed);
    CHECK(g->ninputs == 3 && g->ncaptures == 4 && g->nnodes == 7 && g->noutputs == 4 && g->nsubgraphs == 1);
    const kiln_value *c = &g->values[3], *p = &g->values[5];
    CHECK(c->constant && kiln_tensor_get_double(c->bound, 0) == 2.5);
    CHECK(!p->constant && p->bound->requires_grad && !g->values[6].bound->requires_grad);
    const kiln_node *clamp = &g->nodes[3];
    CHECK(clamp->op == KILN_OP_CLAMP && clamp->attrs.ni == 0 && clamp->attrs.nf == 2 && clamp->attrs.f[0] == -1);
    const kiln_node *ln = &g->nodes[2];
    CHECK(ln->attrs.ni == 1 && ln->attrs.nf == 1 && ln->attrs.f[0] == 1e-5 && ln->nout == 3);
    CHECK(g->nodes[0].loc >= 0 && strcmp(g->locs[g->nodes[0].loc], "model.py:12") == 0);
    kiln_graph_free(g);
}

/* A traced graph prints, parses and prints the same. */
static void test_parse_traced(void) {
    int64_t shape[2] = {2, 4};
    kiln_tensor *x = tensor_f32(2, shape, NULL), *two = NULL, *a = NULL, *b = NULL, *y = NULL;
    kiln_tracer *tr = NULL;
    CHECK_OK(kiln_tracer_begin(&tr));
    CHECK_OK(kiln_tracer_add_input(tr, x));
    CHECK_OK(kiln_tracer_set_loc(tr, "f.py:3"));
    CHECK_OK(kiln_emit_scalar(2.0, KILN_DTYPE_FLOAT32, &two));
    CHECK_OK(kiln_apply2(KILN_OP_MUL, x, two, NULL, &a));
    CHECK_OK(kiln_emit_reduce(KILN_OP_SUM, a, 2, true, &b));
    CHECK_OK(kiln_apply2(KILN_OP_SUB, a, b, NULL, &y));
    kiln_tracer_end(tr);
    int32_t out;
    CHECK_OK(kiln_tracer_value_of(tr, y, &out));
    kiln_graph *g = kiln_tracer_graph(tr);
    CHECK_OK(kiln_graph_set_outputs(g, 1, &out));
    char *text = kiln_graph_to_string(g), *again = text ? rc_canon(text) : NULL;
    CHECK(again && strcmp(text, again) == 0);
    free(text), free(again);
    kiln_tracer_free(tr);
    kiln_tensor *all[] = {x, two, a, b, y};
    kiln_release_all(all, 5);
}

static void expect_parse_error(const char *text, const char *fragment) {
    kiln_graph *g = (kiln_graph *)1;
    CHECK_STATUS(kiln_graph_parse(text, &g), KILN_ERR_VALUE);
    CHECK(g == NULL);
    if (!strstr(kiln_last_error(), fragment)) {
        fprintf(stderr, "error '%s' does not mention '%s'\n", kiln_last_error(), fragment);
        check_failures++;
    }
}

static void test_parse_renumbers(void) {
    /* ids out of order and with gaps map to new ids in order of definition */
    kiln_graph *g = NULL;
    CHECK_OK(kiln_graph_parse("graph(%7: float32[3]) {\n"
                      "\n"
                      "  %3: float32[] = constant(1)\n"
                      "  %20: float32[3] = add(%7, %3)\n"
                      "  %1: float32[3] = exp(%20)\n"
                      "  return (%1, %20)\n"
                      "}\n", &g));
    char *got = g ? kiln_graph_to_string(g) : NULL;
    kiln_graph_free(g);
    CHECK(got && strcmp(got, "graph(%0: float32[3]) {\n"
                             "  %1: float32[] = constant(1)\n"
                             "  %2: float32[3] = add(%0, %1)\n"
                             "  %3: float32[3] = exp(%2)\n"
                             "  return (%3, %2)\n"
                             "}\n") == 0);
    free(got);
    /* attribute forms: "{ints; floats}", "{; floats}", non-integers are floats */
    g = NULL;
    CHECK_OK(kiln_graph_parse("graph(%0: float32[4]) {\n"
                              "  %1: float32[4] = clamp(%0) {; 0, 6}\n"
                              "  %2: float32[4] = clamp(%1) {-inf, 0.5}\n"
                              "  %3: float32[4], %4: float32[4] = dropout(%2) {0}\n"
                              "  return (%3)\n"
                              "}\n",
                              &g));
    if (g) {
        CHECK(g->nodes[0].attrs.ni == 0 && g->nodes[0].attrs.nf == 2 && g->nodes[0].attrs.f[1] == 6);
        CHECK(g->nodes[1].attrs.nf == 2 && isinf(g->nodes[1].attrs.f[0]) && g->nodes[1].attrs.f[1] == 0.5);
        CHECK(g->nodes[2].attrs.ni == 0 && g->nodes[2].attrs.nf == 1);
    }
    kiln_graph_free(g);
}

static void test_parse_errors(void) {
    expect_parse_error("graph(%0: float32[3]) {\n  %1: float32[3] = frobnicate(%0)\n  return (%1)\n}\n",
                       "line 2: unknown op 'frobnicate'");
    expect_parse_error("graph(%0: float32[3]) {\n  %1: float32[3] = exp(%0\n  return (%1)\n}\n", "line 2: expected ')'");
    expect_parse_error("graph(%0: float32[3]) {\n  %1: float32[3] = exp(%0)\n  return (%2)\n}\n",
                       "line 3: value %2 is not defined");
    expect_parse_error("graph(%0: float32[3]) {\n  %1: float32[3] = exp(%5)\n  return (%1)\n}\n",
                       "line 2: value %5 is not defined");
    expect_parse_error("graph(%0: float32[3]) {\n  %1: float64[3] = exp(%0)\n  return (%1)\n}\n",
                       "line 2: exp output 0 is declared float64(3,) but is float32(3,)");
    expect_parse_error("graph(%0: float32[3], %1: float32[4]) {\n  %2: float32[3] = add(%0, %1)\n  return (%2)\n}\n",
                       "line 2");
    expect_parse_error("graph(%0: float32[3]) {\n  %0: float32[3] = exp(%0)\n  return (%0)\n}\n",
                       "line 2: value %0 is defined twice");
    expect_parse_error("graph(%0: float33[3]) {\n  return (%0)\n}\n", "line 1: unknown dtype 'float33'");
    expect_parse_error("graph(%0: float32[3]) {\n  %1: float32[3] = exp(%0)\n}\n", "line 3: graph has no return line");
    expect_parse_error("graph(%0: float32[3]) {\n  return (%0)\n", "missing '}'");
    expect_parse_error("graph(%0: float32[3]) {\n  %1: float32[3] = exp(%0) {1; 2; 3}\n  return (%1)\n}\n",
                       "line 2: two ';'");
    expect_parse_error("graph(%0: float32[3]) {\n  return (%0)\n}\nsubgraph 1: graph() {\n  return ()\n}\n",
                       "line 4: unexpected text after the graph");
    expect_parse_error("", "empty");
}

/* ---- cse ------------------------------------------------------------------------------------- */

static void test_cse(void) {
    /* duplicates merge, then what used them merges too; commutative inputs in either order */
    expect_passes("cse",
                  "graph(%0: float32[2, 3], %1: float32[3]) {\n"
                  "  %2: float32[2, 3] = add(%0, %1)\n"
                  "  %3: float32[2, 3] = add(%1, %0)\n"
                  "  %4: float32[2, 3] = exp(%2)\n"
                  "  %5: float32[2, 3] = exp(%3)\n"
                  "  %6: float32[2, 3] = sub(%4, %5)\n"
                  "  %7: float32[2, 3] = sub(%5, %4)\n"
                  "  %8: float32[2, 3] = mul(%6, %7)\n"
                  "  return (%8)\n"
                  "}\n",
                  "graph(%0: float32[2, 3], %1: float32[3]) {\n"
                  "  %2: float32[2, 3] = add(%0, %1)\n"
                  "  %3: float32[2, 3] = exp(%2)\n"
                  "  %4: float32[2, 3] = sub(%3, %3)\n"
                  "  %5: float32[2, 3] = mul(%4, %4)\n"
                  "  return (%5)\n"
                  "}\n");
    /* attributes must match; multi-output nodes merge all their outputs; equal constants merge */
    expect_passes("cse",
                  "graph(%0: float32[2, 3]) {\n"
                  "  %1: float32[] = constant(2)\n"
                  "  %2: float32[] = constant(2)\n"
                  "  %3: float32[] = constant(3)\n"
                  "  %4: float32[2, 3] = mul(%0, %1)\n"
                  "  %5: float32[2, 3] = mul(%0, %2)\n"
                  "  %6: float32[2, 3] = mul(%0, %3)\n"
                  "  %7: float32[2] = sum(%4) {2, 0}\n"
                  "  %8: float32[3] = sum(%5) {1, 0}\n"
                  "  %9: float32[2, 1] = sum(%5) {2, 1}\n"
                  "  %10: float32[2, 3], %11: float32[2, 1], %12: float32[2, 1] = layer_norm(%6, %8, %8) {1; 1e-05}\n"
                  "  %13: float32[2, 3], %14: float32[2, 1], %15: float32[2, 1] = layer_norm(%6, %8, %8) {1; 1e-05}\n"
                  "  %16: float32[2, 3], %17: float32[2, 1], %18: float32[2, 1] = layer_norm(%6, %8, %8) {1; 1e-06}\n"
                  "  %19: float32[2, 1] = add(%12, %15)\n"
                  "  %20: float32[2, 1] = add(%19, %18)\n"
                  "  %21: float32[2, 3] = add(%10, %13)\n"
                  "  return (%7, %9, %20, %21, %16)\n"
                  "}\n",
                  "graph(%0: float32[2, 3]) {\n"
                  "  %1: float32[] = constant(2)\n"
                  "  %2: float32[] = constant(2)\n"
                  "  %3: float32[] = constant(3)\n"
                  "  %4: float32[2, 3] = mul(%0, %1)\n"
                  "  %5: float32[2, 3] = mul(%0, %3)\n"
                  "  %6: float32[2] = sum(%4) {2, 0}\n"
                  "  %7: float32[3] = sum(%4) {1, 0}\n"
                  "  %8: float32[2, 1] = sum(%4) {2, 1}\n"
                  "  %9: float32[2, 3], %10: float32[2, 1], %11: float32[2, 1] = layer_norm(%5, %7, %7) {1; 1e-05}\n"
                  "  %12: float32[2, 3], %13: float32[2, 1], %14: float32[2, 1] = layer_norm(%5, %7, %7) {1; 1e-06}\n"
                  "  %15: float32[2, 1] = add(%11, %11)\n"
                  "  %16: float32[2, 1] = add(%15, %14)\n"
                  "  %17: float32[2, 3] = add(%9, %9)\n"
                  "  return (%6, %8, %16, %17, %12)\n"
                  "}\n");
    /* nothing to merge: unchanged */
    expect_passes("cse",
                  "graph(%0: float32[3]) {\n"
                  "  %1: float32[3] = exp(%0)\n"
                  "  %2: float32[3] = log(%0)\n"
                  "  %3: float32[3] = add(%1, %2)\n"
                  "  return (%3)\n"
                  "}\n",
                  NULL);
}

/* Random draws, in-place writes and what they touch are never merged. */
static void test_cse_effects(void) {
    /* two draws are two draws; two slice_assigns are two writes */
    expect_passes("cse",
                  "graph(%0: float32[4]) {\n"
                  "  %1: float32[4] = rand() {6, 1, 4; 0, 1}\n"
                  "  %2: float32[4] = rand() {6, 1, 4; 0, 1}\n"
                  "  %3: float32[4], %4: float32[4] = dropout(%0) {; 0.5}\n"
                  "  %5: float32[4], %6: float32[4] = dropout(%0) {; 0.5}\n"
                  "  %7: float32[4] = add(%1, %2)\n"
                  "  %8: float32[4] = add(%3, %5)\n"
                  "  %9: float32[4] = add(%7, %8)\n"
                  "  return (%9)\n"
                  "}\n",
                  NULL);
    /* a read of a buffer written in place stays where it is (before and after the write) */
    expect_passes("cse",
                  "graph(%0: float32[4], %1: float32[2]) {\n"
                  "  %2: float32[4] = full() {6, 1, 4; 1}\n"
                  "  %3: float32[4] = exp(%2)\n"
                  "  %4: float32[4] = slice_assign(%2, %1) {0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0}\n"
                  "  %5: float32[4] = exp(%2)\n"
                  "  %6: float32[4] = slice_assign(%2, %1) {0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0}\n"
                  "  %7: float32[4] = add(%3, %5)\n"
                  "  return (%7, %6)\n"
                  "}\n",
                  NULL);
    /* a node whose own output is written in place later keeps its private buffer */
    expect_passes("cse",
                  "graph(%0: float32[4], %1: float32[2]) {\n"
                  "  %2: float32[4] = exp(%0)\n"
                  "  %3: float32[4] = exp(%0)\n"
                  "  %4: float32[4] = slice_assign(%3, %1) {0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0}\n"
                  "  %5: float32[4] = add(%2, %4)\n"
                  "  return (%5)\n"
                  "}\n",
                  NULL);
    /* a parameter an optimizer step updates: reads of it are not merged (before vs after) */
    expect_passes("cse",
                  "graph(%0: float32[3]) {\n"
                  "  %1: float32[3] = parameter\n"
                  "  %2: float32[3] = captured\n"
                  "  %3: int64[1] = captured\n"
                  "  %4: float32[3] = mul(%1, %0)\n"
                  "  %5: float32[3] = sgd_update(%1, %0, %2, %3) {0; 0.1, 0, 0, 0}\n"
                  "  %6: float32[3] = mul(%1, %0)\n"
                  "  %7: float32[3] = sub(%6, %4)\n"
                  "  return (%7)\n"
                  "}\n",
                  NULL);
    /* two graph outputs stay two tensors */
    expect_passes("cse",
                  "graph(%0: float32[3]) {\n"
                  "  %1: float32[3] = exp(%0)\n"
                  "  %2: float32[3] = exp(%0)\n"
                  "  %3: float32[3] = exp(%0)\n"
                  "  %4: float32[3] = neg(%3)\n"
                  "  return (%1, %2, %4)\n"
                  "}\n",
                  "graph(%0: float32[3]) {\n"
                  "  %1: float32[3] = exp(%0)\n"
                  "  %2: float32[3] = exp(%0)\n"
                  "  %3: float32[3] = neg(%1)\n"
                  "  return (%1, %2, %3)\n"
                  "}\n");
}

/* A capture that views another's storage: a write through one is a write to both. */
static void test_cse_aliased_captures(void) {
    int64_t n = 4, two = 2;
    kiln_tensor *w = tensor_f32(1, &n, (const float[]){1, 2, 3, 4}), *wv = NULL;
    CHECK_OK(kiln_tensor_view(w, 1, &n, NULL, 0, &wv));
    if (!wv) return;
    kiln_graph *g = NULL;
    CHECK_OK(kiln_graph_new(&g));
    kiln_meta m = {.dtype = KILN_DTYPE_FLOAT32, .ndim = 1, .shape = {2}};
    int32_t x, cw, cv, e1, e2, sa, y;
    CHECK_OK(kiln_graph_add_input(g, &m, &x));
    CHECK_OK(kiln_graph_add_capture(g, w, false, &cw));
    CHECK_OK(kiln_graph_add_capture(g, wv, false, &cv));
    CHECK_OK(kiln_graph_add_node(g, KILN_OP_EXP, 1, &cv, NULL, -1, &e1));
    kiln_attrs at = {.ni = 24};
    at.i[8] = 1, at.i[16] = two;
    int32_t in[2] = {cw, x};
    CHECK_OK(kiln_graph_add_node(g, KILN_OP_SLICE_ASSIGN, 2, in, &at, -1, &sa));
    CHECK_OK(kiln_graph_add_node(g, KILN_OP_EXP, 1, &cv, NULL, -1, &e2));
    int32_t pair[2] = {e1, e2};
    CHECK_OK(kiln_graph_add_node(g, KILN_OP_SUB, 2, pair, NULL, -1, &y));
    CHECK_OK(kiln_graph_set_outputs(g, 1, &y));
    CHECK_OK(kiln_run_pass("cse", &g, &o1));
    CHECK(g->nnodes == 4);
    kiln_graph_free(g);
    kiln_tensor_release(w), kiln_tensor_release(wv);
}

/* ---- constant folding ------------------------------------------------------------------------ */

static void test_constant_fold(void) {
    expect_passes("constant_fold",
                  "graph(%0: float32[3]) {\n"
                  "  %1: float32[] = constant(2)\n"
                  "  %2: float32[] = constant(3)\n"
                  "  %3: float32[] = mul(%1, %2)\n"
                  "  %4: float32[] = neg(%3)\n"
                  "  %5: float32[3] = add(%0, %4)\n"
                  "  return (%5)\n"
                  "}\n",
                  "graph(%0: float32[3]) {\n"
                  "  %1: float32[] = constant(2)\n"
                  "  %2: float32[] = constant(3)\n"
                  "  %3: float32[] = constant(-6)\n"
                  "  %4: float32[3] = add(%0, %3)\n"
                  "  return (%4)\n"
                  "}\n");
    /* creation ops fold; multi-output nodes fold every used output */
    expect_passes("constant_fold,dce",
                  "graph(%0: float32[2, 3]) {\n"
                  "  %1: float32[2, 3] = full() {6, 2, 2, 3; 1.5}\n"
                  "  %2: float32[3] = arange() {6, 3; 0, 1}\n"
                  "  %3: float32[3] = full() {6, 1, 3; 1}\n"
                  "  %4: float32[2, 3] = add(%1, %2)\n"
                  "  %5: float32[2, 3], %6: float32[2, 1], %7: float32[2, 1] = layer_norm(%4, %3, %2) {1; 1e-05}\n"
                  "  %8: float32[2, 3] = mul(%0, %5)\n"
                  "  %9: float32[2, 1] = mul(%6, %7)\n"
                  "  %10: float32[2, 3] = add(%8, %9)\n"
                  "  return (%10)\n"
                  "}\n",
                  "graph(%0: float32[2, 3]) {\n"
                  "  %1: float32[2, 3] = constant\n"
                  "  %2: float32[2, 1] = constant(3.0618393)\n"
                  "  %3: float32[2, 3] = mul(%0, %1)\n"
                  "  %4: float32[2, 3] = add(%3, %2)\n"
                  "  return (%4)\n"
                  "}\n");
    /* a graph output stays computed: the caller gets a fresh tensor every call */
    expect_passes("constant_fold",
                  "graph() {\n"
                  "  %0: float32[] = constant(2)\n"
                  "  %1: float32[] = exp(%0)\n"
                  "  %2: float32[] = log(%1)\n"
                  "  return (%2)\n"
                  "}\n",
                  "graph() {\n"
                  "  %0: float32[] = constant(2)\n"
                  "  %1: float32[] = constant(7.389056)\n"
                  "  %2: float32[] = log(%1)\n"
                  "  return (%2)\n"
                  "}\n");
    /* live captures (parameters, closures) and large results are not folded */
    expect_passes("constant_fold",
                  "graph(%0: float32[70000]) {\n"
                  "  %1: float32[3] = parameter\n"
                  "  %2: float32[3] = captured\n"
                  "  %3: float32[3] = add(%1, %2)\n"
                  "  %4: float32[70000] = full() {6, 1, 70000; 1}\n"
                  "  %5: float32[70000] = mul(%0, %4)\n"
                  "  %6: float32[] = sum(%3) {1, 0}\n"
                  "  %7: float32[70000] = add(%5, %6)\n"
                  "  return (%7)\n"
                  "}\n",
                  NULL);
    /* a kernel that fails (index out of range) is left to fail at run time */
    expect_passes("constant_fold",
                  "graph(%0: float32[]) {\n"
                  "  %1: float32[3] = constant(1)\n"
                  "  %2: int64[] = constant(7)\n"
                  "  %3: float32[] = gather(%1, %2) {0}\n"
                  "  %4: float32[] = add(%0, %3)\n"
                  "  return (%4)\n"
                  "}\n",
                  NULL);
}

static void test_constant_fold_effects(void) {
    /* random draws and what depends on them stay; a constant written in place is no constant */
    expect_passes("constant_fold",
                  "graph(%0: float32[4], %1: float32[2]) {\n"
                  "  %2: float32[4] = constant(1)\n"
                  "  %3: float32[4] = rand() {6, 1, 4; 0, 1}\n"
                  "  %4: float32[4] = exp(%3)\n"
                  "  %5: float32[4] = exp(%2)\n"
                  "  %6: float32[4] = slice_assign(%2, %1) {0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0}\n"
                  "  %7: float32[4] = add(%4, %5)\n"
                  "  %8: float32[4] = add(%7, %0)\n"
                  "  return (%8)\n"
                  "}\n",
                  NULL);
    /* a folded buffer that is later written in place would be written across calls: kept */
    expect_passes("constant_fold",
                  "graph(%0: float32[2]) {\n"
                  "  %1: float32[4] = full() {6, 1, 4; 0}\n"
                  "  %2: float32[4] = slice_assign(%1, %0) {1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0}\n"
                  "  %3: float32[4] = exp(%2)\n"
                  "  return (%3)\n"
                  "}\n",
                  NULL);
}

/* ---- algebraic simplification ------------------------------------------------------------------ */

static void test_simplify_arith(void) {
    expect_passes("simplify,dce",
                  "graph(%0: float32[2, 3], %1: float32[3], %2: int32[3]) {\n"
                  "  %3: float32[] = constant(1)\n"
                  "  %4: float32[] = constant(-0)\n"
                  "  %5: float32[3] = constant(1)\n"
                  "  %6: float32[] = constant(0)\n"
                  "  %7: int32[] = constant(0)\n"
                  "  %8: float32[2, 3] = mul(%0, %3)\n"
                  "  %9: float32[2, 3] = mul(%3, %8)\n"
                  "  %10: float32[2, 3] = add(%9, %4)\n"
                  "  %11: float32[2, 3] = add(%4, %10)\n"
                  "  %12: float32[2, 3] = sub(%11, %6)\n"
                  "  %13: float32[2, 3] = div(%12, %5)\n"
                  "  %14: float32[] = full() {6, 0; 1}\n"
                  "  %15: float32[2, 3] = mul(%13, %14)\n"
                  "  %16: float32[2, 3] = exp(%15)\n"
                  "  %17: int32[3] = add(%2, %7)\n"
                  "  %18: int32[3] = add(%7, %17)\n"
                  "  %19: int32[3] = abs(%18)\n"
                  "  return (%16, %19)\n"
                  "}\n",
                  "graph(%0: float32[2, 3], %1: float32[3], %2: int32[3]) {\n"
                  "  %3: float32[] = constant(1)\n"
                  "  %4: float32[] = constant(-0)\n"
                  "  %5: float32[3] = constant(1)\n"
                  "  %6: float32[] = constant(0)\n"
                  "  %7: int32[] = constant(0)\n"
                  "  %8: float32[2, 3] = exp(%0)\n"
                  "  %9: int32[3] = abs(%2)\n"
                  "  return (%8, %9)\n"
                  "}\n");
    /* on floats, adding +0.0 or subtracting -0.0 is not the identity: -0.0 + 0.0 is +0.0 */
    expect_passes("simplify",
                  "graph(%0: float32[3]) {\n"
                  "  %1: float32[] = constant(0)\n"
                  "  %2: float32[] = constant(-0)\n"
                  "  %3: float32[] = full() {6, 0; 0}\n"
                  "  %4: float32[3] = add(%0, %1)\n"
                  "  %5: float32[3] = add(%1, %4)\n"
                  "  %6: float32[3] = sub(%5, %2)\n"
                  "  %7: float32[3] = add(%6, %3)\n"
                  "  %8: float32[3] = exp(%7)\n"
                  "  return (%8)\n"
                  "}\n",
                  NULL);
    /* not identities: broadcasting that grows x, promotion that changes its dtype, 0 - x, 1 / x, x * 2 */
    expect_passes("simplify",
                  "graph(%0: float32[3], %1: int32[3]) {\n"
                  "  %2: float32[] = constant(1)\n"
                  "  %3: float32[2, 3] = constant(1)\n"
                  "  %4: float32[] = constant(0)\n"
                  "  %5: float32[] = constant(2)\n"
                  "  %6: float32[2, 3] = mul(%0, %3)\n"
                  "  %7: float32[3] = mul(%1, %2)\n"
                  "  %8: float32[3] = sub(%4, %0)\n"
                  "  %9: float32[3] = div(%2, %0)\n"
                  "  %10: float32[3] = mul(%0, %5)\n"
                  "  %11: float32[2, 3] = add(%6, %7)\n"
                  "  %12: float32[3] = add(%8, %9)\n"
                  "  %13: float32[3] = add(%12, %10)\n"
                  "  return (%11, %13)\n"
                  "}\n",
                  NULL);
    /* neg(neg(x)) collapses, but a graph output that eager code makes fresh never becomes the
     * caller's input: the last neg(neg(.)) of %2 stays */
    expect_passes("simplify,dce",
                  "graph(%0: float32[3]) {\n"
                  "  %1: float32[3] = neg(%0)\n"
                  "  %2: float32[3] = neg(%1)\n"
                  "  %3: float32[3] = neg(%2)\n"
                  "  %4: float32[3] = neg(%3)\n"
                  "  %5: float32[3] = neg(%4)\n"
                  "  return (%5, %2)\n"
                  "}\n",
                  "graph(%0: float32[3]) {\n"
                  "  %1: float32[3] = neg(%0)\n"
                  "  %2: float32[3] = neg(%1)\n"
                  "  %3: float32[3] = neg(%0)\n"
                  "  return (%3, %2)\n"
                  "}\n");
}

static void test_simplify_movement(void) {
    expect_passes("simplify,dce",
                  "graph(%0: float32[2, 3, 4]) {\n"
                  "  %1: float32[6, 4] = reshape(%0) {6, 4}\n"
                  "  %2: float32[24] = reshape(%1) {24}\n"
                  "  %3: float32[4, 6] = reshape(%2) {4, 6}\n"
                  "  %4: float32[4, 6] = reshape(%3) {4, 6}\n"
                  "  %5: float32[2, 3, 4] = reshape(%4) {2, 3, 4}\n"
                  "  %6: float32[4, 2, 3] = permute(%5) {2, 0, 1}\n"
                  "  %7: float32[3, 4, 2] = permute(%6) {2, 0, 1}\n"
                  "  %8: float32[2, 3, 4] = permute(%7) {2, 0, 1}\n"
                  "  %9: float32[3, 2, 4] = permute(%8) {1, 0, 2}\n"
                  "  %10: float32[4, 3, 2] = permute(%9) {2, 0, 1}\n"
                  "  %11: float32[2, 3, 4] = permute(%8) {0, 1, 2}\n"
                  "  %12: float32[2, 3, 4] = expand(%11) {2, 3, 4}\n"
                  "  %13: float32[2, 3, 4] = contiguous(%12)\n"
                  "  return (%4, %10, %13)\n"
                  "}\n",
                  "graph(%0: float32[2, 3, 4]) {\n"
                  "  %1: float32[4, 6] = reshape(%0) {4, 6}\n"
                  "  %2: float32[4, 3, 2] = permute(%0) {2, 1, 0}\n"
                  "  %3: float32[2, 3, 4] = contiguous(%0)\n"
                  "  return (%1, %2, %3)\n"
                  "}\n");
    /* expand(expand(x)), contiguous of a fresh result, casts */
    expect_passes("simplify,dce",
                  "graph(%0: float32[3], %1: float64[3], %2: int32[3]) {\n"
                  "  %3: float32[2, 3] = expand(%0) {2, 3}\n"
                  "  %4: float32[5, 2, 3] = expand(%3) {5, 2, 3}\n"
                  "  %5: float32[3] = exp(%0)\n"
                  "  %6: float32[3] = contiguous(%5)\n"
                  "  %7: float32[3] = contiguous(%6)\n"
                  "  %8: float64[3] = cast(%7) {7}\n"
                  "  %9: float32[3] = cast(%8) {6}\n"
                  "  %10: float32[3] = cast(%9) {6}\n"
                  "  %11: float32[3] = cast(%1) {6}\n"
                  "  %12: float64[3] = cast(%11) {7}\n"
                  "  %13: int64[3] = cast(%2) {3}\n"
                  "  %14: int32[3] = cast(%13) {2}\n"
                  "  %15: float32[3] = mul(%10, %14)\n"
                  "  return (%4, %15, %12)\n"
                  "}\n",
                  "graph(%0: float32[3], %1: float64[3], %2: int32[3]) {\n"
                  "  %3: float32[5, 2, 3] = expand(%0) {5, 2, 3}\n"
                  "  %4: float32[3] = exp(%0)\n"
                  "  %5: float32[3] = cast(%1) {6}\n"
                  "  %6: float64[3] = cast(%5) {7}\n"
                  "  %7: float32[3] = mul(%4, %2)\n"
                  "  return (%3, %7, %6)\n"
                  "}\n");
}

static void test_simplify_effects(void) {
    /* x * 1 whose result is written in place keeps its own buffer; so does contiguous; a
     * constant 1 that is written is not known to be 1 */
    expect_passes("simplify",
                  "graph(%0: float32[4], %1: float32[2]) {\n"
                  "  %2: float32[] = constant(1)\n"
                  "  %3: float32[4] = constant(1)\n"
                  "  %4: float32[4] = mul(%0, %2)\n"
                  "  %5: float32[4] = slice_assign(%4, %1) {0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0}\n"
                  "  %6: float32[4] = exp(%0)\n"
                  "  %7: float32[4] = contiguous(%6)\n"
                  "  %8: float32[4] = slice_assign(%7, %1) {2, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0}\n"
                  "  %9: float32[4] = mul(%6, %3)\n"
                  "  %10: float32[4] = slice_assign(%3, %1) {1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0}\n"
                  "  %11: float32[4] = add(%5, %8)\n"
                  "  %12: float32[4] = add(%11, %9)\n"
                  "  return (%12, %0)\n"
                  "}\n",
                  NULL);
    /* random ops are not removed: neg(neg(rand)) keeps the draw */
    expect_passes("simplify,dce",
                  "graph() {\n"
                  "  %0: float32[4] = rand() {6, 1, 4; 0, 1}\n"
                  "  %1: float32[4] = rand() {6, 1, 4; 0, 1}\n"
                  "  %2: float32[4] = neg(%1)\n"
                  "  %3: float32[4] = neg(%2)\n"
                  "  %4: float32[4] = exp(%3)\n"
                  "  return (%4)\n"
                  "}\n",
                  "graph() {\n"
                  "  %0: float32[4] = rand() {6, 1, 4; 0, 1}\n"
                  "  %1: float32[4] = rand() {6, 1, 4; 0, 1}\n"
                  "  %2: float32[4] = exp(%1)\n"
                  "  return (%2)\n"
                  "}\n");
}

/* ---- the O1 pipeline ----------------------------------------------------------------------------- */

static void test_pipeline_o1(void) {
    /* traced-looking code: scalars as full nodes, repeated subexpressions, identities. simplify
     * runs after cse, so the add that x * 1 -> x exposes as a duplicate stays. */
    expect_passes("dce,cse,constant_fold,simplify,dce",
                  "graph(%0: float32[4, 8], %1: float32[8]) {\n"
                  "  %2: float32[] = full() {6, 0; 1}\n"
                  "  %3: float32[] = full() {6, 0; 2}\n"
                  "  %4: float32[] = full() {6, 0; 2}\n"
                  "  %5: float32[] = mul(%3, %4)\n"
                  "  %6: float32[4, 8] = mul(%0, %2)\n"
                  "  %7: float32[4, 8] = add(%6, %1)\n"
                  "  %8: float32[4, 8] = add(%0, %1)\n"
                  "  %9: float32[4, 8] = mul(%7, %5)\n"
                  "  %10: float32[4, 8] = mul(%7, %5)\n"
                  "  %11: float32[8, 4] = permute(%9) {1, 0}\n"
                  "  %12: float32[4, 8] = permute(%11) {1, 0}\n"
                  "  %13: float32[4, 8] = sub(%12, %10)\n"
                  "  %14: float32[4, 8] = exp(%8)\n"
                  "  %15: float32[4, 8] = exp(%7)\n"
                  "  return (%13, %14, %15)\n"
                  "}\n",
                  "graph(%0: float32[4, 8], %1: float32[8]) {\n"
                  "  %2: float32[] = constant(1)\n"
                  "  %3: float32[] = constant(4)\n"
                  "  %4: float32[4, 8] = add(%0, %1)\n"
                  "  %5: float32[4, 8] = add(%0, %1)\n"
                  "  %6: float32[4, 8] = mul(%4, %3)\n"
                  "  %7: float32[4, 8] = sub(%6, %6)\n"
                  "  %8: float32[4, 8] = exp(%5)\n"
                  "  %9: float32[4, 8] = exp(%4)\n"
                  "  return (%7, %8, %9)\n"
                  "}\n");
}

/* Each level runs every pass of the level below, in the same order (a higher level adds passes, it
 * never drops one): O2 once lacked the conv and matmul epilogue fusions and the channels-last
 * rewrite O1 gained after O2's list was written, so O2 ran slower than O1 (issue 17). */
static void test_levels_keep_the_passes_below(void) {
    for (int level = KILN_LEVEL_O1; level <= KILN_LEVEL_O2; level++) {
        int nlow, nhigh, k = 0;
        const kiln_pass *low = kiln_pipeline((kiln_jit_level)(level - 1), &nlow);
        const kiln_pass *high = kiln_pipeline((kiln_jit_level)level, &nhigh);
        for (int j = 0; j < nhigh && k < nlow; j++)
            if (strcmp(high[j].name, low[k].name) == 0) k++;
        if (k < nlow) fprintf(stderr, "  O%d lacks O%d's pass %s (or runs it out of order)\n", level, level - 1, low[k].name);
        CHECK(k == nlow);
        CHECK(nhigh > nlow || level == KILN_LEVEL_O1);
    }
}

/* ---- randomized: O1 computes what O0 does -------------------------------------------------------- */

static const kiln_op unary_ops[] = {KILN_OP_NEG, KILN_OP_EXP, KILN_OP_TANH, KILN_OP_RELU, KILN_OP_CONTIGUOUS, KILN_OP_ABS};
static const kiln_op binary_ops[] = {KILN_OP_ADD, KILN_OP_SUB, KILN_OP_MUL, KILN_OP_DIV, KILN_OP_MAXIMUM};

/* Adds a random node (or nothing, when the random pick does not type-check). */
static void random_node(kiln_graph *g) {
    int32_t nv = g->nvalues, a = rc_rnd_int(nv), b = rc_rnd_int(nv), out[KILN_MAX_OUTPUTS];
    const kiln_meta *ma = &g->values[a].meta;
    kiln_attrs at;
    kiln_attrs_clear(&at);
    kiln_op op;
    int nin = 1, pick = rc_rnd_int(12);
    if (pick < 3) {
        op = unary_ops[rc_rnd_int(6)];
    } else if (pick < 7) {
        op = binary_ops[rc_rnd_int(5)];
        nin = 2;
    } else if (pick == 7) { /* permute: a random permutation */
        op = KILN_OP_PERMUTE;
        for (int d = 0; d < ma->ndim; d++) kiln_attrs_push_int(&at, d);
        for (int d = ma->ndim - 1; d > 0; d--) {
            int e = rc_rnd_int(d + 1);
            int64_t t = at.i[d];
            at.i[d] = at.i[e], at.i[e] = t;
        }
    } else if (pick == 8) { /* reshape: flatten, or split the first axis */
        op = KILN_OP_RESHAPE;
        int64_t n = kiln_meta_numel(ma);
        if (rc_rnd_int(2) || n % 2) kiln_attrs_push_int(&at, n);
        else kiln_attrs_push_int(&at, 2), kiln_attrs_push_int(&at, n / 2);
    } else if (pick == 9) { /* cast round trips */
        op = KILN_OP_CAST;
        kiln_attrs_push_int(&at, ma->dtype == KILN_DTYPE_FLOAT32 ? KILN_DTYPE_FLOAT64 : KILN_DTYPE_FLOAT32);
    } else if (pick == 10) { /* expand: a new leading axis */
        op = KILN_OP_EXPAND;
        if (ma->ndim >= KILN_MAX_DIMS - 1) return;
        kiln_attrs_push_int(&at, 2);
        for (int d = 0; d < ma->ndim; d++) kiln_attrs_push_int(&at, ma->shape[d]);
    } else { /* a sum, or a copy of an earlier node (a common subexpression) */
        if (g->nnodes && rc_rnd_int(2)) {
            const kiln_node *n = &g->nodes[rc_rnd_int(g->nnodes)];
            if (kiln_op_table[n->op].flags & KILN_OPF_RANDOM) return;
            int32_t in[4];
            for (int k = 0; k < n->nin && k < 4; k++) in[k] = n->in[k];
            kiln_attrs copy = n->attrs;
            if (kiln_graph_add_node(g, n->op, n->nin, in, &copy, -1, out) != KILN_OK) kiln_clear_error();
            return;
        }
        op = KILN_OP_SUM;
        kiln_attrs_push_int(&at, ma->ndim ? 1 : 0);
        kiln_attrs_push_int(&at, rc_rnd_int(2));
    }
    int32_t in[2] = {a, b};
    if (kiln_graph_add_node(g, op, nin, in, &at, -1, out) != KILN_OK) kiln_clear_error();
}

static kiln_tensor *scalar_f32(double v) {
    kiln_tensor *t = tensor_f32(0, NULL, NULL);
    *(float *)t->data = (float)v;
    return t;
}

static void test_random_graphs(void) {
    int64_t shape[3] = {2, 3, 4}, row[1] = {4};
    int trials = 150, changed = 0;
    for (int trial = 0; trial < trials; trial++) {
        kiln_graph *g = NULL;
        CHECK_OK(kiln_graph_new(&g));
        kiln_meta m3 = {.dtype = KILN_DTYPE_FLOAT32, .ndim = 3, .shape = {2, 3, 4}};
        kiln_meta m1 = {.dtype = rc_rnd_int(2) ? KILN_DTYPE_FLOAT32 : KILN_DTYPE_FLOAT64, .ndim = 1, .shape = {4}};
        int32_t x, y, c;
        CHECK_OK(kiln_graph_add_input(g, &m3, &x));
        CHECK_OK(kiln_graph_add_input(g, &m1, &y));
        static const double consts[] = {0, 1, 1, 2, -1};
        for (int k = 0; k < 5; k++) {
            kiln_tensor *t = scalar_f32(consts[k]);
            CHECK_OK(kiln_graph_add_capture(g, t, true, &c));
            kiln_tensor_release(t);
        }
        kiln_tensor *ones = tensor_f32(1, row, (const float[]){1, 1, 1, 1}), *w = tensor_f32(3, shape, NULL);
        CHECK_OK(kiln_graph_add_capture(g, ones, true, &c));
        CHECK_OK(kiln_graph_add_capture(g, w, false, &c)); /* live: never folded */
        kiln_tensor_release(ones), kiln_tensor_release(w);
        if (rc_rnd_int(3) == 0) {
            kiln_attrs at = {.ni = 3, .nf = 2, .i = {KILN_DTYPE_FLOAT32, 1, 4}, .f = {0, 1}};
            CHECK_OK(kiln_graph_add_node(g, KILN_OP_RAND, 0, NULL, &at, -1, &c));
        }
        int nodes = 4 + rc_rnd_int(20);
        for (int k = 0; k < nodes; k++) random_node(g);
        int32_t outs[3] = {g->nvalues - 1, (int32_t)rc_rnd_int(g->nvalues), g->nvalues - 2};
        CHECK_OK(kiln_graph_set_outputs(g, 1 + rc_rnd_int(3), outs));
        kiln_graph *opt = NULL;
        CHECK_OK(kiln_graph_clone(g, &opt));
        CHECK_OK(kiln_optimize(&opt, &o1));
        changed += opt->nnodes < g->nnodes;
        if (!rc_same_results(g, opt, 2)) {
            char *a = kiln_graph_to_string(g), *b = kiln_graph_to_string(opt);
            fprintf(stderr, "random graph %d: O1 differs from O0\n%s--- O1:\n%s", trial, a, b);
            free(a), free(b);
            check_failures++;
        }
        kiln_graph_free(g), kiln_graph_free(opt);
    }
    CHECK(changed > trials / 2); /* the generator does exercise the passes */
}

int main(void) {
    test_parse_round_trip();
    test_parse_traced();
    test_parse_renumbers();
    test_parse_errors();
    test_cse();
    test_cse_effects();
    test_cse_aliased_captures();
    test_constant_fold();
    test_constant_fold_effects();
    test_simplify_arith();
    test_simplify_movement();
    test_simplify_effects();
    test_pipeline_o1();
    test_levels_keep_the_passes_below();
    test_random_graphs();
    CHECK_DONE();
}
