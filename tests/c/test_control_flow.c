/* Control-flow nodes: the text form round-trips, verification names mismatched subgraphs, the
 * executor runs if / while (data-dependent trip counts, zero iterations, nesting), run-time
 * errors inside a body name the op and source line, and eager kiln_apply of registered bodies
 * differentiates through a loop. */
#include "check.h"
#include "core/internal.h"
#include "ir/control.h"

/* x doubles while sum(x) < limit */
static const char *doubling_loop =
    "graph(%0: float32[3], %1: float32[]) {\n"
    "  %2: float32[3] = while(%0, %1) {0, 1, 1}  # loop.py:3\n"
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

/* the loop's body branches: x * 2 while sum(x) < 10, else x + 1 */
static const char *nested_loop =
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
    "  %2: float32[] = constant(10)\n"
    "  %3: float32[] = sum(%0) {1, 0}\n"
    "  %4: bool[] = lt(%3, %2)\n"
    "  %5: float32[3] = if(%4, %0) {0, 1, 1}\n"
    "  return (%5)\n"
    "}\n"
    "subgraph 0: graph(%0: float32[3]) {\n"
    "  %1: float32[] = constant(2)\n"
    "  %2: float32[3] = mul(%0, %1)\n"
    "  return (%2)\n"
    "}\n"
    "subgraph 1: graph(%0: float32[3]) {\n"
    "  %1: float32[] = constant(1)\n"
    "  %2: float32[3] = add(%0, %1)\n"
    "  return (%2)\n"
    "}\n";

/* (a, b) = if p: (x * y, x) else: (x - y, y) */
static const char *two_way =
    "graph(%0: bool[], %1: float32[2], %2: float32[2]) {\n"
    "  %3: float32[2], %4: float32[2] = if(%0, %1, %2) {0, 1, 2}\n"
    "  return (%3, %4)\n"
    "}\n"
    "subgraph 0: graph(%0: float32[2], %1: float32[2]) {\n"
    "  %2: float32[2] = mul(%0, %1)\n"
    "  return (%2, %0)\n"
    "}\n"
    "subgraph 1: graph(%0: float32[2], %1: float32[2]) {\n"
    "  %2: float32[2] = sub(%0, %1)\n"
    "  return (%2, %1)\n"
    "}\n";

/* A loop whose outputs alias: (i, a, b, c, d, p) with lifted (n, w): a += w, b = the old a (an
 * input returned), c = w (a lifted tensor returned), d = the new a (a value returned twice), and
 * the cond returns its input p itself. */
static const char *aliasing_loop =
    "graph(%0: float32[], %1: float32[3], %2: float32[3], %3: float32[3], %4: float32[3], %5: bool[], "
    "%6: float32[], %7: float32[3]) {\n"
    "  %8: float32[], %9: float32[3], %10: float32[3], %11: float32[3], %12: float32[3], %13: bool[] = "
    "while(%0, %1, %2, %3, %4, %5, %6, %7) {0, 1, 6}\n"
    "  return (%8, %9, %10, %11, %12, %13)\n"
    "}\n"
    "subgraph 0: graph(%0: float32[], %1: float32[3], %2: float32[3], %3: float32[3], %4: float32[3], %5: bool[], "
    "%6: float32[], %7: float32[3]) {\n"
    "  return (%5)\n"
    "}\n"
    "subgraph 1: graph(%0: float32[], %1: float32[3], %2: float32[3], %3: float32[3], %4: float32[3], %5: bool[], "
    "%6: float32[], %7: float32[3]) {\n"
    "  %8: float32[] = constant(1)\n"
    "  %9: float32[] = add(%0, %8)\n"
    "  %10: float32[3] = add(%1, %7)\n"
    "  %11: bool[] = lt(%9, %6)\n"
    "  return (%9, %10, %1, %7, %10, %11)\n"
    "}\n";

/* Both the cond and the body branch (their subgraphs are numbered apart in the composed step)
 * and read the lifted w: while (sum < 10 ? sum : sum + sum(w)) < limit: x = sum < 10 ? x * 2 : x + w */
static const char *branching_cond_loop =
    "graph(%0: float32[3], %1: float32[], %2: float32[3]) {\n"
    "  %3: float32[3] = while(%0, %1, %2) {0, 1, 1}\n"
    "  return (%3)\n"
    "}\n"
    "subgraph 0: graph(%0: float32[3], %1: float32[], %2: float32[3]) {\n"
    "  %3: float32[] = sum(%0) {1, 0}\n"
    "  %4: float32[] = constant(10)\n"
    "  %5: bool[] = lt(%3, %4)\n"
    "  %6: float32[] = if(%5, %3, %2) {0, 1, 1}\n"
    "  %7: bool[] = lt(%6, %1)\n"
    "  return (%7)\n"
    "}\n"
    "subgraph 0: graph(%0: float32[], %1: float32[3]) {\n"
    "  return (%0)\n"
    "}\n"
    "subgraph 1: graph(%0: float32[], %1: float32[3]) {\n"
    "  %2: float32[] = sum(%1) {1, 0}\n"
    "  %3: float32[] = add(%0, %2)\n"
    "  return (%3)\n"
    "}\n"
    "subgraph 1: graph(%0: float32[3], %1: float32[], %2: float32[3]) {\n"
    "  %3: float32[] = constant(10)\n"
    "  %4: float32[] = sum(%0) {1, 0}\n"
    "  %5: bool[] = lt(%4, %3)\n"
    "  %6: float32[3] = if(%5, %0, %2) {0, 1, 1}\n"
    "  return (%6)\n"
    "}\n"
    "subgraph 0: graph(%0: float32[3], %1: float32[3]) {\n"
    "  %2: float32[] = constant(2)\n"
    "  %3: float32[3] = mul(%0, %2)\n"
    "  return (%3)\n"
    "}\n"
    "subgraph 1: graph(%0: float32[3], %1: float32[3]) {\n"
    "  %2: float32[3] = add(%0, %1)\n"
    "  return (%2)\n"
    "}\n";

static kiln_graph *parse(const char *text) {
    kiln_graph *g = NULL;
    CHECK_OK(kiln_graph_parse(text, &g));
    return g;
}

/* The executable of a graph's text (NULL, reported, when it does not parse or compile). */
static kiln_executable *compile_text(const char *text) {
    kiln_graph *g = parse(text);
    kiln_executable *e = NULL;
    if (g) CHECK_OK(kiln_compile(g, NULL, &e));
    kiln_graph_free(g); /* the executable keeps its own copy */
    return e;
}

static kiln_tensor *scalar_f32(float v) {
    kiln_tensor *t = tensor_f32(0, NULL, NULL);
    ((float *)t->data)[0] = v;
    return t;
}

static void test_round_trip(void) {
    const char *texts[] = {doubling_loop, nested_loop, two_way};
    for (int k = 0; k < 3; k++) {
        kiln_graph *g = parse(texts[k]), *again = NULL;
        if (!g) continue;
        CHECK_OK(kiln_graph_verify(g));
        char *printed = kiln_graph_to_string(g);
        CHECK(printed != NULL);
        CHECK_OK(kiln_graph_parse(printed, &again));
        char *reprinted = again ? kiln_graph_to_string(again) : NULL;
        CHECK(reprinted && strcmp(printed, reprinted) == 0);
        CHECK(strcmp(printed, texts[k]) == 0); /* the texts are written in canonical form */
        CHECK(strstr(printed, k == 2 ? "= if(%0, %1, %2) {0, 1, 2}" : "= while(%0, %1) {0, 1, 1}"));
        kiln_graph *copy = NULL;
        CHECK_OK(kiln_graph_clone(g, &copy));
        CHECK(copy && copy->nsubgraphs == g->nsubgraphs);
        free(printed), free(reprinted);
        kiln_graph_free(g), kiln_graph_free(again), kiln_graph_free(copy);
    }
}

static void test_verify_errors(void) {
    /* the else branch returns another shape */
    const char *bad =
        "graph(%0: bool[], %1: float32[2]) {\n"
        "  %2: float32[2] = if(%0, %1) {0, 1, 1}\n"
        "  return (%2)\n"
        "}\n"
        "subgraph 0: graph(%0: float32[2]) {\n"
        "  return (%0)\n"
        "}\n"
        "subgraph 1: graph(%0: float32[2]) {\n"
        "  %1: float32[2, 1] = reshape(%0) {2, 1}\n"
        "  return (%1)\n"
        "}\n";
    kiln_graph *g = NULL;
    CHECK_STATUS(kiln_graph_parse(bad, &g), KILN_ERR_VALUE);
    CHECK(strstr(kiln_last_error(), "output 0 of the else subgraph is float32 (2, 1) but the then subgraph's is float32 (2,)"));
    /* a subgraph index that does not exist */
    const char *missing =
        "graph(%0: bool[], %1: float32[2]) {\n"
        "  %2: float32[2] = if(%0, %1) {0, 3, 1}\n"
        "  return (%2)\n"
        "}\n"
        "subgraph 0: graph(%0: float32[2]) {\n"
        "  return (%0)\n"
        "}\n";
    CHECK_STATUS(kiln_graph_parse(missing, &g), KILN_ERR_VALUE);
    CHECK(strstr(kiln_last_error(), "if names subgraph 3, which does not exist"));
    /* a loop body that changes the loop value's dtype */
    const char *retyped =
        "graph(%0: float32[2]) {\n"
        "  %1: float32[2] = while(%0) {0, 1, 1}\n"
        "  return (%1)\n"
        "}\n"
        "subgraph 0: graph(%0: float32[2]) {\n"
        "  %1: float32[] = sum(%0) {1, 0}\n"
        "  return (%1)\n"
        "}\n"
        "subgraph 1: graph(%0: float32[2]) {\n"
        "  %1: float64[2] = cast(%0) {7}\n"
        "  return (%1)\n"
        "}\n";
    CHECK_STATUS(kiln_graph_parse(retyped, &g), KILN_ERR_VALUE);
    CHECK(strstr(kiln_last_error(), "output 0 of the body subgraph is float64 (2,) but the loop value is float32 (2,)"));
    /* subgraphs are pure: no random ops, no in-place writes */
    const char *random_branch =
        "graph(%0: bool[], %1: float32[2]) {\n"
        "  %2: float32[2] = if(%0, %1) {0, 1, 1}\n"
        "  return (%2)\n"
        "}\n"
        "subgraph 0: graph(%0: float32[2]) {\n"
        "  %1: float32[2], %2: float32[2] = dropout(%0) {0.5}\n"
        "  return (%1)\n"
        "}\n"
        "subgraph 1: graph(%0: float32[2]) {\n"
        "  return (%0)\n"
        "}\n";
    CHECK_STATUS(kiln_graph_parse(random_branch, &g), KILN_ERR_VALUE);
    CHECK(strstr(kiln_last_error(), "draws random numbers (dropout)"));
}

/* Runs a compiled loop graph on x and limit; returns out[0..3). */
static void run_loop(kiln_executable *e, const float *x, float limit, float *out) {
    int64_t n = 3;
    kiln_tensor *in[2] = {tensor_f32(1, &n, x), scalar_f32(limit)}, *got = NULL;
    CHECK_OK(kiln_executable_run(e, 2, in, 1, &got));
    for (int k = 0; k < 3; k++) out[k] = got ? ((float *)got->data)[k] : NAN;
    kiln_tensor_release(in[0]), kiln_tensor_release(in[1]), kiln_tensor_release(got);
}

static void test_while_runs(int order) {
    kiln_graph *g = parse(doubling_loop);
    kiln_executable *e = NULL;
    kiln_compile_options opt = {order ? KILN_ORDER_DFS : KILN_ORDER_BFS, true, "kbk"};
    if (g) CHECK_OK(kiln_compile(g, &opt, &e));
    if (!e) return;
    const float x[3] = {1, 2, 3};
    /* sum 6 -> 12 -> 24 -> 48 -> 96: four iterations below 50, one below 7, none below 6 */
    const float limits[3] = {50, 7, 6}, factors[3] = {16, 2, 1};
    for (int k = 0; k < 3; k++) {
        float got[3], want[3];
        run_loop(e, x, limits[k], got);
        for (int i = 0; i < 3; i++) want[i] = x[i] * factors[k];
        CHECK(close_f32(got, want, 3, 0));
    }
    kiln_executable_free(e);
    kiln_graph_free(g);
}

/* Outputs that are inputs, lifted tensors or returned twice come out right for 0 to 3 iterations
 * (the loop values alternate between two sets of buffers), and the caller's inputs stay as given. */
static void test_aliasing_outputs(void) {
    kiln_executable *e = compile_text(aliasing_loop);
    if (!e) return;
    int64_t three = 3;
    const float a0[3] = {1, 2, 3}, b0[3] = {-1, -2, -3}, c0[3] = {4, 5, 6}, d0[3] = {7, 8, 9}, w[3] = {10, 20, 30};
    for (int n = 0; n <= 3; n++) {
        kiln_tensor *in[8] = {scalar_f32(0), tensor_f32(1, &three, a0), tensor_f32(1, &three, b0),
                              tensor_f32(1, &three, c0), tensor_f32(1, &three, d0), NULL, scalar_f32((float)n),
                              tensor_f32(1, &three, w)};
        CHECK_OK(kiln_tensor_empty(KILN_DTYPE_BOOL, 0, NULL, &in[5]));
        ((bool *)in[5]->data)[0] = n > 0;
        kiln_tensor *out[6] = {0};
        CHECK_OK(kiln_executable_run(e, 8, in, 6, out));
        if (out[0]) {
            float a[3], b[3], c[3], d[3];
            for (int k = 0; k < 3; k++) {
                a[k] = a0[k] + (float)n * w[k];
                b[k] = n ? a0[k] + (float)(n - 1) * w[k] : b0[k];
                c[k] = n ? w[k] : c0[k];
                d[k] = n ? a[k] : d0[k];
            }
            CHECK(((float *)out[0]->data)[0] == (float)n);
            CHECK(close_f32(out[1]->data, a, 3, 0) && close_f32(out[2]->data, b, 3, 0));
            CHECK(close_f32(out[3]->data, c, 3, 0) && close_f32(out[4]->data, d, 3, 0));
            CHECK(!((bool *)out[5]->data)[0]);
            for (int k = 1; k < 5; k++) CHECK(out[k] != in[k] && out[k]->data != in[k]->data);
        }
        CHECK(close_f32(in[1]->data, a0, 3, 0) && close_f32(in[2]->data, b0, 3, 0));
        CHECK(close_f32(in[3]->data, c0, 3, 0) && close_f32(in[4]->data, d0, 3, 0) && close_f32(in[7]->data, w, 3, 0));
        kiln_release_all(out, 6);
        kiln_release_all(in, 8);
    }
    kiln_executable_free(e);
}

static void test_branching_cond_runs(void) {
    kiln_executable *e = compile_text(branching_cond_loop);
    if (!e) return;
    int64_t n = 3;
    const float x[3] = {0.5f, 1, 1.5f}, w[3] = {1, 2, 4};
    const float limits[4] = {3, 20, 40, 60}; /* 0 iterations, then more */
    for (int l = 0; l < 4; l++) {
        float want[3] = {x[0], x[1], x[2]};
        for (;;) { /* the same loop, by hand */
            float sum = want[0] + want[1] + want[2];
            if (!((sum < 10 ? sum : sum + 7) < limits[l])) break;
            for (int i = 0; i < 3; i++) want[i] = sum < 10 ? want[i] * 2 : want[i] + w[i];
        }
        kiln_tensor *in[3] = {tensor_f32(1, &n, x), scalar_f32(limits[l]), tensor_f32(1, &n, w)}, *got = NULL;
        CHECK_OK(kiln_executable_run(e, 3, in, 1, &got));
        if (got) CHECK(close_f32(got->data, want, 3, 1e-6f));
        kiln_tensor_release(got);
        kiln_release_all(in, 3);
    }
    kiln_executable_free(e);
}

/* Runs the loop graph `text` (x float32[3] = 1, 2, 3; i int64[1] = 0) expecting an index error whose
 * message names the failing op, the part of the loop and the loop, each with its source line. */
static void expect_index_error(const char *text, const char *op, const char *part, const char *loop) {
    kiln_executable *e = compile_text(text);
    if (!e) return;
    int64_t n = 3, one = 1;
    const float xv[3] = {1, 2, 3};
    kiln_tensor *i0 = NULL, *in[2], *out[2] = {0};
    CHECK_OK(kiln_tensor_zeros(KILN_DTYPE_INT64, 1, &one, &i0));
    in[0] = tensor_f32(1, &n, xv), in[1] = i0;
    kiln_status s = kiln_executable_run(e, 2, in, 2, out);
    CHECK(s == KILN_ERR_INDEX);
    const char *msg = kiln_last_error();
    CHECK(strstr(msg, op) && strstr(msg, part) && strstr(msg, loop));
    if (s == KILN_OK) kiln_release_all(out, 2);
    kiln_release_all(in, 2);
    kiln_executable_free(e);
}

/* The cond fails on the third iteration (inside the composed step): the error names the cond. */
static void test_cond_error_names_cond(void) {
    const char *text =
        "graph(%0: float32[3], %1: int64[1]) {\n"
        "  %2: float32[3], %3: int64[1] = while(%0, %1) {0, 1, 2}  # user.py:30\n"
        "  return (%2, %3)\n"
        "}\n"
        "subgraph 0: graph(%0: float32[3], %1: int64[1]) {\n"
        "  %2: float32[1] = gather(%0, %1) {0}  # user.py:31\n"
        "  %3: float32[] = constant(100)\n"
        "  %4: bool[1] = lt(%2, %3)\n"
        "  return (%4)\n"
        "}\n"
        "subgraph 1: graph(%0: float32[3], %1: int64[1]) {\n"
        "  %2: int64[] = constant(1)\n"
        "  %3: int64[1] = add(%1, %2)\n"
        "  return (%0, %3)\n"
        "}\n";
    expect_index_error(text, "gather (user.py:31)", "in the loop condition", "while (user.py:30)");
}

static void test_nested_runs(void) {
    kiln_executable *e = compile_text(nested_loop);
    if (!e) return;
    const float x[3] = {0.5f, 1, 1.5f};
    float got[3], want[3] = {0.5f, 1, 1.5f};
    for (float sum = 3; sum < 40;) { /* the same loop, by hand */
        for (int i = 0; i < 3; i++) want[i] = sum < 10 ? want[i] * 2 : want[i] + 1;
        sum = want[0] + want[1] + want[2];
    }
    run_loop(e, x, 40, got);
    CHECK(close_f32(got, want, 3, 1e-6f));
    kiln_executable_free(e);
}

static void test_if_runs(void) {
    kiln_executable *e = compile_text(two_way);
    if (!e) return;
    int64_t n = 2;
    const float xv[2] = {3, 4}, yv[2] = {1, 2};
    for (int taken = 0; taken < 2; taken++) {
        kiln_tensor *p = NULL, *in[3], *out[2] = {0};
        CHECK_OK(kiln_tensor_empty(KILN_DTYPE_BOOL, 0, NULL, &p));
        *(bool *)p->data = taken;
        in[0] = p, in[1] = tensor_f32(1, &n, xv), in[2] = tensor_f32(1, &n, yv);
        CHECK_OK(kiln_executable_run(e, 3, in, 2, out));
        const float want_a[2][2] = {{2, 2}, {3, 8}}, *want_b = taken ? xv : yv;
        CHECK(out[0] && close_f32(out[0]->data, want_a[taken], 2, 0));
        CHECK(out[1] && close_f32(out[1]->data, want_b, 2, 0));
        /* results are the node's own buffers, never the inputs */
        CHECK(out[1] && out[1]->data != in[1]->data && out[1]->data != in[2]->data);
        kiln_release_all(in, 3), kiln_release_all(out, 2);
    }
    kiln_executable_free(e);
}

/* The loop reads x[i] for i = 0, 1, 2, 3: the fourth read is out of range. */
static void test_error_names_op_and_line(void) {
    const char *text =
        "graph(%0: float32[3], %1: int64[1]) {\n"
        "  %2: float32[3], %3: int64[1] = while(%0, %1) {0, 1, 2}  # user.py:10\n"
        "  return (%2, %3)\n"
        "}\n"
        "subgraph 0: graph(%0: float32[3], %1: int64[1]) {\n"
        "  %2: int64[] = constant(100)\n"
        "  %3: bool[1] = lt(%1, %2)\n"
        "  return (%3)\n"
        "}\n"
        "subgraph 1: graph(%0: float32[3], %1: int64[1]) {\n"
        "  %2: float32[1] = gather(%0, %1) {0}  # user.py:12\n"
        "  %3: float32[3] = add(%0, %2)\n"
        "  %4: int64[] = constant(1)\n"
        "  %5: int64[1] = add(%1, %4)\n"
        "  return (%3, %5)\n"
        "}\n";
    expect_index_error(text, "gather (user.py:12)", "in the loop body", "while (user.py:10)");
}

/* The attrs of a `while` (one output) over copies of g's subgraphs 0 and 1, registered as bodies. */
static kiln_attrs while_attrs_of(const kiln_graph *g) {
    kiln_attrs a = {0};
    a.ni = 3, a.i[2] = 1;
    for (int k = 0; k < 2; k++) {
        kiln_graph *sub = NULL;
        CHECK_OK(kiln_graph_clone(g->subgraphs[k], &sub));
        CHECK_OK(kiln_body_register(sub, &a.i[k]));
    }
    return a;
}

/* Eagerly through registered bodies, with autograd: d sum(loop(x)) / dx = 2^T, T from the data.
 * The caller's references to the bodies go right after the call: the tape node holds them for the
 * backward, and once the results are gone every body (the backward's too) is freed. */
static void test_eager_apply_and_gradient(void) {
    kiln_graph *g = parse(doubling_loop);
    if (!g) return;
    int64_t live = kiln_body_live_count();
    kiln_attrs a = while_attrs_of(g);
    CHECK(kiln_body_live_count() == live + 2);
    int64_t n = 3;
    const float xv[3] = {1, 2, 3};
    kiln_tensor *x = tensor_f32(1, &n, xv), *limit = scalar_f32(30), *in[2] = {x, limit}, *y = NULL, *sum = NULL;
    CHECK_OK(kiln_tensor_set_requires_grad(x, true));
    CHECK_OK(kiln_apply(KILN_OP_WHILE, 2, in, &a, &y));
    kiln_body_release(a.i[0]), kiln_body_release(a.i[1]);
    CHECK(kiln_body_live_count() == live + 2); /* held by y's tape node */
    CHECK(y && close_f32(y->data, (const float[]){8, 16, 24}, 3, 0)); /* 6 -> 12 -> 24 -> 48 */
    if (y) CHECK_OK(kiln_emit_reduce(KILN_OP_SUM, y, 1, false, &sum));
    kiln_tensor *gx = NULL;
    if (sum) CHECK_OK(kiln_autograd_grad(1, &sum, NULL, 1, &x, false, &gx));
    CHECK(gx && close_f32(gx->data, (const float[]){8, 8, 8}, 3, 0));
    kiln_tensor_release(x), kiln_tensor_release(limit), kiln_tensor_release(y), kiln_tensor_release(sum);
    kiln_tensor_release(gx);
    CHECK(kiln_body_live_count() == live);
    CHECK(!kiln_body_graph(a.i[0])); /* a released body's id names nothing */
    kiln_clear_error();
    kiln_graph_free(g);
}

/* The gradient of a loop traced into one graph (while + while_grad) prints, parses back to the
 * same text, and computes the data-dependent gradient when compiled. */
static void test_traced_gradient_round_trip(void) {
    kiln_graph *g = parse(doubling_loop);
    if (!g) return;
    kiln_attrs a = while_attrs_of(g);
    kiln_graph_free(g);
    int64_t n = 3;
    kiln_tensor *x = tensor_f32(1, &n, (const float[]){1, 2, 3}), *limit = scalar_f32(30);
    kiln_tensor *in[2] = {x, limit}, *y = NULL, *sum = NULL, *gx = NULL;
    CHECK_OK(kiln_tensor_set_requires_grad(x, true));
    kiln_tracer *tr = NULL;
    CHECK_OK(kiln_tracer_begin(&tr));
    CHECK_OK(kiln_tracer_add_input(tr, x));
    CHECK_OK(kiln_tracer_add_input(tr, limit));
    CHECK_OK(kiln_apply(KILN_OP_WHILE, 2, in, &a, &y));
    if (y) CHECK_OK(kiln_emit_reduce(KILN_OP_SUM, y, 1, false, &sum));
    if (sum) CHECK_OK(kiln_autograd_grad(1, &sum, NULL, 1, &x, false, &gx));
    kiln_tracer_end(tr);
    int32_t outs[2];
    CHECK_OK(kiln_tracer_value_of(tr, sum, &outs[0]));
    CHECK_OK(kiln_tracer_value_of(tr, gx, &outs[1]));
    g = kiln_tracer_graph(tr);
    CHECK_OK(kiln_graph_set_outputs(g, 2, outs));
    char *text = kiln_graph_to_string(g), *again_text = NULL;
    kiln_graph *again = NULL;
    CHECK(text && strstr(text, "= while(") && strstr(text, "= while_grad(") && !strstr(text, "captured"));
    if (text) CHECK_OK(kiln_graph_parse(text, &again));
    if (again) again_text = kiln_graph_to_string(again);
    CHECK(again_text && strcmp(text, again_text) == 0);
    kiln_executable *e = NULL;
    if (again) CHECK_OK(kiln_compile(again, NULL, &e));
    /* sums 6, 12, 24 are below 30: three doublings; 6 ... 96 below 100: five */
    const float limits[2] = {30, 100}, factors[2] = {8, 32};
    for (int k = 0; k < 2 && e; k++) {
        kiln_tensor *run_in[2] = {tensor_f32(1, &n, (const float[]){1, 2, 3}), scalar_f32(limits[k])}, *res[2] = {0};
        CHECK_OK(kiln_executable_run(e, 2, run_in, 2, res));
        CHECK(res[0] && ((float *)res[0]->data)[0] == 6 * factors[k]);
        const float want[3] = {factors[k], factors[k], factors[k]};
        CHECK(res[1] && close_f32(res[1]->data, want, 3, 0));
        kiln_release_all(run_in, 2), kiln_release_all(res, 2);
    }
    kiln_executable_free(e);
    free(text), free(again_text);
    kiln_graph_free(again);
    kiln_tracer_free(tr);
    kiln_tensor_release(x), kiln_tensor_release(limit), kiln_tensor_release(y), kiln_tensor_release(sum);
    kiln_tensor_release(gx);
}

/* dce drops an unused if, cse merges two identical ones, constant_fold runs none of them (their
 * inputs are all constants here), and O1 optimizes inside the subgraphs. */
static void test_passes_keep_control_flow(void) {
    const char *text =
        "graph(%0: float32[2]) {\n"
        "  %1: bool[] = constant(1)\n"
        "  %2: float32[2] = constant\n"
        "  %3: float32[2] = if(%1, %2) {0, 1, 1}\n"
        "  %4: float32[2] = if(%1, %2) {0, 1, 1}\n"
        "  %5: float32[2] = if(%1, %0) {0, 1, 1}\n"
        "  %6: float32[2] = add(%3, %4)\n"
        "  return (%6)\n"
        "}\n"
        "subgraph 0: graph(%0: float32[2]) {\n"
        "  %1: float32[] = constant(2)\n"
        "  %2: float32[] = constant(3)\n"
        "  %3: float32[2] = mul(%0, %1)\n"
        "  %4: float32[2] = add(%3, %2)\n"
        "  return (%4)\n"
        "}\n"
        "subgraph 1: graph(%0: float32[2]) {\n"
        "  return (%0)\n"
        "}\n";
    kiln_graph *g = parse(text);
    if (!g) return;
    kiln_pass_options opt = {KILN_LEVEL_O1, false, false, KILN_CONV_FUSE_ALL, false};
    CHECK_OK(kiln_optimize(&g, &opt));
    char *printed = kiln_graph_to_string(g);
    CHECK(printed);
    if (!printed) return;
    const char *main_end = strstr(printed, "subgraph 0:");
    int ifs = 0;
    for (const char *p = printed; (p = strstr(p, "= if(")) && p < main_end; p++) ifs++;
    CHECK(ifs == 1);                                      /* merged, the unused one dropped */
    CHECK(strstr(main_end, "= fused(") != NULL);          /* the then branch was fused */
    kiln_executable *e = NULL;
    CHECK_OK(kiln_compile(g, NULL, &e));
    int64_t n = 2;
    kiln_tensor *x = tensor_f32(1, &n, (const float[]){1, 2}), *y = NULL;
    if (e) CHECK_OK(kiln_executable_run(e, 1, &x, 1, &y));
    CHECK(y && close_f32(y->data, (const float[]){6, 6}, 2, 0)); /* (0 * 2 + 3) * 2 */
    kiln_tensor_release(x), kiln_tensor_release(y);
    kiln_executable_free(e);
    free(printed);
    kiln_graph_free(g);
}

int main(void) {
    test_round_trip();
    test_verify_errors();
    test_while_runs(0);
    test_while_runs(1);
    test_nested_runs();
    test_aliasing_outputs();
    test_branching_cond_runs();
    test_cond_error_names_cond();
    test_if_runs();
    test_error_names_op_and_line();
    test_eager_apply_and_gradient();
    test_passes_keep_control_flow();
    test_traced_gradient_round_trip();
    if (check_failures) {
        fprintf(stderr, "%d check(s) failed\n", check_failures);
        return 1;
    }
    printf("test_control_flow: ok\n");
    return 0;
}
