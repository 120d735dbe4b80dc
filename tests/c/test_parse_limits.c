/* Hostile input never crashes: the graph text parser bounds nesting, shapes, constants and value
 * ids (clean KILN_ERR_VALUE naming the line); kiln_shape_numel_checked refuses shapes whose sizes
 * overflow; read-only tensors and broadcast views are never written in place; the thread count
 * is range-checked. Runs under ASan/UBSan too, where a stack overflow or a signed overflow fails. */
#include "check.h"

#include "kiln/graph.h"

#include <stdint.h>

/* "graph() {...} subgraph 0: graph() {...} ..." with `depth` subgraphs each nested in the one
 * before (a subgraph block belongs to the innermost graph whose next index it carries). */
static char *nested_text(int depth) {
    const char *top = "graph(%0: float32[2]) {\n  return (%0)\n}\n";
    const char *sub = "subgraph 0: graph(%0: float32[2]) {\n  return (%0)\n}\n";
    size_t n = strlen(top) + (size_t)depth * strlen(sub) + 1;
    char *text = malloc(n), *w = text;
    if (!text) exit(2);
    w += sprintf(w, "%s", top);
    for (int k = 0; k < depth; k++) w += sprintf(w, "%s", sub);
    return text;
}

static void expect_error(const char *text, const char *want) {
    kiln_graph *g = NULL;
    CHECK_STATUS(kiln_graph_parse(text, &g), KILN_ERR_VALUE);
    CHECK(g == NULL);
    if (!strstr(kiln_last_error(), want)) {
        fprintf(stderr, "  message: %s\n  expected it to contain: %s\n", kiln_last_error(), want);
        CHECK(0);
    }
    kiln_graph_free(g);
}

static void test_nesting(void) {
    /* the limit itself parses */
    char *ok = nested_text(KILN_GRAPH_TEXT_MAX_DEPTH);
    kiln_graph *g = NULL;
    CHECK_OK(kiln_graph_parse(ok, &g));
    int depth = 0;
    for (const kiln_graph *s = g; s && s->nsubgraphs; s = s->subgraphs[0]) depth++;
    CHECK(depth == KILN_GRAPH_TEXT_MAX_DEPTH);
    kiln_graph_free(g);
    free(ok);
    /* one more, and 30,000 (a stack overflow before the limit), fail cleanly */
    char buf[64];
    snprintf(buf, sizeof buf, "line %d: subgraphs nested more than %d deep", 3 * KILN_GRAPH_TEXT_MAX_DEPTH + 4,
             KILN_GRAPH_TEXT_MAX_DEPTH);
    char *over = nested_text(KILN_GRAPH_TEXT_MAX_DEPTH + 1);
    expect_error(over, buf);
    free(over);
    char *deep = nested_text(30000);
    expect_error(deep, "nested more than");
    free(deep);
}

static void test_shapes(void) {
    /* a product of dimensions that overflows int64 (and one that wraps to a small number) */
    expect_error("graph(%0: float32[4294967296, 4294967296]) {\n  return (%0)\n}\n",
                 "graph text line 1: shape (4294967296, 4294967296) is too large");
    expect_error("graph(%0: float32[2, 3]) {\n"
                 "  %1: float32[4611686018427387904, 4] = reshape(%0) {4611686018427387904, 4}\n"
                 "  return (%1)\n"
                 "}\n",
                 "line 2");
    expect_error("graph(%0: float32[0, 1099511627776, 1099511627776]) {\n  return (%0)\n}\n", "is too large");
    expect_error("graph(%0: float32[99999999999999999999]) {\n  return (%0)\n}\n", "line 1: expected an integer");
    expect_error("graph(%0: float32[-1]) {\n  return (%0)\n}\n", "line 1: negative dimension");
    expect_error("graph(%0: float32[1, 1, 1, 1, 1, 1, 1, 1, 1]) {\n  return (%0)\n}\n", "line 1: more than 8 dimensions");
    /* a full with huge attributes: the node's inferred shape is refused */
    expect_error("graph() {\n"
                 "  %0: float32[1099511627776, 1099511627776] = full() {6, 2, 1099511627776, 1099511627776; 0}\n"
                 "  return (%0)\n"
                 "}\n",
                 "line 2");
}

static void test_constants(void) {
    /* at the limit: allocated; past it: refused before anything is allocated */
    kiln_graph *g = NULL;
    CHECK_OK(kiln_graph_parse("graph() {\n  %0: int8[16777216] = constant(1)\n  return (%0)\n}\n", &g));
    kiln_graph_free(g);
    expect_error("graph() {\n  %0: float32[1048576, 1048576] = constant(1)\n  return (%0)\n}\n",
                 "line 2: a constant declared in text holds at most 16777216 elements, this one 1099511627776");
    expect_error("graph() {\n  %0: float64[16777217] = parameter\n  return (%0)\n}\n", "line 2: a parameter");
    expect_error("graph() {\n  %0: float32[1099511627776] = captured\n  return (%0)\n}\n", "line 2: a captured");
    /* a value id that would size the id map past the limit */
    expect_error("graph() {\n  %1048576: float32[] = constant(1)\n  return (%1048576)\n}\n",
                 "line 2: value id %1048576 out of range (a graph text holds at most 1048576 values)");
}

static void test_shape_numel_checked(void) {
    int64_t n = -1;
    CHECK_OK(kiln_shape_numel_checked(2, (const int64_t[]){3, 4}, &n));
    CHECK(n == 12);
    CHECK_OK(kiln_shape_numel_checked(0, NULL, &n));
    CHECK(n == 1);
    CHECK_OK(kiln_shape_numel_checked(2, (const int64_t[]){0, 1 << 20}, &n));
    CHECK(n == 0);
    CHECK_OK(kiln_shape_numel_checked(1, (const int64_t[]){KILN_MAX_NUMEL}, &n));
    CHECK(n == KILN_MAX_NUMEL);
    CHECK_STATUS(kiln_shape_numel_checked(1, (const int64_t[]){KILN_MAX_NUMEL + 1}, &n), KILN_ERR_VALUE);
    CHECK_STATUS(kiln_shape_numel_checked(2, (const int64_t[]){(int64_t)1 << 40, (int64_t)1 << 40}, &n), KILN_ERR_VALUE);
    CHECK(strstr(kiln_last_error(), "shape (1099511627776, 1099511627776) is too large"));
    /* (2^32 + 1) * (2^32 - 1) wraps to -1 in 64 bits; 2^62 * 4 wraps to 0 */
    CHECK_STATUS(kiln_shape_numel_checked(2, (const int64_t[]){((int64_t)1 << 32) + 1, ((int64_t)1 << 32) - 1}, &n),
                 KILN_ERR_VALUE);
    CHECK_STATUS(kiln_shape_numel_checked(2, (const int64_t[]){(int64_t)1 << 62, 4}, &n), KILN_ERR_VALUE);
    CHECK_STATUS(kiln_shape_numel_checked(3, (const int64_t[]){0, INT64_MAX, INT64_MAX}, &n), KILN_ERR_VALUE);
    CHECK_STATUS(kiln_shape_numel_checked(2, (const int64_t[]){2, -3}, &n), KILN_ERR_VALUE);
    CHECK(strstr(kiln_last_error(), "negative dimension in shape (2, -3)"));
    CHECK_STATUS(kiln_shape_numel_checked(KILN_MAX_DIMS + 1, (const int64_t[KILN_MAX_DIMS + 1]){0}, &n), KILN_ERR_VALUE);
    /* tensor creation goes through it */
    kiln_tensor *t = NULL;
    CHECK_STATUS(kiln_tensor_empty(KILN_DTYPE_FLOAT32, 2, (const int64_t[]){(int64_t)1 << 40, (int64_t)1 << 40}, &t),
                 KILN_ERR_VALUE);
    CHECK(t == NULL);
}

static void noop_release(void *ctx) { (void)ctx; }

static void test_read_only(void) {
    static const float data[4] = {1, 2, 3, 4};
    kiln_tensor *t = NULL, *v = NULL, *out = NULL, *e = NULL;
    CHECK_OK(kiln_tensor_wrap(KILN_DTYPE_FLOAT32, 1, (const int64_t[]){4}, NULL, (void *)data, noop_release, NULL, &t));
    CHECK(!kiln_tensor_is_read_only(t));
    kiln_tensor_set_read_only(t);
    CHECK(kiln_tensor_is_read_only(t));
    v = tensor_f32(1, (const int64_t[]){1}, (const float[]){9});
    /* slice_assign over all of t (ops.def: i[d] = start, i[8+d] = step, i[16+d] = length) */
    kiln_attrs a = {0};
    a.ni = 24;
    a.i[0] = 0, a.i[8] = 1, a.i[16] = 4;
    int64_t version = kiln_tensor_version(t);
    kiln_status s = kiln_apply2(KILN_OP_SLICE_ASSIGN, t, v, &a, &out);
    CHECK(s == KILN_ERR_VALUE && strstr(kiln_last_error(), "assignment destination is read-only"));
    CHECK(out == NULL);
    CHECK(data[0] == 1 && data[3] == 4);
    CHECK(kiln_tensor_version(t) == version);
    /* a view shares the flag */
    kiln_tensor *view = NULL;
    CHECK_OK(kiln_tensor_view(t, 1, (const int64_t[]){2}, NULL, 1, &view));
    CHECK(view && kiln_tensor_is_read_only(view));
    kiln_tensor_release(view);
    /* a broadcast view overlaps */
    kiln_tensor *w = tensor_f32(2, (const int64_t[]){1, 3}, NULL);
    CHECK_OK(kiln_tensor_view(w, 2, (const int64_t[]){4, 3}, (const int64_t[]){0, 1}, 0, &e));
    CHECK(e && kiln_tensor_overlaps(e) && !kiln_tensor_overlaps(w) && !kiln_tensor_is_read_only(e));
    a.i[16] = 4, a.i[17] = 3, a.i[9] = 1;
    s = kiln_apply2(KILN_OP_SLICE_ASSIGN, e, v, &a, &out);
    CHECK(s == KILN_ERR_VALUE && strstr(kiln_last_error(), "is a broadcast view of shape (4, 3)"));
    CHECK(out == NULL);
    kiln_tensor_release(e), kiln_tensor_release(w), kiln_tensor_release(v), kiln_tensor_release(t);
}

static void test_threads(void) {
    int before = kiln_num_threads();
    CHECK_STATUS(kiln_set_num_threads(0), KILN_ERR_VALUE);
    CHECK_STATUS(kiln_set_num_threads(100000), KILN_ERR_VALUE);
    CHECK(strstr(kiln_last_error(), "between 1 and 1024, got 100000"));
    CHECK_STATUS(kiln_set_num_threads((int64_t)1 << 40), KILN_ERR_VALUE);
    CHECK_STATUS(kiln_set_num_threads(((int64_t)1 << 32) + 3), KILN_ERR_VALUE);
    CHECK(kiln_num_threads() == before);
    CHECK_OK(kiln_set_num_threads(before));
}

int main(void) {
    test_nesting();
    test_shapes();
    test_constants();
    test_shape_numel_checked();
    test_read_only();
    test_threads();
    CHECK_DONE();
}
