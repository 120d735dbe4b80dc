/* Graph IR, tracing and the kbk executor: built graphs run like eager code, the memory plan
 * reuses buffers without aliasing live ones (checked with poisoning), orders are valid. */
#include "check.h"
#include "core/internal.h"

static kiln_tensor *filled(int64_t n, float base) {
    kiln_tensor *t = tensor_f32(1, &n, NULL);
    for (int64_t i = 0; i < n; i++) ((float *)t->data)[i] = base + 0.001f * (float)i;
    return t;
}

/* y = exp(((x * 2) + x) * x) - x, a chain whose buffers can be reused */
static void test_chain_plan_and_run(int order, int poison) {
    int64_t n = 1000;
    kiln_tensor *x = filled(n, -1.0f);
    kiln_tracer *tr = NULL;
    CHECK_OK(kiln_tracer_begin(&tr));
    CHECK_OK(kiln_tracer_add_input(tr, x));
    kiln_tensor *two = NULL, *a = NULL, *b = NULL, *c = NULL, *d = NULL, *y = NULL;
    CHECK_OK(kiln_emit_scalar(2.0, KILN_DTYPE_FLOAT32, &two));
    CHECK_OK(kiln_apply2(KILN_OP_MUL, x, two, NULL, &a));
    CHECK_OK(kiln_apply2(KILN_OP_ADD, a, x, NULL, &b));
    CHECK_OK(kiln_apply2(KILN_OP_MUL, b, x, NULL, &c));
    CHECK_OK(kiln_apply1(KILN_OP_EXP, c, NULL, &d));
    CHECK_OK(kiln_apply2(KILN_OP_SUB, d, x, NULL, &y));
    kiln_tracer_end(tr);
    int32_t out;
    CHECK_OK(kiln_tracer_value_of(tr, y, &out));
    kiln_graph *g = kiln_tracer_graph(tr);
    CHECK_OK(kiln_graph_set_outputs(g, 1, &out));
    CHECK_OK(kiln_graph_verify(g));
    char *text = kiln_graph_to_string(g);
    CHECK(text && strstr(text, "= exp(") && strstr(text, "= full()") && strstr(text, "return ("));
    free(text);
    kiln_compile_options opt = {order ? KILN_ORDER_DFS : KILN_ORDER_BFS, poison, "kbk"};
    kiln_executable *e = NULL;
    CHECK_OK(kiln_compile(g, &opt, &e));
    /* five intermediates of 4000 bytes; reuse and in-place keep the arena well below that */
    CHECK(e && kiln_executable_arena_bytes(e) <= 2 * 4096);
    for (int run = 0; run < 3 && e; run++) {
        kiln_tensor *x2 = filled(n, -1.0f + 0.5f * (float)run), *got = NULL, *want = NULL;
        CHECK_OK(kiln_executable_run(e, 1, &x2, 1, &got));
        float *px = x2->data;
        CHECK_OK(kiln_tensor_empty(KILN_DTYPE_FLOAT32, 1, &n, &want));
        for (int64_t i = 0; i < n; i++) ((float *)want->data)[i] = expf((px[i] * 2 + px[i]) * px[i]) - px[i];
        CHECK(got && close_f32(got->data, want->data, n, 1e-5f));
        kiln_tensor_release(x2), kiln_tensor_release(got), kiln_tensor_release(want);
    }
    kiln_executable_free(e);
    kiln_tracer_free(tr);
    kiln_tensor_release(x), kiln_tensor_release(two), kiln_tensor_release(a), kiln_tensor_release(b);
    kiln_tensor_release(c), kiln_tensor_release(d), kiln_tensor_release(y);
}

/* Two branches joined late: every intermediate stays live until the join. */
static void test_branches_poisoned(void) {
    int64_t n = 64;
    kiln_graph *g = NULL;
    CHECK_OK(kiln_graph_new(&g));
    kiln_meta m = {.dtype = KILN_DTYPE_FLOAT32, .ndim = 1, .shape = {n}};
    int32_t x, e1, e2, s1, s2, j, y;
    CHECK_OK(kiln_graph_add_input(g, &m, &x));
    CHECK_OK(kiln_graph_add_node(g, KILN_OP_EXP, 1, &x, NULL, -1, &e1));
    CHECK_OK(kiln_graph_add_node(g, KILN_OP_SIN, 1, &x, NULL, -1, &e2));
    CHECK_OK(kiln_graph_add_node(g, KILN_OP_TANH, 1, &e1, NULL, -1, &s1));
    CHECK_OK(kiln_graph_add_node(g, KILN_OP_COS, 1, &e2, NULL, -1, &s2));
    int32_t pair[2] = {s1, s2};
    CHECK_OK(kiln_graph_add_node(g, KILN_OP_MUL, 2, pair, NULL, -1, &j));
    int32_t pair2[2] = {j, e1};
    CHECK_OK(kiln_graph_add_node(g, KILN_OP_ADD, 2, pair2, NULL, -1, &y));
    CHECK_OK(kiln_graph_set_outputs(g, 1, &y));
    for (int order = 0; order < 2; order++) {
        kiln_compile_options opt = {order ? KILN_ORDER_DFS : KILN_ORDER_BFS, true, "kbk"};
        kiln_executable *e = NULL;
        CHECK_OK(kiln_compile(g, &opt, &e));
        char *ord = e ? kiln_executable_order_string(e) : NULL;
        CHECK(ord && (order ? strcmp(ord, "exp tanh sin cos mul add") == 0 : strcmp(ord, "exp sin tanh cos mul add") == 0));
        free(ord);
        kiln_tensor *xt = filled(n, -2.0f), *got = NULL;
        CHECK_OK(kiln_executable_run(e, 1, &xt, 1, &got));
        float *px = xt->data;
        int bad = 0;
        for (int64_t i = 0; got && i < n; i++) {
            float ex = expf(px[i]), want = tanhf(ex) * cosf(sinf(px[i])) + ex;
            if (fabsf(((float *)got->data)[i] - want) > 1e-5f * (1 + fabsf(want))) bad++;
        }
        CHECK(got && bad == 0);
        kiln_tensor_release(xt), kiln_tensor_release(got);
        kiln_executable_free(e);
    }
    kiln_graph_free(g);
}

static void test_verifier_and_errors(void) {
    kiln_graph *g = NULL;
    CHECK_OK(kiln_graph_new(&g));
    kiln_meta m = {.dtype = KILN_DTYPE_FLOAT32, .ndim = 2, .shape = {2, 3}};
    kiln_meta m2 = {.dtype = KILN_DTYPE_FLOAT32, .ndim = 1, .shape = {4}};
    int32_t a, b, c;
    CHECK_OK(kiln_graph_add_input(g, &m, &a));
    CHECK_OK(kiln_graph_add_input(g, &m2, &b));
    int32_t ab[2] = {a, b};
    CHECK_STATUS(kiln_graph_add_node(g, KILN_OP_ADD, 2, ab, NULL, -1, &c), KILN_ERR_VALUE);
    CHECK(strstr(kiln_last_error(), "add") && strstr(kiln_last_error(), "(2, 3)") && strstr(kiln_last_error(), "(4,)"));
    int32_t aa[2] = {a, 99};
    CHECK_STATUS(kiln_graph_add_node(g, KILN_OP_ADD, 2, aa, NULL, -1, &c), KILN_ERR_VALUE);
    CHECK_OK(kiln_graph_add_node(g, KILN_OP_NEG, 1, &a, NULL, -1, &c));
    g->nodes[0].in[0] = c; /* break SSA: the node now uses its own output */
    CHECK_STATUS(kiln_graph_verify(g), KILN_ERR_VALUE);
    CHECK(strstr(kiln_last_error(), "before it is defined"));
    g->nodes[0].in[0] = a;
    CHECK_OK(kiln_graph_set_outputs(g, 1, &c));
    kiln_executable *e = NULL;
    CHECK_OK(kiln_compile(g, NULL, &e));
    kiln_tensor *wrong = NULL, *got = NULL, *ins[2];
    int64_t s33[2] = {3, 3};
    CHECK_OK(kiln_tensor_zeros(KILN_DTYPE_FLOAT32, 2, s33, &wrong));
    ins[0] = wrong;
    ins[1] = wrong;
    CHECK_STATUS(kiln_executable_run(e, 2, ins, 1, &got), KILN_ERR_VALUE);
    CHECK(strstr(kiln_last_error(), "(3, 3)") && strstr(kiln_last_error(), "(2, 3)"));
    kiln_tensor_release(wrong);
    kiln_executable_free(e);
    kiln_graph_free(g);
}


/* Text printed from a graph reads back as the same graph: scalar constants of every dtype keep
 * their exact value (float64 in up to 17 digits, int64 beyond 2^53, NaN and infinities), and so
 * do float attributes. */
static void parse_print_parse(const char *text, double want0, int64_t want_int) {
    kiln_graph *g = NULL, *again = NULL;
    CHECK_OK(kiln_graph_parse(text, &g));
    if (!g) return;
    char *printed = kiln_graph_to_string(g);
    CHECK_OK(kiln_graph_parse(printed, &again));
    if (again) {
        CHECK(g->ncaptures == again->ncaptures && g->nnodes == again->nnodes);
        for (int32_t c = 0; c < g->ncaptures && c < again->ncaptures; c++) {
            const kiln_tensor *x = g->values[g->captures[c]].bound, *y = again->values[again->captures[c]].bound;
            CHECK(x->meta.dtype == y->meta.dtype &&
                  memcmp(x->data, y->data, (size_t)kiln_dtype_size(x->meta.dtype)) == 0);
        }
        for (int32_t i = 0; i < g->nnodes && i < again->nnodes; i++) {
            const kiln_attrs *x = &g->nodes[i].attrs, *y = &again->nodes[i].attrs;
            CHECK(x->nf == y->nf && memcmp(x->f, y->f, sizeof x->f[0] * (size_t)x->nf) == 0);
        }
        const kiln_tensor *first = again->values[again->captures[0]].bound;
        if (kiln_dtype_is_float(first->meta.dtype)) {
            double got = kiln_tensor_get_double(first, 0);
            CHECK(isnan(want0) ? isnan(got) : got == want0);
        } else {
            CHECK(*(const int64_t *)first->data == want_int);
        }
    }
    if (!again) fprintf(stderr, "printed text did not parse:\n%s", printed ? printed : "(null)\n");
    free(printed);
    kiln_graph_free(again);
    kiln_graph_free(g);
}

static void test_text_round_trip(void) {
    parse_print_parse("graph() {\n  %0: float64[] = constant(4.4444444444444445e+122)\n  return (%0)\n}\n",
                      4.4444444444444445e+122, 0);
    parse_print_parse("graph() {\n  %0: float64[] = constant(0.1)\n  %1: float64[] = constant(0.30000000000000004)\n"
                      "  %2: float64[] = add(%0, %1)\n  return (%2)\n}\n", 0.1, 0);
    parse_print_parse("graph() {\n  %0: float32[] = constant(7.38905621)\n  return (%0)\n}\n", (double)7.38905621f, 0);
    parse_print_parse("graph() {\n  %0: float64[] = constant(nan)\n  %1: float64[] = constant(-inf)\n"
                      "  %2: float64[] = add(%0, %1)\n  return (%2)\n}\n", NAN, 0);
    parse_print_parse("graph() {\n  %0: int64[] = constant(1152921504606846977)\n  return (%0)\n}\n", 0,
                      1152921504606846977LL);
    parse_print_parse("graph() {\n  %0: int64[] = constant(-9223372036854775807)\n  return (%0)\n}\n", 0,
                      -9223372036854775807LL);
    parse_print_parse("graph(%0: float32[4]) {\n  %1: float64[] = constant(1e-300)\n"
                      "  %2: float32[4] = clamp(%0) {; 0.33333333333333331, 6.0000000000000009}\n  return (%2)\n}\n",
                      1e-300, 0);
}

int main(void) {
    for (int order = 0; order < 2; order++)
        for (int poison = 0; poison < 2; poison++) test_chain_plan_and_run(order, poison);
    test_branches_poisoned();
    test_verifier_and_errors();
    test_text_round_trip();
    CHECK_DONE();
}
