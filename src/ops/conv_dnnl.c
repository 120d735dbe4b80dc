/* oneDNN plumbing for conv2d: one CPU engine and stream; one primitive per (kind, problem,
 * epilogue), created on first use with `any` memory formats (NHWC activations stay NHWC) and
 * kept in a small LRU cache together with the reorders between the user's NCHW / NHWC / OIHW
 * buffers and the formats the primitive chose. The epilogue runs as post-ops: the residual as
 * a `sum` (the destination is first filled with it), then the activation as an `eltwise`
 * (those kiln_conv_dnnl_applies; the caller applies relu and clamp).
 * Blocked copies and the scratchpad live in grow-only buffers shared by all primitives.
 * Everything runs under one mutex (the library is driven by one caller at a time).
 * Every primitive made is checked for oneDNN's reference implementation (slow: reported once
 * per problem on stderr, and counted, see kiln_dnnl_ref_count). */
#include <dnnl.h>
#include <pthread.h>

#include "conv_dnnl.h"

#define CONV_CACHE_SIZE 64

/* Operand order per kind: inputs 0 and 1, output 2 (see kiln_conv_kind). */
typedef struct {
    kiln_conv_kind kind;
    bool bias;
    dnnl_data_type_t dt[3];                    /* of operands 0..2 (f32, or bf16 for amp) */
    bool declined;                             /* a bf16 problem oneDNN has only its reference for */
    kiln_conv_params p;
    kiln_conv_epilogue ep;
    uint64_t last_use;
    dnnl_primitive_t prim;
    dnnl_memory_desc_t user_md[3], md[3];
    dnnl_primitive_t reorder[3];               /* user -> chosen for inputs, back for output */
    dnnl_primitive_t residual_reorder;         /* user -> chosen for the output (the residual) */
    dnnl_memory_t user_mem[3], blk_mem[3], bias_mem, scratch_mem;
    size_t blk_size[3], scratch_size;
    /* Winograd: the weights last transformed (a copy) and their transformed form, reused while
     * the weights hold the same bytes (the transform costs as much as a small convolution;
     * other weight reorders are cheap and not worth the memory) */
    bool keep_weights;
    void *weights_seen, *weights_blk;
} conv_entry;

static pthread_mutex_t conv_lock = PTHREAD_MUTEX_INITIALIZER;
static dnnl_engine_t conv_engine;
static dnnl_stream_t conv_stream;
static conv_entry *conv_cache[CONV_CACHE_SIZE];
static uint64_t conv_clock;
static void *conv_buf[4]; /* blocked operands 0..2, scratchpad */
static size_t conv_buf_size[4];
static const kiln_conv_epilogue conv_no_epilogue = {.activation = KILN_CONV_ACT_NONE};

static const int conv_args[3][3] = {
    [KILN_CONV_FORWARD] = {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST},
    [KILN_CONV_BACKWARD_INPUT] = {DNNL_ARG_DIFF_DST, DNNL_ARG_WEIGHTS, DNNL_ARG_DIFF_SRC},
    [KILN_CONV_BACKWARD_WEIGHT] = {DNNL_ARG_SRC, DNNL_ARG_DIFF_DST, DNNL_ARG_DIFF_WEIGHTS},
};
static const dnnl_query_t conv_queries[3][3] = {
    [KILN_CONV_FORWARD] = {dnnl_query_src_md, dnnl_query_weights_md, dnnl_query_dst_md},
    [KILN_CONV_BACKWARD_INPUT] = {dnnl_query_diff_dst_md, dnnl_query_weights_md, dnnl_query_diff_src_md},
    [KILN_CONV_BACKWARD_WEIGHT] = {dnnl_query_src_md, dnnl_query_diff_dst_md, dnnl_query_diff_weights_md},
};

#define DNNL_TRY(call)                                                                      \
    do {                                                                                    \
        dnnl_status_t dnnl_s_ = (call);                                                     \
        if (dnnl_s_ != dnnl_success)                                                        \
            return kiln_error(KILN_ERR_RUNTIME, "conv2d: oneDNN call %s failed (status %d)", \
                              #call, (int)dnnl_s_);                                         \
    } while (0)

static void conv_entry_free(conv_entry *e) {
    if (!e) return;
    if (e->prim) dnnl_primitive_destroy(e->prim);
    if (e->residual_reorder) dnnl_primitive_destroy(e->residual_reorder);
    for (int k = 0; k < 3; k++) {
        if (e->reorder[k]) dnnl_primitive_destroy(e->reorder[k]);
        if (e->user_mem[k]) dnnl_memory_destroy(e->user_mem[k]);
        if (e->blk_mem[k]) dnnl_memory_destroy(e->blk_mem[k]);
    }
    if (e->bias_mem) dnnl_memory_destroy(e->bias_mem);
    if (e->scratch_mem) dnnl_memory_destroy(e->scratch_mem);
    kiln_free(e->weights_seen);
    kiln_free(e->weights_blk);
    free(e);
}

/* ---- reference implementations: reported and counted ------------------------------------- */

static int64_t ref_count;     /* made in this process */
static int64_t lowp_runs;     /* bf16 convolutions run in this process */
static char **ref_seen;       /* the distinct descriptions */
static int64_t ref_nseen, ref_cap;

static const char *layout_name(int64_t layout) {
    static const char *const names[KILN_CONV_LAYOUT_COUNT] = {
        [KILN_CONV_NCHW] = "NCHW", [KILN_CONV_NHWC] = "NHWC",
        [KILN_CONV_BLOCKED16] = "nChw16c", [KILN_CONV_BLOCKED8] = "nChw8c",
    };
    return layout >= 0 && layout < KILN_CONV_LAYOUT_COUNT ? names[layout] : "?";
}

static bool is_ref(const_dnnl_primitive_desc_t pd) {
    const char *impl = NULL;
    return dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) == dnnl_success && impl &&
           !strncmp(impl, "ref", 3);
}

/* Checks the implementation oneDNN chose for pd, about to become a primitive that `what`
 * describes: a reference one is counted and, the first time for this description, reported
 * and remembered (under conv_lock). */
static void check_impl(const_dnnl_primitive_desc_t pd, const char *what) {
    const char *impl = NULL;
    if (!is_ref(pd) || dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) != dnnl_success) return;
    ref_count++;
    char desc[320];
    snprintf(desc, sizeof desc, "%s: %s", what, impl);
    for (int64_t i = 0; i < ref_nseen; i++)
        if (!strcmp(ref_seen[i], desc)) return;
    fprintf(stderr, "kiln: warning: oneDNN runs %s with its slow reference implementation (%s)\n", what, impl);
    if (ref_nseen == ref_cap) {
        int64_t cap = ref_cap ? 2 * ref_cap : 8;
        char **grown = kiln_realloc(ref_seen, sizeof *grown * (size_t)cap);
        if (!grown) return;
        ref_seen = grown, ref_cap = cap;
    }
    size_t n = strlen(desc) + 1;
    char *copy = kiln_malloc(n);
    if (copy) memcpy(copy, desc, n), ref_seen[ref_nseen++] = copy;
}

int64_t kiln_dnnl_ref_count(void) {
    pthread_mutex_lock(&conv_lock);
    int64_t n = ref_count;
    pthread_mutex_unlock(&conv_lock);
    return n;
}

int64_t kiln_conv_dnnl_lowp_count(void) {
    pthread_mutex_lock(&conv_lock);
    int64_t n = lowp_runs;
    pthread_mutex_unlock(&conv_lock);
    return n;
}

const char *kiln_dnnl_ref_describe(int64_t i) {
    pthread_mutex_lock(&conv_lock);
    const char *d = i >= 0 && i < ref_nseen ? ref_seen[i] : NULL;
    pthread_mutex_unlock(&conv_lock);
    return d;
}

static const char *const conv_kind_names[3] = {
    [KILN_CONV_FORWARD] = "conv2d forward",
    [KILN_CONV_BACKWARD_INPUT] = "conv2d backward (input)",
    [KILN_CONV_BACKWARD_WEIGHT] = "conv2d backward (weight)",
};

/* "conv2d forward x (1, 128, 64, 64) nChw16c, w (128, 128, 3, 3), stride 1x1, groups 1"
 * ("conv2d forward bf16 ..." for bfloat16 operands) */
static void conv_describe(const conv_entry *e, char *buf, size_t size) {
    const kiln_conv_params *p = &e->p;
    snprintf(buf, size, "%s%s x (%lld, %lld, %lld, %lld) %s, w (%lld, %lld, %lld, %lld), stride %lldx%lld, groups %lld",
             conv_kind_names[e->kind], e->dt[0] == dnnl_bf16 ? " bf16" : "", (long long)p->N, (long long)p->C, (long long)p->H, (long long)p->W,
             layout_name(e->ep.layout), (long long)p->O, (long long)(p->C / p->groups), (long long)p->KH,
             (long long)p->KW, (long long)p->sh, (long long)p->sw, (long long)p->groups);
}

/* oneDNN's format tag of the activations in `layout`; `other` for NCHW. */
static dnnl_format_tag_t layout_tag(int64_t layout, dnnl_format_tag_t other) {
    switch (layout) {
    case KILN_CONV_NHWC: return dnnl_nhwc;
    case KILN_CONV_BLOCKED16: return dnnl_nChw16c;
    case KILN_CONV_BLOCKED8: return dnnl_nChw8c;
    default: return other;
    }
}

static pthread_once_t block_once = PTHREAD_ONCE_INIT;
static int block_size;

static void block_size_init(void) {
    /* the ISA values are bit sets, each holding the bits of the ones it extends */
    unsigned isa = (unsigned)dnnl_get_effective_cpu_isa();
    bool avx512 = (isa & dnnl_cpu_isa_avx512_core) == dnnl_cpu_isa_avx512_core ||
                  (isa & dnnl_cpu_isa_avx512_mic) == dnnl_cpu_isa_avx512_mic;
    block_size = avx512 ? 16 : (isa & dnnl_cpu_isa_sse41) == dnnl_cpu_isa_sse41 ? 8 : 0;
}

int kiln_conv_block_size(void) {
    pthread_once(&block_once, block_size_init);
    return block_size;
}

/* The blocked weight format (OIhw<b>i<b>o) of the direct kernels reading activations in
 * channel blocks of b, or any. */
static dnnl_format_tag_t blocked_weights_tag(int b) {
    return b == 16 ? dnnl_OIhw16i16o : b == 8 ? dnnl_OIhw8i8o : dnnl_format_tag_any;
}

static kiln_status conv_init(void) {
    if (conv_stream) return KILN_OK;
    DNNL_TRY(dnnl_engine_create(&conv_engine, dnnl_cpu, 0));
    DNNL_TRY(dnnl_stream_create(&conv_stream, conv_engine, dnnl_stream_default_flags));
    return KILN_OK;
}

/* The data types of x, w, y of e's problem, from its operands' (ordered as kiln_conv_kind says). */
static void conv_xwy_types(const conv_entry *e, dnnl_data_type_t *xwy) {
    static const int operand_of[3][3] = { /* [kind][x, w, y] -> operand */
        [KILN_CONV_FORWARD] = {0, 1, 2},
        [KILN_CONV_BACKWARD_INPUT] = {2, 1, 0},
        [KILN_CONV_BACKWARD_WEIGHT] = {0, 2, 1},
    };
    for (int k = 0; k < 3; k++) xwy[k] = e->dt[operand_of[e->kind][k]];
}

/* The memory descriptors of x, w, y (data types xwy) in the user's layout (tag) or left to
 * oneDNN (any, or wtag for ungrouped weights); NHWC and blocked activations keep their layout
 * either way. */
static kiln_status conv_mds(const kiln_conv_params *p, const dnnl_data_type_t *xwy, int64_t layout, bool any,
                            dnnl_format_tag_t wtag, dnnl_memory_desc_t *x, dnnl_memory_desc_t *w,
                            dnnl_memory_desc_t *y) {
    dnnl_dims_t xd = {p->N, p->C, p->H, p->W}, yd = {p->N, p->O, p->OH, p->OW};
    dnnl_dims_t wd = {p->O, p->C / p->groups, p->KH, p->KW}, gwd = {p->groups, p->O / p->groups, p->C / p->groups, p->KH, p->KW};
    dnnl_format_tag_t act = layout_tag(layout, any ? dnnl_format_tag_any : dnnl_nchw);
    DNNL_TRY(dnnl_memory_desc_init_by_tag(x, 4, xd, xwy[0], act));
    DNNL_TRY(dnnl_memory_desc_init_by_tag(y, 4, yd, xwy[2], act));
    if (p->groups > 1) DNNL_TRY(dnnl_memory_desc_init_by_tag(w, 5, gwd, xwy[1], any ? dnnl_format_tag_any : dnnl_goihw));
    else DNNL_TRY(dnnl_memory_desc_init_by_tag(w, 4, wd, xwy[1], any ? wtag : dnnl_oihw));
    return KILN_OK;
}

/* Creates the primitive descriptor of e's kind (backward ones hinted by a forward one), with
 * activations in `layout` (NCHW: any), weights in format wtag (or any), by algorithm alg. */
static kiln_status conv_make_pd(conv_entry *e, int64_t layout, dnnl_primitive_attr_t attr, dnnl_format_tag_t wtag,
                                dnnl_alg_kind_t alg, dnnl_primitive_desc_t *fwd, dnnl_primitive_desc_t *pd) {
    const kiln_conv_params *p = &e->p;
    dnnl_memory_desc_t x, w, y, b;
    dnnl_dims_t strides = {p->sh, p->sw}, dil = {p->dh - 1, p->dw - 1}, pl = {p->pt, p->pl}, pr = {p->pb, p->pr};
    dnnl_dims_t bd = {p->O};
    dnnl_data_type_t xwy[3];
    conv_xwy_types(e, xwy);
    KILN_TRY(conv_mds(p, xwy, layout, true, wtag, &x, &w, &y));
    DNNL_TRY(dnnl_memory_desc_init_by_tag(&b, 1, bd, dnnl_f32, dnnl_x));
    dnnl_convolution_desc_t cd;
    /* a backward primitive is hinted by a training forward of the same algorithm */
    dnnl_prop_kind_t prop = e->ep.winograd && e->kind == KILN_CONV_FORWARD ? dnnl_forward_inference : dnnl_forward_training;
    DNNL_TRY(dnnl_dilated_convolution_forward_desc_init(&cd, prop, alg, &x, &w,
                                                        e->bias ? &b : NULL, &y, strides, dil, pl, pr));
    DNNL_TRY(dnnl_primitive_desc_create(fwd, &cd, e->kind == KILN_CONV_FORWARD ? attr : NULL, conv_engine, NULL));
    if (e->kind == KILN_CONV_FORWARD) return KILN_OK;
    if (e->kind == KILN_CONV_BACKWARD_INPUT)
        DNNL_TRY(dnnl_dilated_convolution_backward_data_desc_init(&cd, alg, &x, &w, &y, strides, dil, pl, pr));
    else
        DNNL_TRY(dnnl_dilated_convolution_backward_weights_desc_init(&cd, alg, &x, &w, NULL, &y, strides, dil, pl, pr));
    DNNL_TRY(dnnl_primitive_desc_create(pd, &cd, attr, conv_engine, *fwd));
    return KILN_OK;
}

static kiln_status conv_build(conv_entry *e, dnnl_primitive_desc_t pd) {
    dnnl_memory_desc_t ux, uw, uy;
    dnnl_data_type_t xwy[3];
    conv_xwy_types(e, xwy);
    KILN_TRY(conv_mds(&e->p, xwy, e->ep.layout, false, dnnl_oihw, &ux, &uw, &uy));
    const dnnl_memory_desc_t *user[3][3] = {
        [KILN_CONV_FORWARD] = {&ux, &uw, &uy},
        [KILN_CONV_BACKWARD_INPUT] = {&uy, &uw, &ux},
        [KILN_CONV_BACKWARD_WEIGHT] = {&ux, &uy, &uw},
    };
    static const char *const operands[3][3] = {
        [KILN_CONV_FORWARD] = {"x", "w", "y"},
        [KILN_CONV_BACKWARD_INPUT] = {"gy", "w", "gx"},
        [KILN_CONV_BACKWARD_WEIGHT] = {"x", "gy", "gw"},
    };
    char what[256], rwhat[300];
    conv_describe(e, what, sizeof what);
    check_impl(pd, what);
    DNNL_TRY(dnnl_primitive_create(&e->prim, pd));
    for (int k = 0; k < 3; k++) {
        e->user_md[k] = *user[e->kind][k];
        e->md[k] = *dnnl_primitive_desc_query_md(pd, conv_queries[e->kind][k], 0);
        DNNL_TRY(dnnl_memory_create(&e->user_mem[k], &e->user_md[k], conv_engine, DNNL_MEMORY_NONE));
        if (dnnl_memory_desc_equal(&e->user_md[k], &e->md[k])) continue;
        dnnl_primitive_desc_t rpd;
        if (k < 2) DNNL_TRY(dnnl_reorder_primitive_desc_create(&rpd, &e->user_md[k], conv_engine, &e->md[k], conv_engine, NULL));
        else DNNL_TRY(dnnl_reorder_primitive_desc_create(&rpd, &e->md[k], conv_engine, &e->user_md[k], conv_engine, NULL));
        snprintf(rwhat, sizeof rwhat, "the reorder of %s of %s", operands[e->kind][k], what);
        check_impl(rpd, rwhat);
        dnnl_status_t ds = dnnl_primitive_create(&e->reorder[k], rpd);
        dnnl_primitive_desc_destroy(rpd);
        DNNL_TRY(ds);
        e->blk_size[k] = dnnl_memory_desc_get_size(&e->md[k]);
        DNNL_TRY(dnnl_memory_create(&e->blk_mem[k], &e->md[k], conv_engine, DNNL_MEMORY_NONE));
    }
    if (e->ep.residual && e->reorder[2]) {
        dnnl_primitive_desc_t rpd;
        DNNL_TRY(dnnl_reorder_primitive_desc_create(&rpd, &e->user_md[2], conv_engine, &e->md[2], conv_engine, NULL));
        snprintf(rwhat, sizeof rwhat, "the reorder of the residual of %s", what);
        check_impl(rpd, rwhat);
        dnnl_status_t ds = dnnl_primitive_create(&e->residual_reorder, rpd);
        dnnl_primitive_desc_destroy(rpd);
        DNNL_TRY(ds);
    }
    const dnnl_memory_desc_t *smd = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    e->scratch_size = smd ? dnnl_memory_desc_get_size(smd) : 0;
    if (e->scratch_size) DNNL_TRY(dnnl_memory_create(&e->scratch_mem, smd, conv_engine, DNNL_MEMORY_NONE));
    if (e->bias) {
        dnnl_memory_desc_t b;
        dnnl_dims_t bd = {e->p.O};
        DNNL_TRY(dnnl_memory_desc_init_by_tag(&b, 1, bd, dnnl_f32, dnnl_x));
        DNNL_TRY(dnnl_memory_create(&e->bias_mem, &b, conv_engine, DNNL_MEMORY_NONE));
    }
    return KILN_OK;
}

/* The activations oneDNN applies as post-ops. Not relu and clamp: its kernels compute them
 * with max and min instructions (vmaxps x, 0), which give the bound for a NaN where kiln's
 * kernels and PyTorch give NaN; the caller applies those after the convolution. */
static const dnnl_alg_kind_t conv_activation_algs[KILN_CONV_ACT_COUNT] = {
    [KILN_CONV_ACT_GELU] = dnnl_eltwise_gelu_erf, [KILN_CONV_ACT_SILU] = dnnl_eltwise_swish,
    [KILN_CONV_ACT_SIGMOID] = dnnl_eltwise_logistic, [KILN_CONV_ACT_TANH] = dnnl_eltwise_tanh,
};

bool kiln_conv_dnnl_applies(int64_t activation) {
    return activation > KILN_CONV_ACT_NONE && activation < KILN_CONV_ACT_COUNT &&
           conv_activation_algs[activation] != dnnl_alg_kind_undef;
}

/* The post-ops of the epilogue: residual (sum), then activation (eltwise). */
static kiln_status conv_post_ops(const kiln_conv_epilogue *ep, dnnl_primitive_attr_t attr) {
    bool act = kiln_conv_dnnl_applies(ep->activation);
    if (!ep->residual && !act) return KILN_OK;
    dnnl_post_ops_t po;
    DNNL_TRY(dnnl_post_ops_create(&po));
    dnnl_status_t ds = dnnl_success;
    if (ep->residual) ds = dnnl_post_ops_append_sum(po, 1.0f);
    if (ds == dnnl_success && act) {
        float alpha = ep->activation == KILN_CONV_ACT_SILU ? 1.0f : (float)ep->alpha;
        ds = dnnl_post_ops_append_eltwise(po, 1.0f, conv_activation_algs[ep->activation], alpha, (float)ep->beta);
    }
    if (ds == dnnl_success) ds = dnnl_primitive_attr_set_post_ops(attr, po);
    dnnl_post_ops_destroy(po);
    DNNL_TRY(ds);
    return KILN_OK;
}

/* Destroys the primitive descriptors conv_make_pd made (both NULL after) when the one to run
 * (*pd, else *fwd) is oneDNN's reference implementation. */
static void drop_ref(dnnl_primitive_desc_t *fwd, dnnl_primitive_desc_t *pd) {
    if (!*fwd || !is_ref(*pd ? *pd : *fwd)) return;
    if (*pd) dnnl_primitive_desc_destroy(*pd);
    dnnl_primitive_desc_destroy(*fwd);
    *fwd = *pd = NULL;
}

/* Whether e has 16-bit operands (its primitive computes in bf16, accumulating in float32). */
static bool conv_lowp(const conv_entry *e) {
    return e->dt[0] != dnnl_f32 || e->dt[1] != dnnl_f32 || e->dt[2] != dnnl_f32;
}

static kiln_status conv_create(conv_entry *e) {
    dnnl_primitive_attr_t attr;
    dnnl_primitive_desc_t fwd = NULL, pd = NULL;
    DNNL_TRY(dnnl_primitive_attr_create(&attr));
    kiln_status s = KILN_OK;
    if (dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user) != dnnl_success)
        s = kiln_error(KILN_ERR_RUNTIME, "conv2d: oneDNN rejected the scratchpad mode");
    if (s == KILN_OK) s = conv_post_ops(&e->ep, attr);
    /* Winograd where allowed and oneDNN has it (3x3, stride 1, blocked activations, AVX-512;
     * forward, backward-input and backward-weight alike);
     * for channels-last, the blocked-weights kernel in place of brgconv, whose weight format
     * (Acdb16a) oneDNN reorders into ~100x slower than OIhw16i16o, at every call (weights
     * blocked as the CPU's direct kernels read them: left to oneDNN where there are none) */
    /* Each of these first choices is dropped when oneDNN has it only as its reference
     * implementation (forced weights on channels too few for a block, say): the last
     * choice, everything left to oneDNN, is never worse */
    /* bf16: oneDNN 2.x has no bf16 Winograd, and its bf16 direct kernels read their own weight
     * blocks (OIhw8i16o2i): both first choices are skipped */
    bool lowp = conv_lowp(e);
    if (s == KILN_OK && e->ep.winograd && !lowp) {
        s = conv_make_pd(e, e->ep.layout, attr, dnnl_format_tag_any, dnnl_convolution_winograd, &fwd, &pd);
        if (s != KILN_OK) kiln_clear_error(), s = KILN_OK;
        drop_ref(&fwd, &pd);
        /* operand 1 is the weights (forward, backward-input): their transform is kept */
        e->keep_weights = fwd != NULL && e->kind != KILN_CONV_BACKWARD_WEIGHT;
    }
    dnnl_format_tag_t wtag = blocked_weights_tag(kiln_conv_block_size());
    if (s == KILN_OK && !fwd && !lowp && e->ep.layout == KILN_CONV_NHWC && e->p.groups == 1 && wtag != dnnl_format_tag_any) {
        s = conv_make_pd(e, e->ep.layout, attr, wtag, dnnl_convolution_direct, &fwd, &pd);
        if (s != KILN_OK) kiln_clear_error(), s = KILN_OK;
        drop_ref(&fwd, &pd);
    }
    if (s == KILN_OK && !fwd) s = conv_make_pd(e, e->ep.layout, attr, dnnl_format_tag_any, dnnl_convolution_direct, &fwd, &pd);
    /* activations in a layout the CPU has no kernel for (nChw16c without AVX-512: a graph
     * rewritten for another CPU): oneDNN's choice, reordered to and from */
    if (s == KILN_OK && e->ep.layout != KILN_CONV_NCHW && is_ref(pd ? pd : fwd)) {
        dnnl_primitive_desc_t fwd2 = NULL, pd2 = NULL;
        if (conv_make_pd(e, KILN_CONV_NCHW, attr, dnnl_format_tag_any, dnnl_convolution_direct, &fwd2, &pd2) != KILN_OK) {
            kiln_clear_error();
            if (fwd2) dnnl_primitive_desc_destroy(fwd2);
        } else if (is_ref(pd2 ? pd2 : fwd2)) {
            drop_ref(&fwd2, &pd2);
        } else {
            if (pd) dnnl_primitive_desc_destroy(pd);
            dnnl_primitive_desc_destroy(fwd);
            fwd = fwd2, pd = pd2;
        }
    }
    /* bf16 that oneDNN has only as its reference implementation (orders of magnitude slower than
     * its float32 kernels): declined, the caller converts to float32 (remembered: not tried again) */
    if (s == KILN_OK && lowp && is_ref(pd ? pd : fwd)) e->declined = true;
    else if (s == KILN_OK) s = conv_build(e, pd ? pd : fwd);
    if (pd) dnnl_primitive_desc_destroy(pd);
    if (fwd) dnnl_primitive_desc_destroy(fwd);
    dnnl_primitive_attr_destroy(attr);
    return s;
}

/* The cached entry for (kind, bias, p, ep, dt), created on a miss (evicting the least recently used). */
static kiln_status conv_lookup(kiln_conv_kind kind, bool bias, const kiln_conv_params *p, const kiln_conv_epilogue *ep,
                               const dnnl_data_type_t *dt, conv_entry **out) {
    int slot = 0;
    for (int i = 0; i < CONV_CACHE_SIZE; i++) {
        conv_entry *e = conv_cache[i];
        if (e && e->kind == kind && e->bias == bias && !memcmp(&e->p, p, sizeof *p) && !memcmp(&e->ep, ep, sizeof *ep) &&
            !memcmp(e->dt, dt, sizeof e->dt)) {
            e->last_use = ++conv_clock;
            *out = e;
            return KILN_OK;
        }
        if (!e || (conv_cache[slot] && e->last_use < conv_cache[slot]->last_use)) slot = i;
    }
    conv_entry *e = kiln_calloc(1, sizeof *e);
    if (!e) return kiln_error(KILN_ERR_MEMORY, "conv2d: out of memory");
    e->kind = kind, e->bias = bias, e->p = *p, e->ep = *ep;
    memcpy(e->dt, dt, sizeof e->dt);
    kiln_status s = conv_create(e);
    if (s != KILN_OK && s != KILN_ERR_MEMORY && conv_lowp(e)) {
        /* a bf16 problem oneDNN refuses: remembered as declined, so it is not tried again */
        conv_entry *d = kiln_calloc(1, sizeof *d);
        if (d) {
            kiln_clear_error();
            d->kind = kind, d->bias = bias, d->p = *p, d->ep = *ep, d->declined = true, s = KILN_OK;
            memcpy(d->dt, dt, sizeof d->dt);
        }
        conv_entry_free(e);
        e = d;
    }
    if (s != KILN_OK) {
        conv_entry_free(e);
        return s;
    }
    conv_entry_free(conv_cache[slot]);
    conv_cache[slot] = e;
    e->last_use = ++conv_clock;
    *out = e;
    return KILN_OK;
}

static kiln_status conv_buffer(int k, size_t size, void **out) {
    if (size > conv_buf_size[k]) {
        kiln_free(conv_buf[k]);
        conv_buf_size[k] = 0;
        if (!(conv_buf[k] = kiln_alloc(size))) return KILN_ERR_MEMORY;
        conv_buf_size[k] = size;
    }
    *out = conv_buf[k];
    return KILN_OK;
}

/* Fills the destination of e (its blocked copy, or out itself) with the residual for `sum`. */
static kiln_status conv_load_residual(const conv_entry *e, const void *residual, void *out) {
    if (!e->residual_reorder) {
        if (residual != out) memcpy(out, residual, dnnl_memory_desc_get_size(&e->user_md[2]));
        return KILN_OK;
    }
    DNNL_TRY(dnnl_memory_set_data_handle(e->user_mem[2], (void *)residual));
    dnnl_exec_arg_t r[2] = {{DNNL_ARG_FROM, e->user_mem[2]}, {DNNL_ARG_TO, e->blk_mem[2]}};
    DNNL_TRY(dnnl_primitive_execute(e->residual_reorder, conv_stream, 2, r));
    return KILN_OK;
}

/* Points e's blocked weights at their reordered form of the user's weights w: the cached
 * one when w is unchanged since the last call, else reordered anew (and remembered). */
static kiln_status conv_forward_weights(conv_entry *e, const float *w) {
    size_t user = dnnl_memory_desc_get_size(&e->user_md[1]);
    if (!e->weights_blk) {
        e->weights_seen = kiln_alloc(user);
        e->weights_blk = kiln_alloc(e->blk_size[1]);
        if (!e->weights_seen || !e->weights_blk) return kiln_error(KILN_ERR_MEMORY, "conv2d: out of memory");
    } else if (!memcmp(e->weights_seen, w, user)) {
        DNNL_TRY(dnnl_memory_set_data_handle(e->blk_mem[1], e->weights_blk));
        return KILN_OK;
    }
    DNNL_TRY(dnnl_memory_set_data_handle(e->blk_mem[1], e->weights_blk));
    dnnl_exec_arg_t r[2] = {{DNNL_ARG_FROM, e->user_mem[1]}, {DNNL_ARG_TO, e->blk_mem[1]}};
    DNNL_TRY(dnnl_primitive_execute(e->reorder[1], conv_stream, 2, r));
    DNNL_TRY(dnnl_stream_wait(conv_stream));
    memcpy(e->weights_seen, w, user);
    return KILN_OK;
}

static kiln_status conv_exec(conv_entry *e, const void *a, const void *b, const float *bias,
                             const void *residual, void *out) {
    if (e->declined) return kiln_error(KILN_ERR_RUNTIME, "conv2d: oneDNN has no bf16 kernel for this problem");
    void *user[3] = {(void *)a, (void *)b, out}, *buf;
    dnnl_exec_arg_t args[5];
    int nargs = 0;
    for (int k = 0; k < 3; k++) {
        DNNL_TRY(dnnl_memory_set_data_handle(e->user_mem[k], user[k]));
        dnnl_memory_t m = e->user_mem[k];
        if (e->reorder[k] && k == 1 && e->keep_weights) {
            KILN_TRY(conv_forward_weights(e, b));
            m = e->blk_mem[k];
        } else if (e->reorder[k]) {
            KILN_TRY(conv_buffer(k, e->blk_size[k], &buf));
            DNNL_TRY(dnnl_memory_set_data_handle(e->blk_mem[k], buf));
            m = e->blk_mem[k];
            if (k < 2) {
                dnnl_exec_arg_t r[2] = {{DNNL_ARG_FROM, e->user_mem[k]}, {DNNL_ARG_TO, m}};
                DNNL_TRY(dnnl_primitive_execute(e->reorder[k], conv_stream, 2, r));
            }
        }
        args[nargs++] = (dnnl_exec_arg_t){conv_args[e->kind][k], m};
    }
    if (e->ep.residual) {
        KILN_TRY(conv_load_residual(e, residual, out));
        DNNL_TRY(dnnl_memory_set_data_handle(e->user_mem[2], out));
    }
    if (e->bias) {
        DNNL_TRY(dnnl_memory_set_data_handle(e->bias_mem, (void *)bias));
        args[nargs++] = (dnnl_exec_arg_t){DNNL_ARG_BIAS, e->bias_mem};
    }
    if (e->scratch_mem) {
        KILN_TRY(conv_buffer(3, e->scratch_size, &buf));
        DNNL_TRY(dnnl_memory_set_data_handle(e->scratch_mem, buf));
        args[nargs++] = (dnnl_exec_arg_t){DNNL_ARG_SCRATCHPAD, e->scratch_mem};
    }
    DNNL_TRY(dnnl_primitive_execute(e->prim, conv_stream, nargs, args));
    if (e->reorder[2]) {
        dnnl_exec_arg_t r[2] = {{DNNL_ARG_FROM, e->blk_mem[2]}, {DNNL_ARG_TO, e->user_mem[2]}};
        DNNL_TRY(dnnl_primitive_execute(e->reorder[2], conv_stream, 2, r));
    }
    DNNL_TRY(dnnl_stream_wait(conv_stream));
    if (conv_lowp(e)) lowp_runs++;
    return KILN_OK;
}

static kiln_status conv_run_types(kiln_conv_kind kind, const kiln_conv_params *p, const kiln_conv_epilogue *ep,
                                  const dnnl_data_type_t *dt, const void *a, const void *b, const float *bias,
                                  const void *residual, void *out) {
    if (!ep) ep = &conv_no_epilogue;
    pthread_mutex_lock(&conv_lock);
    conv_entry *e = NULL;
    kiln_status s = conv_init();
    if (s == KILN_OK) s = conv_lookup(kind, bias != NULL, p, ep, dt, &e);
    if (s == KILN_OK) s = conv_exec(e, a, b, bias, residual, out);
    pthread_mutex_unlock(&conv_lock);
    return s;
}

kiln_status kiln_conv_dnnl_run(kiln_conv_kind kind, const kiln_conv_params *p, const kiln_conv_epilogue *ep,
                               const float *a, const float *b, const float *bias, const float *residual, float *out) {
    static const dnnl_data_type_t f32[3] = {dnnl_f32, dnnl_f32, dnnl_f32};
    return conv_run_types(kind, p, ep, f32, a, b, bias, residual, out);
}

kiln_status kiln_conv_dnnl_run_bf16(kiln_conv_kind kind, const kiln_conv_params *p, const kiln_conv_epilogue *ep,
                                    const uint16_t *a, const uint16_t *b, const float *bias, const uint16_t *residual,
                                    uint16_t *out) {
    static const dnnl_data_type_t bf16[3] = {dnnl_bf16, dnnl_bf16, dnnl_bf16};
    kiln_conv_epilogue direct = ep ? *ep : conv_no_epilogue;
    direct.winograd = 0; /* no bf16 Winograd: one cache entry whatever the attribute says */
    return conv_run_types(kind, p, &direct, bf16, a, b, bias, residual, out);
}

/* ---- relayout: oneDNN's reorders between activation layouts (float32) ---------------------- */

#define RELAYOUT_CACHE_SIZE 16

typedef struct {
    int64_t dims[4], from, to;
    dnnl_primitive_t prim;
    dnnl_memory_t src, dst;
} relayout_entry;

static relayout_entry relayout_cache[RELAYOUT_CACHE_SIZE];
static int relayout_next; /* the slot replaced on the next miss */

static void relayout_entry_clear(relayout_entry *e) {
    if (e->prim) dnnl_primitive_destroy(e->prim);
    if (e->src) dnnl_memory_destroy(e->src);
    if (e->dst) dnnl_memory_destroy(e->dst);
    memset(e, 0, sizeof *e);
}

static kiln_status relayout_create(relayout_entry *e) {
    dnnl_dims_t d = {e->dims[0], e->dims[1], e->dims[2], e->dims[3]};
    dnnl_memory_desc_t src, dst;
    DNNL_TRY(dnnl_memory_desc_init_by_tag(&src, 4, d, dnnl_f32, layout_tag(e->from, dnnl_nchw)));
    DNNL_TRY(dnnl_memory_desc_init_by_tag(&dst, 4, d, dnnl_f32, layout_tag(e->to, dnnl_nchw)));
    dnnl_primitive_desc_t pd;
    DNNL_TRY(dnnl_reorder_primitive_desc_create(&pd, &src, conv_engine, &dst, conv_engine, NULL));
    char what[160];
    snprintf(what, sizeof what, "relayout (%lld, %lld, %lld, %lld) %s -> %s", (long long)d[0], (long long)d[1],
             (long long)d[2], (long long)d[3], layout_name(e->from), layout_name(e->to));
    check_impl(pd, what);
    dnnl_status_t ds = dnnl_primitive_create(&e->prim, pd);
    dnnl_primitive_desc_destroy(pd);
    DNNL_TRY(ds);
    DNNL_TRY(dnnl_memory_create(&e->src, &src, conv_engine, DNNL_MEMORY_NONE));
    DNNL_TRY(dnnl_memory_create(&e->dst, &dst, conv_engine, DNNL_MEMORY_NONE));
    return KILN_OK;
}

static kiln_status relayout_run(const int64_t *nchw, int64_t from, int64_t to, const float *src, float *dst) {
    KILN_TRY(conv_init());
    relayout_entry *e = NULL;
    for (int i = 0; i < RELAYOUT_CACHE_SIZE && !e; i++) {
        relayout_entry *c = &relayout_cache[i];
        if (c->prim && c->from == from && c->to == to && !memcmp(c->dims, nchw, sizeof c->dims)) e = c;
    }
    if (!e) {
        e = &relayout_cache[relayout_next];
        relayout_next = (relayout_next + 1) % RELAYOUT_CACHE_SIZE;
        relayout_entry_clear(e);
        memcpy(e->dims, nchw, sizeof e->dims);
        e->from = from, e->to = to;
        kiln_status s = relayout_create(e);
        if (s != KILN_OK) {
            relayout_entry_clear(e);
            return s;
        }
    }
    DNNL_TRY(dnnl_memory_set_data_handle(e->src, (void *)src));
    DNNL_TRY(dnnl_memory_set_data_handle(e->dst, dst));
    dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, e->src}, {DNNL_ARG_TO, e->dst}};
    DNNL_TRY(dnnl_primitive_execute(e->prim, conv_stream, 2, args));
    DNNL_TRY(dnnl_stream_wait(conv_stream));
    return KILN_OK;
}

kiln_status kiln_conv_dnnl_relayout(const int64_t *nchw, kiln_conv_layout from, kiln_conv_layout to, const float *src,
                                    float *dst) {
    pthread_mutex_lock(&conv_lock);
    kiln_status s = relayout_run(nchw, from, to, src, dst);
    pthread_mutex_unlock(&conv_lock);
    return s;
}
