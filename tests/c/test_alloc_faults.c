/* Allocation failures are handled everywhere. Each workload (tensor creation and views, eager ops,
 * autograd backward of first and second order, a trace compiled and run, an eager while loop and
 * its gradient, convolution graphs, the C source of fused kernels, graph text optimized, compiled
 * and run on both backends) runs once per allocation it makes, with that allocation failing
 * (kiln_alloc_fail_nth), until a run makes no n-th allocation; then again with every allocation
 * after the n-th failing too. Every run must return KILN_OK with the same result as without
 * failures, or KILN_ERR_MEMORY with an "out of memory" message; the tensor memory in use must come
 * back to what it was, and the sanitizer build (scripts/test.sh) checks that nothing else leaked
 * and nothing crashed. */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include "check.h"
#include "core/internal.h"
#include "codegen/codegen.h"
#include "ir/control.h"

#include <stdint.h>

/* ---- workloads: each releases everything it made, on every path, and sums its results ---- */

#define TRY(expr)                                                                           \
    do {                                                                                    \
        s = (expr);                                                                         \
        if (s != KILN_OK) goto done;                                                        \
    } while (0)

static double sum_f32(const kiln_tensor *t) {
    double acc = 0;
    for (int64_t i = 0; i < t->numel; i++) acc += kiln_tensor_get_double(t, i);
    return acc;
}

static kiln_status make(int ndim, const int64_t *shape, float base, kiln_tensor **out) {
    kiln_status s = kiln_tensor_empty(KILN_DTYPE_FLOAT32, ndim, shape, out);
    if (s != KILN_OK) return s;
    for (int64_t i = 0; i < (*out)->numel; i++) ((float *)(*out)->data)[i] = base + 0.01f * (float)(i % 37);
    return KILN_OK;
}

/* creation, views, reshape copies, full */
static kiln_status creation(double *result) {
    kiln_status s;
    kiln_tensor *a = NULL, *z = NULL, *v = NULL, *p = NULL, *r = NULL, *f = NULL;
    int64_t shape[3] = {2, 3, 4};
    TRY(make(3, shape, 0.5f, &a));
    TRY(kiln_tensor_zeros(KILN_DTYPE_FLOAT64, 3, shape, &z));
    int64_t vshape[2] = {6, 4};
    TRY(kiln_tensor_view(a, 2, vshape, NULL, 0, &v));
    kiln_attrs perm = {.ni = 3, .i = {2, 0, 1}};
    TRY(kiln_apply1(KILN_OP_PERMUTE, a, &perm, &p));
    kiln_attrs rs = {.ni = 2, .i = {4, 6}};
    TRY(kiln_apply1(KILN_OP_RESHAPE, p, &rs, &r)); /* not contiguous: a copy */
    kiln_attrs full = {.ni = 4, .i = {KILN_DTYPE_FLOAT32, 2, 3, 5}, .nf = 1, .f = {1.5}};
    TRY(kiln_apply(KILN_OP_FULL, 0, NULL, &full, &f));
    *result = sum_f32(v) + sum_f32(r) + sum_f32(f) + sum_f32(z);
done:
    kiln_tensor_release(a), kiln_tensor_release(z), kiln_tensor_release(v);
    kiln_tensor_release(p), kiln_tensor_release(r), kiln_tensor_release(f);
    return s;
}

/* eager ops of each family: broadcasting, matmul, reductions, softmax, concat, conv, pooling */
static kiln_status ops(double *result) {
    kiln_status s;
    kiln_tensor *x = NULL, *b = NULL, *w = NULL, *img = NULL, *k = NULL;
    kiln_tensor *t[8] = {NULL};
    int64_t xs[2] = {4, 5}, bs[1] = {5}, ws[2] = {5, 3}, is[4] = {1, 2, 6, 6}, ks[4] = {3, 2, 3, 3};
    TRY(make(2, xs, -0.2f, &x));
    TRY(make(1, bs, 0.1f, &b));
    TRY(make(2, ws, -0.1f, &w));
    TRY(make(4, is, -0.3f, &img));
    TRY(make(4, ks, -0.05f, &k));
    TRY(kiln_apply2(KILN_OP_ADD, x, b, NULL, &t[0]));
    TRY(kiln_apply2(KILN_OP_MATMUL, t[0], w, NULL, &t[1]));
    kiln_attrs axis1 = {.ni = 1, .i = {1}};
    TRY(kiln_apply1(KILN_OP_SOFTMAX, t[1], &axis1, &t[2]));
    kiln_tensor *pair[2] = {t[2], t[1]};
    TRY(kiln_apply(KILN_OP_CONCAT, 2, pair, &axis1, &t[3]));
    kiln_attrs rows = {.ni = 2, .i = {1, 0}}; /* sum over axis 0 */
    TRY(kiln_apply1(KILN_OP_SUM, t[3], &rows, &t[4]));
    kiln_attrs conv = {.ni = 9, .i = {1, 1, 1, 1, 1, 1, 1, 1, 1}};
    kiln_tensor *xw[2] = {img, k};
    TRY(kiln_apply(KILN_OP_CONV2D, 2, xw, &conv, &t[5]));
    kiln_attrs pool = {.ni = 12, .i = {2, 2, 2, 2, 0, 0, 0, 0, 1, 1, 0, 0}};
    TRY(kiln_apply1(KILN_OP_MAX_POOL2D, t[5], &pool, &t[6]));
    *result = sum_f32(t[4]) + sum_f32(t[6]);
done:
    kiln_tensor_release(x), kiln_tensor_release(b), kiln_tensor_release(w);
    kiln_tensor_release(img), kiln_tensor_release(k);
    kiln_release_all(t, 8);
    return s;
}

/* loss = sum(tanh(x @ w) * x[:, :3]) backward: gradients of both leaves */
static kiln_status backward(double *result) {
    kiln_status s;
    kiln_tensor *x = NULL, *w = NULL, *h = NULL, *a = NULL, *xs = NULL, *m = NULL, *loss = NULL;
    kiln_tensor *grads[2] = {NULL, NULL};
    int64_t xshape[2] = {4, 5}, wshape[2] = {5, 3};
    TRY(make(2, xshape, -0.2f, &x));
    TRY(make(2, wshape, -0.1f, &w));
    TRY(kiln_tensor_set_requires_grad(x, true));
    TRY(kiln_tensor_set_requires_grad(w, true));
    TRY(kiln_apply2(KILN_OP_MATMUL, x, w, NULL, &h));
    TRY(kiln_apply1(KILN_OP_TANH, h, NULL, &a));
    kiln_attrs sl = {.ni = 24, .i = {0, 0, [8] = 1, 1, [16] = 4, 3}};
    TRY(kiln_apply1(KILN_OP_SLICE, x, &sl, &xs));
    TRY(kiln_apply2(KILN_OP_MUL, a, xs, NULL, &m));
    kiln_attrs all = {.ni = 2, .i = {3, 0}};
    TRY(kiln_apply1(KILN_OP_SUM, m, &all, &loss));
    kiln_tensor *leaves[2] = {x, w};
    TRY(kiln_autograd_grad(1, &loss, NULL, 2, leaves, false, grads));
    *result = sum_f32(loss) + sum_f32(grads[0]) + sum_f32(grads[1]);
done:
    kiln_tensor_release(x), kiln_tensor_release(w), kiln_tensor_release(h), kiln_tensor_release(a);
    kiln_tensor_release(xs), kiln_tensor_release(m), kiln_tensor_release(loss);
    kiln_release_all(grads, 2);
    return s;
}

/* second order: g = d sum(x^3 * w) / dx with create_graph, then d sum(g * g) / d(x, w) */
static kiln_status second_order(double *result) {
    kiln_status s;
    kiln_tensor *x = NULL, *w = NULL, *x2 = NULL, *x3 = NULL, *m = NULL, *loss = NULL, *gg = NULL, *l2 = NULL;
    kiln_tensor *g[1] = {NULL}, *grads[2] = {NULL, NULL};
    int64_t shape[2] = {3, 4};
    TRY(make(2, shape, -0.3f, &x));
    TRY(make(2, shape, 0.2f, &w));
    TRY(kiln_tensor_set_requires_grad(x, true));
    TRY(kiln_tensor_set_requires_grad(w, true));
    TRY(kiln_apply2(KILN_OP_MUL, x, x, NULL, &x2));
    TRY(kiln_apply2(KILN_OP_MUL, x2, x, NULL, &x3));
    TRY(kiln_apply2(KILN_OP_MUL, x3, w, NULL, &m));
    kiln_attrs all = {.ni = 2, .i = {3, 0}};
    TRY(kiln_apply1(KILN_OP_SUM, m, &all, &loss));
    TRY(kiln_autograd_grad(1, &loss, NULL, 1, &x, true, g));
    TRY(kiln_apply2(KILN_OP_MUL, g[0], g[0], NULL, &gg));
    TRY(kiln_apply1(KILN_OP_SUM, gg, &all, &l2));
    kiln_tensor *leaves[2] = {x, w};
    TRY(kiln_autograd_grad(1, &l2, NULL, 2, leaves, false, grads));
    *result = sum_f32(l2) + sum_f32(grads[0]) + sum_f32(grads[1]);
done:
    kiln_tensor_release(x), kiln_tensor_release(w), kiln_tensor_release(x2), kiln_tensor_release(x3);
    kiln_tensor_release(m), kiln_tensor_release(loss), kiln_tensor_release(gg), kiln_tensor_release(l2);
    kiln_release_all(g, 1);
    kiln_release_all(grads, 2);
    return s;
}

/* a trace of eager ops (layer_norm, gather, log_softmax) compiled at O1 and run */
static kiln_status traced(double *result) {
    kiln_status s;
    kiln_tracer *tr = NULL;
    kiln_executable *e = NULL;
    kiln_tensor *x = NULL, *wt = NULL, *bs = NULL, *idx = NULL, *out = NULL;
    kiln_tensor *t[6] = {NULL};
    int64_t xs[2] = {4, 6}, ws[1] = {6}, is[1] = {3};
    TRY(make(2, xs, -0.4f, &x));
    TRY(make(1, ws, 1.0f, &wt));
    TRY(make(1, ws, 0.0f, &bs));
    TRY(kiln_tensor_empty(KILN_DTYPE_INT64, 1, is, &idx));
    for (int k = 0; k < 3; k++) ((int64_t *)idx->data)[k] = 3 - k;
    TRY(kiln_tracer_begin(&tr));
    s = kiln_tracer_add_input(tr, x);
    kiln_attrs ln = {.ni = 1, .i = {1}, .nf = 1, .f = {1e-5}};
    kiln_tensor *lin[3] = {x, wt, bs};
    if (s == KILN_OK) s = kiln_apply(KILN_OP_LAYER_NORM, 3, lin, &ln, &t[0]); /* t[0..2] */
    kiln_attrs axis0 = {.ni = 1, .i = {0}}, axis1 = {.ni = 1, .i = {1}};
    if (s == KILN_OK) s = kiln_apply2(KILN_OP_GATHER, t[0], idx, &axis0, &t[3]);
    if (s == KILN_OK) s = kiln_apply1(KILN_OP_LOG_SOFTMAX, t[3], &axis1, &t[4]);
    kiln_tracer_end(tr);
    if (s != KILN_OK) goto done;
    int32_t v;
    TRY(kiln_tracer_value_of(tr, t[4], &v));
    kiln_graph *g = kiln_tracer_graph(tr);
    TRY(kiln_graph_set_outputs(g, 1, &v));
    kiln_compile_options copt = {KILN_ORDER_DFS, false, "kbk"};
    TRY(kiln_compile(g, &copt, &e));
    TRY(kiln_executable_run(e, 1, &x, 1, &out));
    *result = sum_f32(out) + sum_f32(t[4]);
done:
    kiln_executable_free(e);
    kiln_tracer_free(tr);
    kiln_tensor_release(x), kiln_tensor_release(wt), kiln_tensor_release(bs), kiln_tensor_release(idx);
    kiln_tensor_release(out);
    kiln_release_all(t, 6);
    return s;
}

/* a graph with fusible elementwise chains, a matmul epilogue, a reduction and a while loop,
 * parsed, optimized at O1, compiled and run by the kernel-by-kernel and sink backends */
static const char *graph_text =
    "graph(%0: float32[2, 3], %1: float32[3]) {\n"
    "  %2: float32[] = constant(0.5)\n"
    "  %3: float32[3, 1] = reshape(%1) {3, 1}\n"
    "  %4: float32[2, 1] = matmul(%0, %3)\n"
    "  %5: float32[2, 1] = mul(%4, %2)\n"
    "  %6: float32[2, 3] = add(%0, %5)\n"
    "  %7: float32[2, 3] = relu(%6)\n"
    "  %8: float32[2, 3] = softmax(%7) {1}\n"
    "  %9: int64[] = full() {3, 0; 0}\n"
    "  %10: int64[], %11: float32[2, 3] = while(%9, %8) {0, 1, 2}\n"
    "  %12: float32[] = sum(%11) {3, 0}\n"
    "  return (%12, %7)\n"
    "}\n"
    "subgraph 0: graph(%0: int64[], %1: float32[2, 3]) {\n"
    "  %2: int64[] = constant(3)\n"
    "  %3: bool[] = lt(%0, %2)\n"
    "  return (%3)\n"
    "}\n"
    "subgraph 1: graph(%0: int64[], %1: float32[2, 3]) {\n"
    "  %2: int64[] = constant(1)\n"
    "  %4: float32[] = constant(2)\n"
    "  %3: int64[] = add(%0, %2)\n"
    "  %5: float32[2, 3] = mul(%1, %4)\n"
    "  return (%3, %5)\n"
    "}\n";

static kiln_status graph_with(const char *backend, kiln_jit_level level, double *result) {
    kiln_status s;
    kiln_graph *g = NULL;
    kiln_executable *e = NULL;
    kiln_tensor *in[2] = {NULL, NULL}, *out[2] = {NULL, NULL};
    int64_t s0[2] = {2, 3}, s1[1] = {3};
    TRY(make(2, s0, -0.2f, &in[0]));
    TRY(make(1, s1, 0.3f, &in[1]));
    TRY(kiln_graph_parse(graph_text, &g));
    kiln_pass_options popt = {.level = level};
    TRY(kiln_optimize(&g, &popt));
    kiln_compile_options copt = {KILN_ORDER_BFS, false, backend};
    TRY(kiln_compile(g, &copt, &e));
    *result = 0;
    for (int run = 0; run < 2; run++) {
        TRY(kiln_executable_run(e, 2, in, 2, out));
        *result += sum_f32(out[0]) + sum_f32(out[1]);
        kiln_release_all(out, 2);
    }
done:
    kiln_release_all(out, 2);
    kiln_release_all(in, 2);
    kiln_executable_free(e);
    kiln_graph_free(g);
    return s;
}

/* the loop of graph_text run eagerly through registered bodies, and its gradient; every body
 * (the backward's too) is freed with the results */
static kiln_status eager_while(double *result) {
    kiln_status s;
    int64_t live = kiln_body_live_count();
    kiln_graph *g = NULL;
    kiln_tensor *x = NULL, *i = NULL, *sum = NULL, *gx = NULL;
    kiln_tensor *y[2] = {NULL, NULL};
    kiln_attrs a = {.ni = 3, .i = {-1, -1, 2}};
    int64_t shape[2] = {2, 3};
    TRY(make(2, shape, -0.2f, &x));
    TRY(kiln_tensor_set_requires_grad(x, true));
    TRY(kiln_tensor_zeros(KILN_DTYPE_INT64, 0, NULL, &i));
    TRY(kiln_graph_parse(graph_text, &g));
    for (int k = 0; k < 2; k++) {
        kiln_graph *sub = NULL;
        TRY(kiln_graph_clone(g->subgraphs[k], &sub));
        TRY(kiln_body_register(sub, &a.i[k])); /* takes sub, also on failure */
    }
    kiln_tensor *in[2] = {i, x};
    s = kiln_apply(KILN_OP_WHILE, 2, in, &a, y);
    kiln_body_release(a.i[0]), kiln_body_release(a.i[1]); /* the tape node holds them */
    a.i[0] = a.i[1] = -1;
    if (s != KILN_OK) goto done;
    kiln_attrs all = {.ni = 2, .i = {3, 0}};
    TRY(kiln_apply1(KILN_OP_SUM, y[1], &all, &sum));
    TRY(kiln_autograd_grad(1, &sum, NULL, 1, &x, false, &gx));
    *result = sum_f32(sum) + sum_f32(gx);
done:
    kiln_body_release(a.i[0]), kiln_body_release(a.i[1]);
    kiln_tensor_release(x), kiln_tensor_release(i), kiln_tensor_release(sum), kiln_tensor_release(gx);
    kiln_release_all(y, 2);
    kiln_graph_free(g);
    if (kiln_body_live_count() != live)
        return kiln_error(KILN_ERR_RUNTIME, "%lld control-flow bodies left alive",
                          (long long)(kiln_body_live_count() - live));
    return s;
}

static kiln_status graph_kbk_o1(double *result) { return graph_with("kbk", KILN_LEVEL_O1, result); }
static kiln_status graph_sink_o2(double *result) { return graph_with("sink", KILN_LEVEL_O2, result); }

/* convolution, batch norm and relu, optimized for inference (batch norm folded, channels-last
 * layouts, conv epilogues through oneDNN) and run; then the same ops eagerly with gradients */
static const char *conv_text =
    "graph(%0: float32[1, 2, 6, 6]) {\n"
    "  %1: float32[4, 2, 3, 3] = constant(0.25)\n"
    "  %3: float32[4] = constant(1)\n"
    "  %4: float32[4] = constant(0.5)\n"
    "  %5: float32[4] = constant(0.1)\n"
    "  %6: float32[4] = constant(2)\n"
    "  %13: float32[4, 4, 3, 3] = constant(-0.125)\n"
    "  %2: float32[1, 4, 6, 6] = conv2d(%0, %1) {1, 1, 1, 1, 1, 1, 1, 1, 1}\n"
    "  %7: float32[1, 4, 6, 6], %8: float32[4], %9: float32[4] = batch_norm(%2, %3, %4, %5, %6) {0; 1e-05, 0.1}\n"
    "  %10: float32[1, 4, 6, 6] = relu(%7)\n"
    "  %11: float32[1, 4, 6, 6] = conv2d(%10, %13) {1, 1, 1, 1, 1, 1, 1, 1, 1}\n"
    "  %12: float32[1, 4, 6, 6] = add(%11, %10)\n"
    "  return (%12)\n"
    "}\n";

static kiln_status conv_graph(double *result) {
    kiln_status s;
    kiln_graph *g = NULL;
    kiln_executable *e = NULL;
    kiln_tensor *x = NULL, *out = NULL;
    int64_t shape[4] = {1, 2, 6, 6};
    TRY(make(4, shape, -0.3f, &x));
    TRY(kiln_graph_parse(conv_text, &g));
    kiln_pass_options popt = {.level = KILN_LEVEL_O1, .inference = true};
    TRY(kiln_optimize(&g, &popt));
    kiln_compile_options copt = {KILN_ORDER_BFS, false, "kbk"};
    TRY(kiln_compile(g, &copt, &e));
    TRY(kiln_executable_run(e, 1, &x, 1, &out));
    *result = sum_f32(out);
done:
    kiln_tensor_release(x), kiln_tensor_release(out);
    kiln_executable_free(e);
    kiln_graph_free(g);
    return s;
}

static kiln_status conv_backward(double *result) {
    kiln_status s;
    kiln_tensor *x = NULL, *w = NULL, *gamma = NULL, *beta = NULL, *rm = NULL, *rv = NULL, *c = NULL, *r = NULL;
    kiln_tensor *p = NULL, *loss = NULL;
    kiln_tensor *bn[3] = {NULL}, *grads[3] = {NULL};
    int64_t xs[4] = {2, 2, 6, 6}, ws[4] = {4, 2, 3, 3}, cs[1] = {4};
    TRY(make(4, xs, -0.3f, &x));
    TRY(make(4, ws, -0.05f, &w));
    TRY(make(1, cs, 1.0f, &gamma));
    TRY(make(1, cs, 0.0f, &beta));
    TRY(kiln_tensor_zeros(KILN_DTYPE_FLOAT32, 1, cs, &rm));
    TRY(make(1, cs, 1.0f, &rv));
    TRY(kiln_tensor_set_requires_grad(x, true));
    TRY(kiln_tensor_set_requires_grad(w, true));
    TRY(kiln_tensor_set_requires_grad(gamma, true));
    kiln_attrs conv = {.ni = 9, .i = {1, 1, 1, 1, 1, 1, 1, 1, 1}};
    kiln_tensor *xw[2] = {x, w};
    TRY(kiln_apply(KILN_OP_CONV2D, 2, xw, &conv, &c));
    kiln_attrs bna = {.ni = 1, .i = {1}, .nf = 2, .f = {1e-5, 0.1}}; /* training */
    kiln_tensor *bin[5] = {c, gamma, beta, rm, rv};
    TRY(kiln_apply(KILN_OP_BATCH_NORM, 5, bin, &bna, bn));
    TRY(kiln_apply1(KILN_OP_RELU, bn[0], NULL, &r));
    kiln_attrs pool = {.ni = 12, .i = {2, 2, 2, 2, 0, 0, 0, 0, 1, 1, 0, 0}};
    TRY(kiln_apply1(KILN_OP_MAX_POOL2D, r, &pool, &p));
    kiln_attrs all = {.ni = 2, .i = {15, 0}};
    TRY(kiln_apply1(KILN_OP_SUM, p, &all, &loss));
    kiln_tensor *leaves[3] = {x, w, gamma};
    TRY(kiln_autograd_grad(1, &loss, NULL, 3, leaves, false, grads));
    *result = sum_f32(loss) + sum_f32(grads[0]) + sum_f32(grads[1]) + sum_f32(grads[2]);
done:
    kiln_tensor_release(x), kiln_tensor_release(w), kiln_tensor_release(gamma), kiln_tensor_release(beta);
    kiln_tensor_release(rm), kiln_tensor_release(rv), kiln_tensor_release(c), kiln_tensor_release(r);
    kiln_tensor_release(p), kiln_tensor_release(loss);
    kiln_release_all(bn, 3);
    kiln_release_all(grads, 3);
    return s;
}

/* the C source of every fused kernel of graph_text at O1 (generated, not compiled) */
static kiln_status codegen(double *result) {
    kiln_status s;
    kiln_graph *g = NULL;
    char *source = NULL;
    TRY(kiln_graph_parse(graph_text, &g));
    kiln_pass_options popt = {.level = KILN_LEVEL_O1};
    TRY(kiln_optimize(&g, &popt));
    *result = 0;
    for (int32_t i = 0; i < g->nnodes; i++) {
        const kiln_node *n = &g->nodes[i];
        if (n->op != KILN_OP_FUSED) continue;
        const kiln_graph *sub = g->subgraphs[n->attrs.i[0]];
        if (!kiln_codegen_supports(sub)) continue;
        int8_t inner[KILN_MAX_OUTPUTS + 8];
        for (int k = 0; k <= n->nin; k++) inner[k] = kiln_codegen_has_rows(sub) ? KILN_INNER_FIXED : KILN_INNER_UNIT;
        char symbol[48];
        TRY(kiln_codegen_emit(sub, inner, &source, symbol));
        *result += (double)strlen(source);
        free(source);
        source = NULL;
    }
    if (*result == 0) s = kiln_error(KILN_ERR_RUNTIME, "codegen workload: no fused kernel to generate");
done:
    free(source);
    kiln_graph_free(g);
    return s;
}

/* ---- the sweep ----------------------------------------------------------------------------- */

static void sweep_mode(const char *name, kiln_status (*workload)(double *), bool persist) {
    double want = 0;
    kiln_alloc_fail_nth(0, false);
    kiln_status s0 = workload(&want); /* also fills process-wide caches before memory is compared */
    CHECK_OK(s0);
    if (s0 != KILN_OK) return;
    size_t in_use = kiln_memory_in_use();
    int64_t n = 1, failures = 0;
    for (;; n++) {
        kiln_clear_error();
        double got = 0;
        kiln_alloc_fail_nth(n, persist);
        kiln_status s = workload(&got);
        bool fired = kiln_alloc_fault_fired();
        kiln_alloc_fail_nth(0, false);
        if (s == KILN_ERR_MEMORY) {
            failures++;
            if (!strstr(kiln_last_error(), "out of memory")) {
                fprintf(stderr, "%s, allocation %lld failing: KILN_ERR_MEMORY with message '%s'\n", name,
                        (long long)n, kiln_last_error());
                CHECK(0);
            }
        } else if (s != KILN_OK) {
            fprintf(stderr, "%s, allocation %lld failing: status %d, not KILN_ERR_MEMORY (%s)\n", name,
                    (long long)n, (int)s, kiln_last_error());
            CHECK(0);
        } else if (!(fabs(got - want) <= 1e-9 * (1 + fabs(want)))) {
            fprintf(stderr, "%s, allocation %lld failing: succeeded with %.17g instead of %.17g\n", name,
                    (long long)n, got, want);
            CHECK(0);
        }
        if (kiln_memory_in_use() != in_use) {
            fprintf(stderr, "%s, allocation %lld failing: %zu bytes of tensor memory in use, %zu before\n", name,
                    (long long)n, kiln_memory_in_use(), in_use);
            CHECK(0);
            in_use = kiln_memory_in_use();
        }
        if (!fired) break; /* the run made fewer than n allocations: all were tried */
    }
    printf("%s: %lld allocations, each made to fail in turn%s: %lld runs returned KILN_ERR_MEMORY, the others "
           "recovered\n", name, (long long)(n - 1), persist ? " with all after it" : "", (long long)failures);
    CHECK(n > 1);
}

/* Each allocation failing alone (the caller recovers), then with every later one failing too (the
 * clean-up paths run out of memory as well). */
static void sweep(const char *name, kiln_status (*workload)(double *)) {
    sweep_mode(name, workload, false);
    sweep_mode(name, workload, true);
}

int main(void) {
    setenv("KILN_DISABLE_CODEGEN", "1", 1); /* fused groups interpreted: no compiler per run */
    sweep("creation", creation);
    sweep("ops", ops);
    sweep("backward", backward);
    sweep("second-order backward", second_order);
    sweep("trace, compile (kernel by kernel) and run", traced);
    sweep("eager while loop and its gradient", eager_while);
    sweep("convolution graph (O1, inference)", conv_graph);
    sweep("convolution, batch norm (training), pooling backward", conv_backward);
    sweep("graph (O1, kernel by kernel)", graph_kbk_o1);
    sweep("graph (O2, sink)", graph_sink_o2);
    sweep("C source of fused kernels", codegen);
    return check_failures ? 1 : 0;
}
