/* conv2d_fused, relayout and the passes that make them (fuse_conv_epilogue, channels_last):
 * the fused kernel against conv2d + add + activation computed op by op in float64, in every
 * layout, with and without Winograd, float32 (oneDNN) and float64 (plain loops); relayout
 * against permute + contiguous; error messages; and each pass as "input text -> expected
 * output text", every rewritten graph computing what the original does. The blocked layout the
 * channels_last pass picks is the CPU's (16 channels a block with AVX-512, 8 with AVX2): ctest
 * runs this file twice, the second time with ONEDNN_MAX_CPU_ISA=AVX2. */
#include "linalg_testutil.h"
#include "rewrite_check.h"
#include "ops/conv_epilogue.h"

/* ---- the fused kernel ------------------------------------------------------------------------ */

typedef struct {
    int64_t N, C, H, W, O, K, stride, pad;
} fused_case;

static const fused_case fcases[] = {
    {2, 16, 7, 6, 32, 3, 1, 1}, /* Winograd-eligible, blocked-eligible */
    {1, 8, 5, 9, 4, 3, 2, 1},   /* channels not multiples of 16 */
    {1, 32, 6, 6, 16, 1, 1, 0}, /* 1x1 */
};

static kiln_tensor *apply1(kiln_op op, kiln_tensor *a, const kiln_attrs *at) {
    kiln_tensor *out = NULL;
    CHECK_OK(kiln_apply1(op, a, at, &out));
    return out;
}

static kiln_tensor *relayout(kiln_tensor *x, int64_t from, int64_t to) {
    kiln_attrs a = {0};
    a.ni = 2, a.i[0] = from, a.i[1] = to;
    return apply1(KILN_OP_RELAYOUT, x, &a);
}

/* act(conv2d(x, w, b) + r) op by op (x, w, b, r NCHW, float64). */
static kiln_tensor *composed(kiln_tensor *x, kiln_tensor *w, kiln_tensor *b, kiln_tensor *r, const kiln_attrs *conv,
                             int act, const kiln_attrs *act_attrs) {
    kiln_tensor *ins[3] = {x, w, b}, *y = NULL, *t;
    CHECK_OK(kiln_apply(KILN_OP_CONV2D, b ? 3 : 2, ins, conv, &y));
    if (r) {
        CHECK_OK(kiln_apply2(KILN_OP_ADD, y, r, NULL, &t));
        kiln_tensor_release(y), y = t;
    }
    if (act != KILN_CONV_ACT_NONE) {
        t = apply1(kiln_conv_activation_ops[act], y, act_attrs);
        kiln_tensor_release(y), y = t;
    }
    return y;
}

static void check_fused(const fused_case *c, kiln_dtype dt, int layout, int winograd, int bias, int residual, int act) {
    int64_t xs[4] = {c->N, c->C, c->H, c->W}, ws[4] = {c->O, c->C, c->K, c->K}, bs[1] = {c->O};
    int64_t OH = (c->H + 2 * c->pad - c->K) / c->stride + 1, OW = (c->W + 2 * c->pad - c->K) / c->stride + 1;
    int64_t ys[4] = {c->N, c->O, OH, OW};
    kiln_tensor *x = tu_tensor(KILN_DTYPE_FLOAT64, 4, xs), *w = tu_tensor(KILN_DTYPE_FLOAT64, 4, ws);
    kiln_tensor *b = bias ? tu_tensor(KILN_DTYPE_FLOAT64, 1, bs) : NULL, *r = residual ? tu_tensor(KILN_DTYPE_FLOAT64, 4, ys) : NULL;
    kiln_attrs conv = {0}, fused = {0}, act_attrs = {0};
    int64_t cv[9] = {c->stride, c->stride, c->pad, c->pad, c->pad, c->pad, 1, 1, 1};
    for (int k = 0; k < 9; k++) kiln_attrs_push_int(&conv, cv[k]), kiln_attrs_push_int(&fused, cv[k]);
    int64_t ep[5] = {bias, residual, act, layout, winograd};
    for (int k = 0; k < 5; k++) kiln_attrs_push_int(&fused, ep[k]);
    if (act == KILN_CONV_ACT_CLAMP) {
        kiln_attrs_push_float(&fused, -0.5), kiln_attrs_push_float(&fused, 0.75);
        kiln_attrs_push_float(&act_attrs, -0.5), kiln_attrs_push_float(&act_attrs, 0.75);
    }
    kiln_tensor *want = composed(x, w, b, r, &conv, act, &act_attrs);
    /* the same inputs in dt and the layout */
    kiln_tensor *all[4] = {x, w, b, r}, *cast[4] = {NULL, NULL, NULL, NULL};
    for (int k = 0; k < 4; k++)
        if (all[k]) CHECK_OK(kiln_emit_cast(all[k], dt, &cast[k]));
    kiln_tensor *ins[4], *got = NULL, *got_nchw = NULL;
    int nin = 0;
    ins[nin++] = layout ? relayout(cast[0], 0, layout) : (kiln_tensor_retain(cast[0]), cast[0]);
    ins[nin++] = cast[1];
    if (bias) ins[nin++] = cast[2];
    if (residual) ins[nin++] = layout ? relayout(cast[3], 0, layout) : (kiln_tensor_retain(cast[3]), cast[3]);
    CHECK_OK(kiln_apply(KILN_OP_CONV2D_FUSED, nin, ins, &fused, &got));
    if (got) got_nchw = layout ? relayout(got, layout, 0) : (kiln_tensor_retain(got), got);
    double *v = want ? tu_values(want) : NULL;
    double tol = dt == KILN_DTYPE_FLOAT64 ? 1e-10 : 1e-4;
    if (!v || !got_nchw || !tu_check(got_nchw, v, tol, "conv2d_fused"))
        fprintf(stderr, "  case %dx%dx%dx%d -> %d, k%d s%d: %s layout %d winograd %d bias %d residual %d act %d\n",
                (int)c->N, (int)c->C, (int)c->H, (int)c->W, (int)c->O, (int)c->K, (int)c->stride, kiln_dtype_name(dt),
                layout, winograd, bias, residual, act),
            check_failures++;
    free(v);
    kiln_tensor_release(ins[0]);
    if (residual) kiln_tensor_release(ins[nin - 1]);
    kiln_tensor *tmp[] = {x, w, b, r, want, got, got_nchw};
    kiln_release_all(tmp, 7);
    kiln_release_all(cast, 4);
}

static void test_fused_matches_ops(void) {
    for (size_t k = 0; k < sizeof fcases / sizeof *fcases; k++) {
        const fused_case *c = &fcases[k];
        for (int layout = 0; layout < KILN_CONV_LAYOUT_COUNT; layout++) {
            int64_t block = kiln_conv_layout_block((kiln_conv_layout)layout);
            if (block && (c->C % block || c->O % block)) continue;
            for (int act = 0; act < KILN_CONV_ACT_COUNT; act++)
                for (int variant = 0; variant < 4; variant++) {
                    int bias = variant & 1, residual = variant >> 1;
                    check_fused(c, KILN_DTYPE_FLOAT32, layout, act % 2, bias, residual, act);
                    check_fused(c, KILN_DTYPE_FLOAT64, layout, 0, bias, residual, act);
                }
        }
    }
    /* the Winograd and direct primitives of one problem side by side, and the weights cache:
     * changed weights between calls with the same shapes are seen */
    kiln_conv_layout native = kiln_conv_blocked_layout(kiln_conv_block_size());
    for (int winograd = 0; winograd < 2 && native != KILN_CONV_NCHW; winograd++)
        for (int call = 0; call < 3; call++) check_fused(&fcases[0], KILN_DTYPE_FLOAT32, native, winograd, 1, 1, 1);
}

static void test_relayout(void) {
    int64_t s[4] = {2, 32, 3, 5};
    kiln_dtype dts[3] = {KILN_DTYPE_FLOAT32, KILN_DTYPE_FLOAT64, KILN_DTYPE_INT64};
    kiln_conv_layout blocked[2] = {KILN_CONV_BLOCKED16, KILN_CONV_BLOCKED8};
    for (int d = 0; d < 6; d++) {
        kiln_conv_layout bl = blocked[d % 2];
        int64_t b = kiln_conv_layout_block(bl);
        kiln_tensor *x = tu_tensor(dts[d / 2], 4, s), *nhwc = relayout(x, 0, KILN_CONV_NHWC);
        kiln_tensor *blk = relayout(x, 0, bl), *view = NULL, *perm = NULL;
        /* NHWC is permute(0, 2, 3, 1); blocked is (N, C/b, b, H, W) permuted (0, 1, 3, 4, 2) */
        CHECK(nhwc && nhwc->meta.ndim == 4 && nhwc->meta.shape[3] == 32 && nhwc->meta.shape[1] == 3);
        CHECK(blk && blk->meta.ndim == 5 && blk->meta.shape[1] == 32 / b && blk->meta.shape[4] == b);
        int64_t p4[4] = {0, 2, 3, 1}, r5[5] = {2, 32 / b, b, 3, 5}, p5[5] = {0, 1, 3, 4, 2};
        CHECK_OK(kiln_emit_permute(x, p4, &perm));
        double *want = perm ? tu_values(perm) : NULL;
        CHECK(want && nhwc && tu_check(nhwc, want, 0, "relayout to NHWC"));
        free(want), kiln_tensor_release(perm), perm = NULL;
        CHECK_OK(kiln_emit_reshape(x, 5, r5, &view));
        if (view) CHECK_OK(kiln_emit_permute(view, p5, &perm));
        want = perm ? tu_values(perm) : NULL;
        CHECK(want && blk && tu_check(blk, want, 0, "relayout to blocked"));
        free(want);
        kiln_tensor *back1 = nhwc ? relayout(nhwc, KILN_CONV_NHWC, 0) : NULL, *back2 = blk ? relayout(blk, bl, 0) : NULL;
        double *xv = tu_values(x);
        CHECK(back1 && tu_check(back1, xv, 0, "NHWC round trip"));
        CHECK(back2 && tu_check(back2, xv, 0, "blocked round trip"));
        free(xv);
        kiln_tensor *all[] = {x, nhwc, blk, view, perm, back1, back2};
        kiln_release_all(all, 7);
    }
}

static void expect_error(kiln_status got, kiln_status want, const char *fragment) {
    CHECK_STATUS(got, want);
    if (!strstr(kiln_last_error(), fragment)) {
        fprintf(stderr, "error '%s' does not mention '%s'\n", kiln_last_error(), fragment);
        check_failures++;
    }
}

static void test_errors(void) {
    int64_t xs[4] = {1, 8, 5, 5}, ws[4] = {8, 8, 3, 3}, rs[4] = {1, 8, 4, 4};
    kiln_tensor *x = tu_tensor(KILN_DTYPE_FLOAT32, 4, xs), *w = tu_tensor(KILN_DTYPE_FLOAT32, 4, ws);
    kiln_tensor *r = tu_tensor(KILN_DTYPE_FLOAT32, 4, rs), *out = NULL;
    kiln_attrs a = {0};
    int64_t v[14] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 1, 0, 0, 0};
    for (int k = 0; k < 14; k++) kiln_attrs_push_int(&a, v[k]);
    kiln_tensor *two[2] = {x, w}, *three[3] = {x, w, r};
    expect_error(kiln_apply(KILN_OP_CONV2D_FUSED, 2, two, &a, &out), KILN_ERR_TYPE, "expected 3 tensor inputs (x, w, residual)");
    expect_error(kiln_apply(KILN_OP_CONV2D_FUSED, 3, three, &a, &out), KILN_ERR_VALUE, "residual float32 (1, 8, 4, 4) does not match");
    a.i[10] = 0, a.i[11] = 42;
    expect_error(kiln_apply(KILN_OP_CONV2D_FUSED, 2, two, &a, &out), KILN_ERR_VALUE, "unknown activation code 42");
    a.i[11] = 0, a.i[12] = KILN_CONV_BLOCKED16;
    expect_error(kiln_apply(KILN_OP_CONV2D_FUSED, 2, two, &a, &out), KILN_ERR_VALUE, "does not have layout 2");
    kiln_attrs rl = {0};
    rl.ni = 2, rl.i[0] = 0, rl.i[1] = KILN_CONV_BLOCKED16;
    expect_error(kiln_apply1(KILN_OP_RELAYOUT, x, &rl, &out), KILN_ERR_VALUE, "divisible by 16");
    a.i[12] = KILN_CONV_BLOCKED8;
    expect_error(kiln_apply(KILN_OP_CONV2D_FUSED, 2, two, &a, &out), KILN_ERR_VALUE, "does not have layout 3 (N, C/8, H, W, 8)");
    rl.i[0] = KILN_CONV_NHWC;
    expect_error(kiln_apply1(KILN_OP_RELAYOUT, x, &rl, &out), KILN_ERR_VALUE, "one side must be NCHW");
    CHECK(out == NULL);
    kiln_tensor *all[] = {x, w, r};
    kiln_release_all(all, 3);
}

/* ---- the passes, text to text ------------------------------------------------------------------ */

/* Both graphs run on the same random inputs give the same outputs (Winograd's rounding allowed). */
static int same_results(const kiln_graph *a, const kiln_graph *b) {
    kiln_compile_options copt = {KILN_ORDER_BFS, true, "kbk"};
    kiln_executable *ea = NULL, *eb = NULL;
    int ok = kiln_compile(a, &copt, &ea) == KILN_OK && kiln_compile(b, &copt, &eb) == KILN_OK;
    if (!ok) fprintf(stderr, "compile failed: %s\n", kiln_last_error());
    kiln_tensor *in[8] = {0}, *oa[8] = {0}, *ob[8] = {0};
    int nin = a->ninputs, nout = a->noutputs;
    if (nin > 8 || nout > 8) return 0;
    for (int k = 0; k < nin && ok; k++) {
        const kiln_meta *m = &a->values[a->inputs[k]].meta;
        in[k] = tu_tensor(m->dtype, m->ndim, m->shape);
    }
    ok = ok && kiln_executable_run(ea, nin, in, nout, oa) == KILN_OK && kiln_executable_run(eb, nin, in, nout, ob) == KILN_OK;
    for (int k = 0; k < nout && ok; k++) {
        double *want = tu_values(oa[k]);
        ok = oa[k]->numel == ob[k]->numel && tu_check(ob[k], want, 1e-4, "rewritten graph");
        free(want);
    }
    kiln_release_all(in, nin), kiln_release_all(oa, nout), kiln_release_all(ob, nout);
    kiln_executable_free(ea), kiln_executable_free(eb);
    return ok;
}

#define expect_rewrite(passes, opt, input, want) rc_expect_rewrite_at(__LINE__, passes, opt, input, want, same_results)

static const kiln_pass_options training = {KILN_LEVEL_O1, false, false, KILN_CONV_FUSE_ALL, false};
static const kiln_pass_options inference = {KILN_LEVEL_O1, true, false, KILN_CONV_FUSE_ALL, false};
static const kiln_pass_options no_format = {KILN_LEVEL_O1, true, true, KILN_CONV_FUSE_ALL, false};

static void test_fuse_conv_epilogue(void) {
    /* bias (broadcast per channel), residual, relu: one node */
    expect_rewrite("fuse_conv_epilogue", &training,
                   "graph(%0: float32[1, 8, 6, 6], %1: float32[8, 8, 3, 3], %2: float32[8, 1, 1], %3: float32[1, 8, 6, 6]) {\n"
                   "  %4: float32[1, 8, 6, 6] = conv2d(%0, %1) {1, 1, 1, 1, 1, 1, 1, 1, 1}\n"
                   "  %5: float32[1, 8, 6, 6] = add(%4, %2)\n"
                   "  %6: float32[1, 8, 6, 6] = add(%3, %5)\n"
                   "  %7: float32[1, 8, 6, 6] = relu(%6)\n"
                   "  return (%7)\n"
                   "}\n",
                   "graph(%0: float32[1, 8, 6, 6], %1: float32[8, 8, 3, 3], %2: float32[8, 1, 1], %3: float32[1, 8, 6, 6]) {\n"
                   "  %4: float32[8] = reshape(%2) {8}\n"
                   "  %5: float32[1, 8, 6, 6] = conv2d_fused(%0, %1, %4, %3) {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0}\n"
                   "  return (%5)\n"
                   "}\n");
    /* a training graph: relu's input is read by relu_backward, so only the residual fuses;
     * the convolution's own bias stays its bias; clamp keeps its bounds */
    expect_rewrite("fuse_conv_epilogue", &training,
                   "graph(%0: float32[2, 4, 5, 5], %1: float32[4, 4, 3, 3], %2: float32[4], %3: float32[2, 4, 5, 5]) {\n"
                   "  %4: float32[2, 4, 5, 5] = conv2d(%0, %1, %2) {1, 1, 1, 1, 1, 1, 1, 1, 1}\n"
                   "  %5: float32[2, 4, 5, 5] = add(%4, %3)\n"
                   "  %6: float32[2, 4, 5, 5] = relu(%5)\n"
                   "  %7: float32[2, 4, 5, 5] = relu_backward(%3, %5)\n"
                   "  %8: float32[2, 4, 5, 5] = conv2d(%6, %1) {1, 1, 1, 1, 1, 1, 1, 1, 1}\n"
                   "  %9: float32[2, 4, 5, 5] = clamp(%8) {; -1, 0.5}\n"
                   "  return (%9, %7)\n"
                   "}\n",
                   "graph(%0: float32[2, 4, 5, 5], %1: float32[4, 4, 3, 3], %2: float32[4], %3: float32[2, 4, 5, 5]) {\n"
                   "  %4: float32[2, 4, 5, 5] = conv2d_fused(%0, %1, %2, %3) {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0}\n"
                   "  %5: float32[2, 4, 5, 5] = relu(%4)\n"
                   "  %6: float32[2, 4, 5, 5] = relu_backward(%3, %4)\n"
                   "  %7: float32[2, 4, 5, 5] = conv2d_fused(%5, %1) {1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 6, 0, 0; -1, 0.5}\n"
                   "  return (%7, %6)\n"
                   "}\n");
    /* nothing fuses: the output is a graph output, an add of the output with itself, a
     * broadcast add that is no per-channel bias, an integer activation */
    expect_rewrite("fuse_conv_epilogue", &training,
                   "graph(%0: float32[1, 4, 5, 5], %1: float32[4, 4, 3, 3], %2: float32[5]) {\n"
                   "  %3: float32[1, 4, 5, 5] = conv2d(%0, %1) {1, 1, 1, 1, 1, 1, 1, 1, 1}\n"
                   "  %4: float32[1, 4, 5, 5] = relu(%3)\n"
                   "  %5: float32[1, 4, 5, 5] = conv2d(%0, %1) {1, 1, 1, 1, 1, 1, 1, 1, 1}\n"
                   "  %6: float32[1, 4, 5, 5] = add(%5, %5)\n"
                   "  %7: float32[1, 4, 5, 5] = conv2d(%0, %1) {1, 1, 1, 1, 1, 1, 1, 1, 1}\n"
                   "  %8: float32[1, 4, 5, 5] = add(%7, %2)\n"
                   "  return (%3, %4, %6, %8)\n"
                   "}\n",
                   NULL);
    /* inference: every convolution becomes conv2d_fused, with Winograd allowed */
    expect_rewrite("fuse_conv_epilogue", &inference,
                   "graph(%0: float32[1, 16, 6, 6], %1: float32[16, 16, 3, 3]) {\n"
                   "  %2: float32[1, 16, 6, 6] = conv2d(%0, %1) {1, 1, 1, 1, 1, 1, 1, 1, 1}\n"
                   "  %3: float32[1, 16, 6, 6] = gelu(%2)\n"
                   "  %4: float32[1, 16, 6, 6] = conv2d(%3, %1) {1, 1, 1, 1, 1, 1, 1, 1, 1}\n"
                   "  return (%4, %3)\n"
                   "}\n",
                   "graph(%0: float32[1, 16, 6, 6], %1: float32[16, 16, 3, 3]) {\n"
                   "  %2: float32[1, 16, 6, 6] = conv2d_fused(%0, %1) {1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 2, 0, 1}\n"
                   "  %3: float32[1, 16, 6, 6] = conv2d_fused(%2, %1) {1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 1}\n"
                   "  return (%3, %2)\n"
                   "}\n");
}

/* The expected text of a channels_last rewrite on this CPU: in tmpl, @L stands for the code of
 * its blocked layout, @B for its block, @<n> for n / block (malloc'd). */
static char *blocked_text(const char *tmpl) {
    int64_t b = kiln_conv_block_size();
    size_t size = strlen(tmpl) + 1;
    char *out = malloc(size), *o = out;
    for (const char *p = tmpl; *p && out;) {
        long long v = -1;
        if (p[0] == '@' && p[1] == 'L') v = kiln_conv_blocked_layout(b), p += 2;
        else if (p[0] == '@' && p[1] == 'B') v = b, p += 2;
        else if (p[0] == '@') v = strtoll(p + 1, (char **)&p, 10) / b;
        if (v < 0) *o++ = *p++;
        else o += sprintf(o, "%lld", v); /* never longer than the token it replaces */
    }
    if (out) *o = 0;
    return out;
}

#define expect_blocked_rewrite(passes, opt, input, tmpl)                                   \
    do {                                                                                   \
        char *want_ = blocked_text(tmpl);                                                  \
        rc_expect_rewrite_at(__LINE__, passes, opt, input, want_, same_results);           \
        free(want_);                                                                       \
    } while (0)

static void test_channels_last(void) {
    if (!kiln_conv_block_size()) {
        fprintf(stderr, "test_channels_last: oneDNN has no blocked kernels on this CPU, the pass is off\n");
        return;
    }
    /* a BasicBlock after folding and epilogue fusion: channels divisible by 16 -> blocked; x is
     * converted once (input of the first convolution, residual of the second) */
    const char *block16 =
        "graph(%0: float32[1, 16, 6, 6], %1: float32[16, 16, 3, 3], %2: float32[16]) {\n"
        "  %3: float32[1, 16, 6, 6] = conv2d_fused(%0, %1, %2) {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 1, 0, 1}\n"
        "  %4: float32[1, 16, 6, 6] = conv2d_fused(%3, %1, %2, %0) {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 1}\n"
        "  return (%4)\n"
        "}\n";
    expect_blocked_rewrite("channels_last", &inference, block16,
                   "graph(%0: float32[1, 16, 6, 6], %1: float32[16, 16, 3, 3], %2: float32[16]) {\n"
                   "  %3: float32[1, @16, 6, 6, @B] = relayout(%0) {0, @L}\n"
                   "  %4: float32[1, @16, 6, 6, @B] = conv2d_fused(%3, %1, %2) {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 1, @L, 1}\n"
                   "  %5: float32[1, @16, 6, 6, @B] = conv2d_fused(%4, %1, %2, %3) {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, @L, 1}\n"
                   "  %6: float32[1, 16, 6, 6] = relayout(%5) {@L, 0}\n"
                   "  return (%6)\n"
                   "}\n");
    expect_rewrite("channels_last", &no_format, block16, NULL);
    /* 4 channels (no multiple of any block) -> NHWC; elementwise ops in the chain follow (a per-channel operand becomes a
     * permuted view, a full-size one is converted); a value also read outside the chain is
     * converted back once, and elementwise ops off the chain read that */
    expect_rewrite("channels_last", &training,
                   "graph(%0: float32[2, 4, 5, 5], %1: float32[4, 4, 3, 3], %2: float32[4, 1, 1], %3: float32[2, 4, 5, 5]) {\n"
                   "  %4: float32[2, 4, 5, 5] = conv2d(%0, %1) {1, 1, 1, 1, 1, 1, 1, 1, 1}\n"
                   "  %5: float32[2, 4, 5, 5] = mul(%4, %2)\n"
                   "  %6: float32[2, 4, 5, 5] = add(%5, %3)\n"
                   "  %7: float32[2, 4, 5, 5] = conv2d(%6, %1) {1, 1, 1, 1, 1, 1, 1, 1, 1}\n"
                   "  %8: float32[1, 1, 1, 1] = sum(%5) {15, 1}\n"
                   "  %9: float32[2, 4, 5, 5] = exp(%5)\n"
                   "  return (%7, %8, %9)\n"
                   "}\n",
                   "graph(%0: float32[2, 4, 5, 5], %1: float32[4, 4, 3, 3], %2: float32[4, 1, 1], %3: float32[2, 4, 5, 5]) {\n"
                   "  %4: float32[2, 5, 5, 4] = relayout(%0) {0, 1}\n"
                   "  %5: float32[2, 5, 5, 4] = conv2d_fused(%4, %1) {1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 1, 0}\n"
                   "  %6: float32[1, 4, 1, 1] = reshape(%2) {1, 4, 1, 1}\n"
                   "  %7: float32[1, 1, 1, 4] = permute(%6) {0, 2, 3, 1}\n"
                   "  %8: float32[2, 5, 5, 4] = mul(%5, %7)\n"
                   "  %9: float32[2, 5, 5, 4] = relayout(%3) {0, 1}\n"
                   "  %10: float32[2, 5, 5, 4] = add(%8, %9)\n"
                   "  %11: float32[2, 5, 5, 4] = conv2d_fused(%10, %1) {1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 1, 0}\n"
                   "  %12: float32[2, 4, 5, 5] = relayout(%8) {1, 0}\n"
                   "  %13: float32[1, 1, 1, 1] = sum(%12) {15, 1}\n"
                   "  %14: float32[2, 4, 5, 5] = exp(%12)\n"
                   "  %15: float32[2, 4, 5, 5] = relayout(%11) {1, 0}\n"
                   "  return (%15, %13, %14)\n"
                   "}\n");
    /* a convolution left alone (its output feeds no other) does not decide the layout */
    expect_blocked_rewrite("channels_last", &training,
                   "graph(%0: float32[1, 3, 6, 6], %1: float32[16, 3, 3, 3], %2: float32[16, 16, 3, 3], %3: float32[1, 16, 6, 6]) {\n"
                   "  %4: float32[1, 16, 6, 6] = conv2d(%0, %1) {1, 1, 1, 1, 1, 1, 1, 1, 1}\n"
                   "  %5: float32[1, 16, 6, 6] = conv2d(%3, %2) {1, 1, 1, 1, 1, 1, 1, 1, 1}\n"
                   "  %6: float32[1, 16, 6, 6] = relu(%5)\n"
                   "  %7: float32[1, 16, 6, 6] = conv2d(%6, %2) {1, 1, 1, 1, 1, 1, 1, 1, 1}\n"
                   "  return (%4, %7)\n"
                   "}\n",
                   "graph(%0: float32[1, 3, 6, 6], %1: float32[16, 3, 3, 3], %2: float32[16, 16, 3, 3], %3: float32[1, 16, 6, 6]) {\n"
                   "  %4: float32[1, 16, 6, 6] = conv2d(%0, %1) {1, 1, 1, 1, 1, 1, 1, 1, 1}\n"
                   "  %5: float32[1, @16, 6, 6, @B] = relayout(%3) {0, @L}\n"
                   "  %6: float32[1, @16, 6, 6, @B] = conv2d_fused(%5, %2) {1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, @L, 0}\n"
                   "  %7: float32[1, @16, 6, 6, @B] = relu(%6)\n"
                   "  %8: float32[1, @16, 6, 6, @B] = conv2d_fused(%7, %2) {1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, @L, 0}\n"
                   "  %9: float32[1, 16, 6, 6] = relayout(%8) {@L, 0}\n"
                   "  return (%4, %9)\n"
                   "}\n");
    /* a graph with backward convolutions keeps NCHW */
    expect_rewrite("channels_last", &training,
                   "graph(%0: float32[1, 16, 6, 6], %1: float32[16, 16, 3, 3]) {\n"
                   "  %2: float32[1, 16, 6, 6] = conv2d(%0, %1) {1, 1, 1, 1, 1, 1, 1, 1, 1}\n"
                   "  %3: float32[1, 16, 6, 6] = relu(%2)\n"
                   "  %4: float32[1, 16, 6, 6] = conv2d(%3, %1) {1, 1, 1, 1, 1, 1, 1, 1, 1}\n"
                   "  %5: float32[1, 16, 6, 6] = conv2d_backward_input(%4, %1) {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 16, 6, 6}\n"
                   "  return (%5)\n"
                   "}\n",
                   NULL);
    /* a lone convolution, and float64 ones, stay as they are */
    expect_rewrite("channels_last", &inference,
                   "graph(%0: float32[1, 16, 6, 6], %1: float32[16, 16, 3, 3], %2: float64[1, 16, 6, 6], %3: float64[16, 16, 3, 3]) {\n"
                   "  %4: float32[1, 16, 6, 6] = conv2d(%0, %1) {1, 1, 1, 1, 1, 1, 1, 1, 1}\n"
                   "  %5: float32[1, 16, 6, 6] = relu(%4)\n"
                   "  %6: float64[1, 16, 6, 6] = conv2d(%2, %3) {1, 1, 1, 1, 1, 1, 1, 1, 1}\n"
                   "  %7: float64[1, 16, 6, 6] = conv2d(%6, %3) {1, 1, 1, 1, 1, 1, 1, 1, 1}\n"
                   "  return (%5, %7)\n"
                   "}\n",
                   NULL);
}

/* The whole O1 pipeline on an inference BasicBlock keeps what the brief asks: no batch_norm,
 * two fused convolutions, relayouts only at the edges. */
static void test_pipeline(void) {
    const char *text =
        "graph(%0: float32[1, 16, 6, 6], %1: float32[16, 16, 3, 3], %2: float32[16], %3: float32[16], %4: float32[16], %5: float32[16]) {\n"
        "  %6: float32[1, 16, 6, 6] = conv2d(%0, %1) {1, 1, 1, 1, 1, 1, 1, 1, 1}\n"
        "  %7: float32[1, 16, 6, 6], %8: float32[16], %9: float32[16] = batch_norm(%6, %2, %3, %4, %5) {0; 1e-05, 0.1}\n"
        "  %10: float32[1, 16, 6, 6] = relu(%7)\n"
        "  %11: float32[1, 16, 6, 6] = conv2d(%10, %1) {1, 1, 1, 1, 1, 1, 1, 1, 1}\n"
        "  %12: float32[1, 16, 6, 6], %13: float32[16], %14: float32[16] = batch_norm(%11, %2, %3, %4, %5) {0; 1e-05, 0.1}\n"
        "  %15: float32[1, 16, 6, 6] = add(%12, %0)\n"
        "  %16: float32[1, 16, 6, 6] = relu(%15)\n"
        "  return (%16)\n"
        "}\n";
    kiln_graph *g = NULL;
    CHECK_OK(kiln_graph_parse(text, &g));
    if (!g) return;
    CHECK_OK(kiln_optimize(&g, &inference));
    char *printed = kiln_graph_to_string(g);
    int convs = 0, relayouts = 0;
    for (const char *p = printed; p && (p = strstr(p, "conv2d_fused(")); p++) convs++;
    for (const char *p = printed; p && (p = strstr(p, "relayout(")); p++) relayouts++;
    bool ok = printed && !strstr(printed, "batch_norm") && !strstr(printed, "relu(") && convs == 2 && relayouts == 2;
    CHECK(ok);
    if (!ok) fprintf(stderr, "%s", printed ? printed : "?");
    free(printed);
    kiln_graph_free(g);
}

int main(void) {
    /* none of oneDNN's reference implementations anywhere: not for channels too few for a
     * block, nor for the blocked layout of another CPU (nChw16c on AVX2) */
    int64_t refs = kiln_dnnl_ref_count();
    test_fused_matches_ops();
    test_relayout();
    test_errors();
    test_fuse_conv_epilogue();
    test_channels_last();
    test_pipeline();
    CHECK(kiln_dnnl_ref_count() == refs);
    CHECK_DONE();
}
