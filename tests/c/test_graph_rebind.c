/* kiln_graph_rebind: a recorded graph for other input shapes. Metas follow the new shapes, the
 * given attribute sets replace the sizes reshape holds (a value, an input size, the rest), the
 * rebound graph runs like the same ops applied eagerly at the new shapes, and a node keeping sizes
 * with no set, or an inference that fails, is refused with a message naming the node. */
#include "check.h"
#include "core/internal.h"

/* y = reshape(x * x + 1, (cols, rows)) recorded for x of shape (rows, cols) */
static kiln_graph *record(int64_t rows, int64_t cols) {
    kiln_graph *g = NULL;
    CHECK_OK(kiln_graph_new(&g));
    kiln_meta m = {.dtype = KILN_DTYPE_FLOAT32, .ndim = 2, .shape = {rows, cols}};
    int32_t x, sq, one, sum, y;
    CHECK_OK(kiln_graph_add_input(g, &m, &x));
    int32_t in2[2] = {x, x};
    CHECK_OK(kiln_graph_add_node(g, KILN_OP_MUL, 2, in2, NULL, -1, &sq));
    float v = 1.0f;
    kiln_tensor *c = tensor_f32(0, NULL, &v);
    CHECK_OK(kiln_graph_add_capture(g, c, true, &one));
    kiln_tensor_release(c);
    int32_t in3[2] = {sq, one};
    CHECK_OK(kiln_graph_add_node(g, KILN_OP_ADD, 2, in3, NULL, -1, &sum));
    kiln_attrs a;
    kiln_attrs_clear(&a);
    kiln_attrs_push_int(&a, cols);
    kiln_attrs_push_int(&a, rows);
    CHECK_OK(kiln_graph_add_node(g, KILN_OP_RESHAPE, 1, &sum, &a, -1, &y));
    CHECK_OK(kiln_graph_set_outputs(g, 1, &y));
    return g;
}

static void test_rebound_graph_runs_at_the_new_shape(void) {
    kiln_graph *g = record(2, 3), *r = NULL;
    kiln_meta m = {.dtype = KILN_DTYPE_FLOAT32, .ndim = 2, .shape = {4, 5}};
    /* reshape (node 2): i[0] = input size 1 (5), i[1] = the rest (20 / 5 = 4) */
    kiln_attr_set sets[2] = {{2, 0, KILN_ATTR_SET_DIM, 1}, {2, 1, KILN_ATTR_SET_REST, 0}};
    CHECK_OK(kiln_graph_rebind(g, &m, 2, sets, &r));
    CHECK(r && r->values[r->outputs[0]].meta.shape[0] == 5 && r->values[r->outputs[0]].meta.shape[1] == 4);
    CHECK(g->values[g->outputs[0]].meta.shape[0] == 3); /* the recording is unchanged */
    if (r) CHECK_OK(kiln_graph_verify(r));
    kiln_executable *e = NULL;
    if (r) CHECK_OK(kiln_compile(r, NULL, &e));
    int64_t shape[2] = {4, 5};
    float xv[20], want[20];
    for (int i = 0; i < 20; i++) xv[i] = 0.25f * (float)i - 2.0f, want[i] = xv[i] * xv[i] + 1.0f;
    kiln_tensor *x = tensor_f32(2, shape, xv), *y = NULL;
    if (e) CHECK_OK(kiln_executable_run(e, 1, &x, 1, &y));
    CHECK(y && y->meta.shape[0] == 5 && y->meta.shape[1] == 4 && close_f32(y->data, want, 20, 1e-6f));
    kiln_tensor_release(x), kiln_tensor_release(y);
    kiln_executable_free(e);
    kiln_graph_free(r);
    /* the same shape with explicit values */
    kiln_attr_set vals[2] = {{2, 0, KILN_ATTR_SET_VALUE, 10}, {2, 1, KILN_ATTR_SET_VALUE, 2}};
    CHECK_OK(kiln_graph_rebind(g, &m, 2, vals, &r));
    CHECK(r && r->values[r->outputs[0]].meta.shape[0] == 10);
    kiln_graph_free(r);
    kiln_graph_free(g);
}

static void test_refusals_name_the_node(void) {
    kiln_graph *g = record(2, 3), *r = (kiln_graph *)1;
    kiln_meta m = {.dtype = KILN_DTYPE_FLOAT32, .ndim = 2, .shape = {4, 5}};
    CHECK_STATUS(kiln_graph_rebind(g, &m, 0, NULL, &r), KILN_ERR_VALUE); /* reshape keeps (3, 2) */
    CHECK(r == NULL && strstr(kiln_last_error(), "node 2 (reshape)"));
    kiln_attr_set bad[1] = {{2, 0, KILN_ATTR_SET_VALUE, 7}}; /* 7 * 2 != 20 elements */
    CHECK_STATUS(kiln_graph_rebind(g, &m, 1, bad, &r), KILN_ERR_VALUE);
    CHECK(strstr(kiln_last_error(), "rebind: node 2") && strstr(kiln_last_error(), "reshape"));
    kiln_attr_set rest[2] = {{2, 0, KILN_ATTR_SET_VALUE, 3}, {2, 1, KILN_ATTR_SET_REST, 0}}; /* 20 / 3 */
    CHECK_STATUS(kiln_graph_rebind(g, &m, 2, rest, &r), KILN_ERR_VALUE);
    CHECK(strstr(kiln_last_error(), "do not divide"));
    kiln_meta rank = {.dtype = KILN_DTYPE_FLOAT32, .ndim = 1, .shape = {6}};
    CHECK_STATUS(kiln_graph_rebind(g, &rank, 0, NULL, &r), KILN_ERR_VALUE);
    CHECK(strstr(kiln_last_error(), "input 0 must keep its dtype and 2 dimensions"));
    /* same shapes: nothing changed, no set needed */
    kiln_meta same = {.dtype = KILN_DTYPE_FLOAT32, .ndim = 2, .shape = {2, 3}};
    CHECK_OK(kiln_graph_rebind(g, &same, 0, NULL, &r));
    kiln_graph_free(r);
    kiln_graph_free(g);
}

/* while(i = 0, v, w): i < 3 ? (i + 1, v + w); recorded for (2, 3) values */
#define LOOP_BODIES                                                                      \
    "subgraph 0: graph(%0: int64[], %1: float32[2, 3], %2: float32[2, 3]) {\n"            \
    "  %3: int64[] = constant(3)\n"                                                      \
    "  %4: bool[] = lt(%0, %3)\n"                                                        \
    "  return (%4)\n"                                                                    \
    "}\n"                                                                                \
    "subgraph 1: graph(%0: int64[], %1: float32[2, 3], %2: float32[2, 3]) {\n"            \
    "  %3: int64[] = constant(1)\n"                                                      \
    "  %4: int64[] = add(%0, %3)\n"                                                      \
    "  %5: float32[2, 3] = add(%1, %2)\n"                                                \
    "  return (%4, %5)\n"                                                                \
    "}\n"

/* A while loop: its subgraphs are rebound to the node's new inputs and the loop runs at the new
 * shape; a body that would change its loop value's shape is refused. */
static void test_loops_are_rebound(void) {
    const char *text =
        "graph(%0: float32[2, 3]) {\n"
        "  %1: int64[] = constant(0)\n"
        "  %2: int64[], %3: float32[2, 3] = while(%1, %0, %0) {0, 1, 2}\n"
        "  return (%3)\n"
        "}\n" LOOP_BODIES;
    kiln_graph *g = NULL, *r = NULL;
    CHECK_OK(kiln_graph_parse(text, &g));
    if (!g) return;
    kiln_meta m = {.dtype = KILN_DTYPE_FLOAT32, .ndim = 2, .shape = {4, 5}};
    CHECK_OK(kiln_graph_rebind(g, &m, 0, NULL, &r));
    if (r) CHECK_OK(kiln_graph_verify(r));
    kiln_executable *e = NULL;
    if (r) CHECK_OK(kiln_compile(r, NULL, &e));
    int64_t shape[2] = {4, 5};
    float xv[20], want[20];
    for (int i = 0; i < 20; i++) xv[i] = 0.5f * (float)i, want[i] = 4.0f * xv[i]; /* x + x + x + x */
    kiln_tensor *x = tensor_f32(2, shape, xv), *y = NULL;
    if (e) CHECK_OK(kiln_executable_run(e, 1, &x, 1, &y));
    CHECK(y && y->meta.shape[0] == 4 && close_f32(y->data, want, 20, 1e-6f));
    kiln_tensor_release(x), kiln_tensor_release(y);
    kiln_executable_free(e);
    kiln_graph_free(r);
    kiln_graph_free(g);
    /* v becomes (4, 5) while the lifted w stays (2, 3): the body's v + w does not broadcast */
    const char *fixed =
        "graph(%0: float32[2, 3], %1: float32[2, 3]) {\n"
        "  %2: int64[] = constant(0)\n"
        "  %3: int64[], %4: float32[2, 3] = while(%2, %0, %1) {0, 1, 2}\n"
        "  return (%4)\n"
        "}\n" LOOP_BODIES;
    CHECK_OK(kiln_graph_parse(fixed, &g));
    kiln_meta two[2] = {m, {.dtype = KILN_DTYPE_FLOAT32, .ndim = 2, .shape = {2, 3}}};
    if (g) CHECK_STATUS(kiln_graph_rebind(g, two, 0, NULL, &r), KILN_ERR_VALUE);
    CHECK(strstr(kiln_last_error(), "rebind: node 0 (while)") && strstr(kiln_last_error(), "cannot be broadcast"));
    kiln_graph_free(g);
}

/* KILN_ATTR_SET_FOLLOW (a backward pass's nodes): a full and a reshape take the sizes of the values
 * they were recorded with (the reshape's with the leading sizes merged); values that now disagree,
 * or none, refuse; on another op the set names nothing. */
static void test_followed_sizes(void) {
    const char *text =
        "graph(%0: float32[2, 3, 4], %1: float32[2, 3, 4]) {\n"
        "  %2: float32[2, 3, 4] = full() {6, 3, 2, 3, 4; 0.5}\n"
        "  %3: float32[2, 3, 4] = add(%0, %2)\n"
        "  %4: float32[6, 4] = reshape(%3) {6, 4}\n"
        "  %5: float32[7] = full() {6, 1, 7; 1}\n"
        "  return (%4, %5)\n"
        "}\n";
    kiln_graph *g = NULL, *r = NULL;
    CHECK_OK(kiln_graph_parse(text, &g));
    if (!g) return;
    kiln_meta m = {.dtype = KILN_DTYPE_FLOAT32, .ndim = 3, .shape = {5, 3, 4}};
    kiln_meta both[2] = {m, m};
    kiln_attr_set follow[3] = {{0, 0, KILN_ATTR_SET_FOLLOW, 0}, {1, 0, KILN_ATTR_SET_FOLLOW, 0},
                               {2, 0, KILN_ATTR_SET_FOLLOW, 0}};
    CHECK_OK(kiln_graph_rebind(g, both, 3, follow, &r));
    const kiln_meta *y = r ? &r->values[r->outputs[0]].meta : NULL;
    CHECK(y && y->ndim == 2 && y->shape[0] == 15 && y->shape[1] == 4);
    CHECK(r && r->nodes[0].attrs.i[2] == 5 && r->values[r->outputs[1]].meta.shape[0] == 7);
    if (r) CHECK_OK(kiln_graph_verify(r));
    kiln_graph_free(r);
    kiln_meta apart[2] = {m, {.dtype = KILN_DTYPE_FLOAT32, .ndim = 3, .shape = {2, 3, 4}}};
    CHECK_STATUS(kiln_graph_rebind(g, apart, 3, follow, &r), KILN_ERR_VALUE);
    CHECK(strstr(kiln_last_error(), "node 0 (full) follows values whose sizes now differ"));
    kiln_attr_set all[4] = {follow[0], follow[1], follow[2], {3, 0, KILN_ATTR_SET_FOLLOW, 0}};
    CHECK_STATUS(kiln_graph_rebind(g, both, 4, all, &r), KILN_ERR_VALUE); /* (7,): no value of that shape */
    CHECK(strstr(kiln_last_error(), "node 3 (full) has no value whose sizes it follows"));
    CHECK_STATUS(kiln_graph_rebind(g, both, 2, follow + 1, &r), KILN_ERR_VALUE); /* the full keeps (2, 3, 4) */
    kiln_graph_free(g);
}

int main(void) {
    test_rebound_graph_runs_at_the_new_shape();
    test_refusals_name_the_node();
    test_loops_are_rebound();
    test_followed_sizes();
    CHECK_DONE();
}
