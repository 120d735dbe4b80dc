/* Comparing recordings (kiln.trace's verification): values compare by what they are, the first
 * difference is named with its op, input and values; which graphs have effects. */
#include "check.h"
#include "ir/compare.h"

static kiln_tensor *scalar(float v) {
    kiln_tensor *t = tensor_f32(0, NULL, &v);
    return t;
}

/* y = exp(x) * <c or x>, with a source location on the mul */
static kiln_graph *build(float c, bool use_constant, bool extra) {
    kiln_graph *g = NULL;
    CHECK_OK(kiln_graph_new(&g));
    kiln_meta m = {.dtype = KILN_DTYPE_FLOAT32, .ndim = 1, .shape = {4}};
    int32_t x, k, e, y, loc;
    kiln_tensor *ct = scalar(c);
    CHECK_OK(kiln_graph_add_input(g, &m, &x));
    CHECK_OK(kiln_graph_add_capture(g, ct, true, &k));
    kiln_tensor_release(ct);
    CHECK_OK(kiln_graph_add_loc(g, "/some/dir/model.py:12", &loc));
    CHECK_OK(kiln_graph_add_node(g, KILN_OP_EXP, 1, &x, NULL, -1, &e));
    int32_t in[2] = {e, use_constant ? k : x};
    CHECK_OK(kiln_graph_add_node(g, KILN_OP_MUL, 2, in, NULL, loc, &y));
    if (extra) CHECK_OK(kiln_graph_add_node(g, KILN_OP_SIN, 1, &y, NULL, loc, &y));
    CHECK_OK(kiln_graph_set_outputs(g, 1, &y));
    return g;
}

static void expect(const kiln_graph *a, const kiln_graph *b, kiln_graph_diff_kind kind, const char *text) {
    static const char *const labels[] = {"x"};
    kiln_graph_diff d;
    bool differs = kiln_graph_diff_ops(a, b, &d) || kiln_graph_diff_outputs(a, b, &d);
    CHECK(differs == (kind != KILN_DIFF_NONE));
    if (!differs) return;
    CHECK(d.kind == kind);
    char *msg = kiln_graph_diff_message(&d, 1, labels);
    CHECK(msg && strcmp(msg, text) == 0);
    if (msg && strcmp(msg, text) != 0) fprintf(stderr, "  got: %s\n want: %s\n", msg, text);
    free(msg);
}

static void test_differences(void) {
    kiln_graph *base = build(2.0f, true, false), *same = build(2.0f, true, false);
    kiln_graph *other_constant = build(3.0f, true, false), *close = build(2.000001f, true, false);
    kiln_graph *argument = build(2.0f, false, false), *longer = build(2.0f, true, true);
    expect(base, same, KILN_DIFF_NONE, NULL);
    expect(base, other_constant, KILN_DIFF_CONSTANT,
           "input 1 of op #1 (mul at model.py:12): a captured constant changed: the trace recorded the constant 2, "
           "this call used the constant 3");
    /* the short forms agree: all digits */
    expect(base, close, KILN_DIFF_CONSTANT,
           "input 1 of op #1 (mul at model.py:12): a captured constant changed: the trace recorded the constant 2, "
           "this call used the constant 2.0000009536743164");
    expect(base, argument, KILN_DIFF_EXTERNAL,
           "input 1 of op #1 (mul at model.py:12) switched between external and internal: the trace recorded "
           "external (the constant 2), this call gave internal (argument x)");
    expect(base, longer, KILN_DIFF_MORE_OPS,
           "more ops than recorded: the trace recorded 2 ops, this call ran 3; the first one not recorded is op #2 "
           "(sin at model.py:12)");
    expect(longer, base, KILN_DIFF_FEWER_OPS,
           "fewer ops than recorded: the trace recorded 3 ops, this call ran only 2; the first one missing is op #2 "
           "(sin at model.py:12)");
    CHECK(kiln_graph_first_reader(base, base->captures[0]) == 1);
    kiln_graph *all[] = {base, same, other_constant, close, argument, longer};
    for (size_t k = 0; k < sizeof all / sizeof all[0]; k++) {
        CHECK(!kiln_graph_has_effects(all[k]));
        kiln_graph_free(all[k]);
    }
}

/* y = x * w with w a captured tensor (not a constant, as a Parameter is); returns (y, w) */
static kiln_graph *build_with_tensor(kiln_tensor *w) {
    kiln_graph *g = NULL;
    CHECK_OK(kiln_graph_new(&g));
    kiln_meta m = {.dtype = KILN_DTYPE_FLOAT32, .ndim = 0};
    int32_t in[2], y, loc;
    CHECK_OK(kiln_graph_add_input(g, &m, &in[0]));
    CHECK_OK(kiln_graph_add_capture(g, w, false, &in[1]));
    CHECK_OK(kiln_graph_add_loc(g, "/some/dir/model.py:7", &loc));
    CHECK_OK(kiln_graph_add_node(g, KILN_OP_MUL, 2, in, NULL, loc, &y));
    int32_t outs[2] = {y, in[1]};
    CHECK_OK(kiln_graph_set_outputs(g, 2, outs));
    return g;
}

/* a sub-Cell or Parameter replaced between calls: the same ops on another tensor of the same type,
 * which the compiled graph (reading the recorded one) would not follow; a tensor the function made
 * (fresh) is compared by its values */
static void test_replaced_tensor(void) {
    kiln_tensor *w = scalar(2.0f), *other = scalar(2.0f), *three = scalar(3.0f);
    kiln_graph *base = build_with_tensor(w), *same = build_with_tensor(w), *replaced = build_with_tensor(other);
    kiln_graph_diff d;
    /* the ops and outputs alike: only the captured tensors tell */
    CHECK(!kiln_graph_diff_ops(base, replaced, &d) && !kiln_graph_diff_outputs(base, replaced, &d));
    CHECK(!kiln_graph_diff_captured(base, same, &d));
    CHECK(kiln_graph_diff_captured(base, replaced, &d) && d.kind == KILN_DIFF_REPLACED && d.node == 0 && d.slot == 1);
    char *msg = kiln_graph_diff_message(&d, 0, NULL);
    const char *want = "input 1 of op #0 (mul at model.py:7): a captured tensor was replaced by another: the trace "
                       "recorded captured tensor #0 (float32[]), this call read another tensor of that type (a "
                       "replaced Parameter, sub-Cell or attribute; the compiled graph would read the recorded one)";
    CHECK(msg && strcmp(msg, want) == 0);
    if (msg && strcmp(msg, want) != 0) fprintf(stderr, "  got: %s\n", msg);
    free(msg);
    /* made by the function at each call: other tensors, compared by value */
    kiln_graph *fresh = build_with_tensor(w), *fresh_same = build_with_tensor(other), *fresh_other = build_with_tensor(three);
    kiln_graph *all_fresh[] = {fresh, fresh_same, fresh_other};
    for (int k = 0; k < 3; k++) all_fresh[k]->values[all_fresh[k]->captures[0]].fresh = true;
    CHECK(!kiln_graph_diff_captured(fresh, fresh_same, &d));
    CHECK(kiln_graph_diff_captured(fresh, fresh_other, &d) && d.kind == KILN_DIFF_REPLACED);
    msg = kiln_graph_diff_message(&d, 0, NULL);
    CHECK(msg && strstr(msg, "a tensor the function made changed value") != NULL);
    free(msg);
    CHECK(kiln_graph_diff_captured(base, fresh, &d)); /* before the call on one side only */
    kiln_graph *graphs[] = {base, same, replaced, fresh, fresh_same, fresh_other};
    for (int k = 0; k < 6; k++) kiln_graph_free(graphs[k]);
    kiln_tensor_release(w), kiln_tensor_release(other), kiln_tensor_release(three);
}

/* batch_norm writes its running statistics only in training; dropout draws random numbers */
static void test_effects(void) {
    for (int training = 0; training < 2; training++) {
        kiln_graph *g = NULL;
        CHECK_OK(kiln_graph_new(&g));
        kiln_meta mx = {.dtype = KILN_DTYPE_FLOAT32, .ndim = 2, .shape = {2, 3}};
        kiln_meta mc = {.dtype = KILN_DTYPE_FLOAT32, .ndim = 1, .shape = {3}};
        int32_t in[5], out[3];
        CHECK_OK(kiln_graph_add_input(g, &mx, &in[0]));
        for (int k = 1; k < 5; k++) CHECK_OK(kiln_graph_add_input(g, &mc, &in[k]));
        kiln_attrs a = {.ni = 1, .nf = 2, .i = {training}, .f = {0.1, 1e-5}};
        CHECK_OK(kiln_graph_add_node(g, KILN_OP_BATCH_NORM, 5, in, &a, -1, out));
        CHECK(kiln_graph_has_effects(g) == (training == 1));
        kiln_attrs p = {.nf = 1, .f = {0.5}};
        CHECK_OK(kiln_graph_add_node(g, KILN_OP_DROPOUT, 1, &in[0], &p, -1, out));
        CHECK(kiln_graph_has_effects(g));
        kiln_graph_free(g);
    }
}

int main(void) {
    test_differences();
    test_replaced_tensor();
    test_effects();
    CHECK_DONE();
}
