/* Bodies: the subgraphs nodes name by attrs are looked up through kiln_graph_body, which checks the
 * index against the graph's subgraph count. Attributes naming no subgraph (out of range, negative,
 * too few ints) give a clear error, in the lookup itself and in everything built on it (compiling,
 * the text and dot forms, eager kiln_apply of control-flow ops), never a read out of range. */
#include "check.h"
#include "core/internal.h"
#include "ir/body.h"
#include "ir/control.h"

/* x doubles while sum(x) < limit */
static const char *loop_text =
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
    "  %2: float32[3] = add(%0, %0)\n"
    "  return (%2)\n"
    "}\n";

static kiln_graph *parse(const char *text) {
    kiln_graph *g = NULL;
    CHECK_OK(kiln_graph_parse(text, &g));
    return g;
}

static int32_t find_node(const kiln_graph *g, kiln_op op) {
    for (int32_t i = 0; i < g->nnodes; i++)
        if (g->nodes[i].op == op) return i;
    return -1;
}

static void test_layout_names(void) {
    /* the names ops.def's KILN_ATTRS lines give are the positions the kernels read */
    CHECK(KILN_A_REDUCE_AXES == 0 && KILN_A_REDUCE_KEEPDIMS == 1 && KILN_A_REDUCE_CORRECTION == 2);
    CHECK(KILN_A_CONV_GROUPS == 8 && KILN_A_CONV_SHAPE == 9 && KILN_A_CONV_WINOGRAD == 13 && KILN_A_CONV_NI == 14);
    CHECK(KILN_A_CONV2D_FUSED_HAS_BIAS == 9 && KILN_A_CONV2D_FUSED_LAYOUT == 12 && KILN_A_CONV2D_FUSED_NI == 14);
    CHECK(KILN_A_CONV2D_FUSED_ACT_MIN == 0 && KILN_A_CONV2D_FUSED_ACT_MAX == 1 && KILN_A_CONV2D_FUSED_NF == 2);
    CHECK(KILN_A_POOL_CEIL_MODE == 10 && KILN_A_POOL_SHAPE == 12 && KILN_A_POOL_NI == 16);
    CHECK(KILN_A_SLICE_START == 0 && KILN_A_SLICE_STEP == KILN_MAX_DIMS && KILN_A_SLICE_LENGTH == 2 * KILN_MAX_DIMS);
    CHECK(KILN_A_FULL_NDIM == 1 && KILN_A_FULL_SHAPE == 2 && KILN_A_FULL_NI == 2 && KILN_A_FULL_VALUE == 0);
    CHECK(KILN_A_WHILE_COND == 0 && KILN_A_WHILE_BODY == 1 && KILN_A_WHILE_NOUT == 2 && KILN_A_WHILE_BACKWARD == 3);
    CHECK(KILN_A_SGD_UPDATE_NESTEROV == 0 && KILN_A_SGD_UPDATE_DAMPENING == 3 && KILN_A_ADAM_UPDATE_WEIGHT_DECAY == 4);
    CHECK(KILN_A_MATMUL_EPILOGUE_STEPS == 3 && KILN_A_BATCH_NORM_EPS == 0 && KILN_A_BATCH_NORM_MOMENTUM == 1);
    /* the bounds-checked readers */
    kiln_attrs a = {.ni = 2, .nf = 1, .i = {6, 1, 99}, .f = {0.5, 7.0}};
    CHECK(kiln_attr_int(&a, KILN_A_REDUCE_KEEPDIMS, -1) == 1);
    CHECK(kiln_attr_int(&a, KILN_A_REDUCE_CORRECTION, -1) == -1); /* past ni: absent, not the stale 99 */
    CHECK(kiln_attr_int(&a, -1, -5) == -5 && kiln_attr_int(NULL, 0, -7) == -7);
    CHECK(kiln_attr_float(&a, 0, 0.0) == 0.5 && kiln_attr_float(&a, 1, -1.0) == -1.0);
}

static void test_body_lookup(void) {
    kiln_graph *g = parse(loop_text);
    if (!g) return;
    int32_t w = find_node(g, KILN_OP_WHILE);
    CHECK(w >= 0);
    kiln_node *n = &g->nodes[w];
    kiln_graph *b = NULL;
    CHECK(kiln_op_nbodies(KILN_OP_WHILE) == 2 && kiln_op_nbodies(KILN_OP_WHILE_GRAD) == 3);
    CHECK(kiln_op_nbodies(KILN_OP_FUSED) == 1 && kiln_op_nbodies(KILN_OP_ADD) == 0);
    CHECK(kiln_op_body_attr(KILN_OP_WHILE_GRAD, 2) == KILN_A_WHILE_BACKWARD && kiln_op_body_attr(KILN_OP_IF, 2) == -1);
    CHECK_OK(kiln_graph_body(g, n, 0, &b));
    CHECK(b == g->subgraphs[0]);
    CHECK_OK(kiln_graph_body(g, n, 1, &b));
    CHECK(b == g->subgraphs[1]);

    /* no body 2 for while; none for add */
    CHECK_STATUS(kiln_graph_body(g, n, 2, &b), KILN_ERR_VALUE);
    CHECK(b == NULL && strstr(kiln_last_error(), "while: has no subgraph 2"));
    int32_t idx = -1;
    CHECK_STATUS(kiln_graph_body_index(g, KILN_OP_ADD, &n->attrs, 0, &idx), KILN_ERR_VALUE);
    CHECK(idx == -1 && strstr(kiln_last_error(), "add: has no subgraph 0"));

    /* an index past the graph's subgraphs, and a negative one */
    n->attrs.i[KILN_A_WHILE_BODY] = 7;
    CHECK_STATUS(kiln_graph_body(g, n, 1, &b), KILN_ERR_VALUE);
    CHECK(strstr(kiln_last_error(), "while names subgraph 7, which does not exist (its body subgraph; the graph has 2)"));
    CHECK_STATUS(kiln_graph_body_index(g, n->op, &n->attrs, 1, &idx), KILN_ERR_VALUE);
    n->attrs.i[KILN_A_WHILE_COND] = -1;
    CHECK_STATUS(kiln_graph_body(g, n, 0, &b), KILN_ERR_VALUE);
    CHECK(strstr(kiln_last_error(), "while names subgraph -1, which does not exist (its cond subgraph"));

    /* too few ints to name the body */
    n->attrs.i[KILN_A_WHILE_COND] = 0, n->attrs.i[KILN_A_WHILE_BODY] = 1;
    n->attrs.ni = 1;
    CHECK_STATUS(kiln_graph_body(g, n, 1, &b), KILN_ERR_VALUE);
    CHECK(strstr(kiln_last_error(), "while: malformed attributes: 1 ints, the body subgraph is named by int 1"));
    CHECK_OK(kiln_graph_body(g, n, 0, &b)); /* the cond is still named */
    CHECK_STATUS(kiln_graph_body(g, NULL, 0, &b), KILN_ERR_VALUE);
    kiln_graph_free(g);
}

/* A graph whose while names a subgraph it does not have fails to compile with the lookup's error;
 * its text and dot forms are still made. */
static void test_users_report_missing_bodies(void) {
    kiln_graph *g = parse(loop_text);
    if (!g) return;
    int32_t w = find_node(g, KILN_OP_WHILE);
    g->nodes[w].attrs.i[KILN_A_WHILE_BODY] = 5;
    kiln_executable *e = NULL;
    kiln_status s = kiln_compile(g, NULL, &e);
    CHECK(s == KILN_ERR_VALUE && e == NULL);
    CHECK(strstr(kiln_last_error(), "while names subgraph 5, which does not exist"));
    char *dot = kiln_graph_to_dot(g);
    CHECK(dot && strstr(dot, "cond")); /* the body that exists is drawn, the missing one left out */
    free(dot);
    char *text = kiln_graph_to_string(g);
    CHECK(text && strstr(text, "while(%0, %1) {0, 5, 1}"));
    free(text);
    kiln_graph_free(g);
}

/* Eagerly, control-flow attrs name registered bodies: unknown ids and short attrs are errors. */
static void test_eager_apply_checks_bodies(void) {
    int64_t shape[1] = {3};
    kiln_tensor *x = NULL, *limit = NULL, *out[1] = {NULL};
    CHECK_OK(kiln_tensor_empty(KILN_DTYPE_FLOAT32, 1, shape, &x));
    CHECK_OK(kiln_tensor_empty(KILN_DTYPE_FLOAT32, 0, NULL, &limit));
    if (!x || !limit) return;
    kiln_tensor *in[2] = {x, limit};
    kiln_attrs a = {.ni = KILN_A_WHILE_NI - 1};
    a.i[KILN_A_WHILE_COND] = 123456789, a.i[KILN_A_WHILE_BODY] = 123456790, a.i[KILN_A_WHILE_NOUT] = 1;
    CHECK_STATUS(kiln_apply(KILN_OP_WHILE, 2, in, &a, out), KILN_ERR_VALUE);
    CHECK(out[0] == NULL && strstr(kiln_last_error(), "no registered body 123456789"));
    a.ni = 1; /* names the cond only */
    CHECK_STATUS(kiln_apply(KILN_OP_WHILE, 2, in, &a, out), KILN_ERR_VALUE);
    CHECK(out[0] == NULL && strstr(kiln_last_error(), "while: malformed attributes"));
    CHECK(kiln_body_of(KILN_OP_WHILE, &a, 1) == NULL);
    CHECK(strstr(kiln_last_error(), "the body subgraph is named by int 1"));
    kiln_tensor_release(x);
    kiln_tensor_release(limit);
}

int main(void) {
    test_layout_names();
    test_body_lookup();
    test_users_report_missing_bodies();
    test_eager_apply_checks_bodies();
    CHECK_DONE();
}
