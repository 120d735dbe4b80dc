/* The passes of each optimization level, in order. O0 runs only what correctness needs. */
#include "../ir/control.h"
#include "../ir/symbolic.h"
#include "passes_internal.h"
#include "../core/profile.h"
#include "../core/hooks.h"

static const kiln_pass o0_passes[] = {{NULL, NULL}};

/* O1's passes up to the elementwise fusion; O2 runs them too, by this one list (O2 once had a copy
 * of its own, which missed the conv and matmul epilogue fusions and the channels-last rewrite O1
 * gained later and so ran slower than O1: issue 17) */
#define O1_REWRITES                                                                        \
    {"hoist_loop_projections", kiln_pass_hoist_loop_projections}, /* first: see below */   \
    {"dce", kiln_pass_dce},                                                                \
    {"fold_batch_norm", kiln_pass_fold_batch_norm}, /* inference graphs only */            \
    {"decompose_batch_norm", kiln_pass_decompose_batch_norm}, /* O2: elementwise */      \
    {"cse", kiln_pass_cse},                                                                \
    {"constant_fold", kiln_pass_constant_fold},                                            \
    {"simplify", kiln_pass_simplify},                                                      \
    {"join_slice_writes", kiln_pass_join_slice_writes}, /* summed gradients of slices */   \
    {"fuse_attention", kiln_pass_fuse_attention}, /* by the cost model */                \
    {"dce", kiln_pass_dce},                                                                \
    {"fuse_conv_epilogue", kiln_pass_fuse_conv_epilogue},                                  \
    {"channels_last", kiln_pass_channels_last}, /* off with disable_format_transform */    \
    {"fuse_matmul_epilogue", kiln_pass_fuse_matmul_epilogue},                              \
    {"fuse_bn_relu_backward", kiln_pass_fuse_bn_relu_backward}, /* training graphs */     \
    {"conv_algorithm", kiln_pass_conv_algorithm}, /* Winograd in training graphs */        \
    {"bucket_all_reduce", kiln_pass_bucket_all_reduce} /* data-parallel gradients */

static const kiln_pass o1_passes[] = {
    O1_REWRITES,
    {"fuse_elementwise", kiln_pass_fuse_elementwise},
    {NULL, NULL},
};

/* O1's passes, and more aggressive fusion: cheap producers read by several kernels are recomputed in
 * each (duplicate_producers, right before the elementwise fusion it feeds) */
static const kiln_pass o2_passes[] = {
    O1_REWRITES,
    {"duplicate_producers", kiln_pass_duplicate_producers},
    {"fuse_elementwise", kiln_pass_fuse_elementwise},
    {NULL, NULL},
};

static int count(const kiln_pass *p) {
    int n = 0;
    while (p[n].name) n++;
    return n;
}

const kiln_pass *kiln_pipeline(kiln_jit_level level, int *n) {
    const kiln_pass *p = level == KILN_LEVEL_O2 ? o2_passes : (level == KILN_LEVEL_O1 ? o1_passes : o0_passes);
    *n = count(p);
    return p;
}

/* A pass keeps the outputs' sizes: the same expressions where they are symbolic (a pass that
 * used a hint as a size would change them, caught here rather than wrong at another binding). */
static kiln_status same_output_sizes(const kiln_graph *before, const kiln_graph *after) {
    if (!kiln_graph_is_symbolic(before)) return KILN_OK;
    for (int32_t k = 0; k < before->noutputs && k < after->noutputs; k++)
        if (!kiln_value_same_shape(&before->values[before->outputs[k]], &after->values[after->outputs[k]]))
            return kiln_error(KILN_ERR_VALUE, "output %d no longer has the same symbolic sizes", k);
    return KILN_OK;
}

static kiln_status run(const kiln_pass *pass, kiln_graph **g, const kiln_pass_options *opt) {
    kiln_graph *out = NULL;
    int64_t start = kiln_profiling_phases() ? kiln_profile_now() : 0;
    kiln_status s = pass->run(*g, opt, &out);
    if (start) kiln_profile_phase(pass->name, out ? "pass: changed the graph" : "pass: unchanged", start);
    if (s != KILN_OK) return kiln_error_context(s, "in pass %s", pass->name);
    if (out) {
        s = kiln_graph_verify(out);
        if (s == KILN_OK) s = same_output_sizes(*g, out);
        if (s != KILN_OK) {
            kiln_graph_free(out);
            return kiln_error_context(s, "after pass %s", pass->name);
        }
        kiln_graph_free(*g);
        *g = out;
    }
    const char *dump = getenv("KILN_DUMP_IR");
    if (dump && strcmp(dump, "1") == 0) {
        char *text = kiln_graph_to_string(*g);
        fprintf(stderr, "[kiln] after %s%s:\n%s", pass->name, out ? "" : " (unchanged)", text ? text : "?\n");
        free(text);
    }
    return KILN_OK;
}

/* The subgraphs control-flow nodes run are optimized like the graph itself (their inputs and
 * outputs stay as they are); fused groups' subgraphs are left alone. */
static kiln_status optimize_bodies(kiln_graph *g, const kiln_pass_options *opt) {
    if (opt->level == KILN_LEVEL_O0 || !g->nsubgraphs) return KILN_OK;
    bool *body = kiln_calloc((size_t)g->nsubgraphs, sizeof *body);
    if (!body) return kiln_error(KILN_ERR_MEMORY, "out of memory optimizing a graph");
    for (int32_t i = 0; i < g->nnodes; i++) {
        const kiln_node *n = &g->nodes[i];
        int slots[4], nslots = kiln_control_slots(n->op, slots);
        for (int k = 0; k < nslots; k++) {
            int32_t idx;
            if (kiln_graph_body_index(g, n->op, &n->attrs, k, &idx) == KILN_OK) body[idx] = true;
        }
    }
    kiln_status s = KILN_OK;
    for (int32_t k = 0; k < g->nsubgraphs && s == KILN_OK; k++)
        if (body[k]) s = kiln_optimize(&g->subgraphs[k], opt);
    free(body);
    return s;
}

kiln_status kiln_optimize(kiln_graph **g, const kiln_pass_options *opt) {
    int n, first = 0;
    const kiln_pass *passes = kiln_pipeline(opt->level, &n);
    /* loop-invariant products leave loop bodies before the bodies' own passes fuse them into
     * matmul epilogues */
    if (n > 0 && passes[0].run == kiln_pass_hoist_loop_projections) KILN_TRY(run(&passes[first++], g, opt));
    KILN_TRY(optimize_bodies(*g, opt));
    for (int k = first; k < n; k++) KILN_TRY(run(&passes[k], g, opt));
    return KILN_OK;
}

kiln_status kiln_run_pass(const char *name, kiln_graph **g, const kiln_pass_options *opt) {
    for (int level = KILN_LEVEL_O0; level <= KILN_LEVEL_O2; level++) {
        int n;
        const kiln_pass *passes = kiln_pipeline((kiln_jit_level)level, &n);
        for (int k = 0; k < n; k++)
            if (strcmp(passes[k].name, name) == 0) return run(&passes[k], g, opt);
    }
    return kiln_error(KILN_ERR_VALUE, "unknown pass '%s'", name);
}

/* The dce pass at level O0, for the IR, which reaches it through a hook (ir/control_grad.c prunes
 * gradient bodies). */
static kiln_status eliminate_dead_code(kiln_graph **g) {
    kiln_pass_options opt = {KILN_LEVEL_O0, false, false, KILN_CONV_FUSE_ALL, false};
    return kiln_run_pass("dce", g, &opt);
}

/* O1 over a body the runtime compiles for one eager call of a control-flow node (core/hooks.h). */
static kiln_status optimize_body(kiln_graph **g) {
    kiln_pass_options opt = {KILN_LEVEL_O1, false, false, KILN_CONV_FUSE_ALL, false};
    return kiln_optimize(g, &opt);
}

__attribute__((constructor)) static void register_dead_code(void) {
    kiln_hooks.eliminate_dead_code = eliminate_dead_code;
    kiln_hooks.optimize_body = optimize_body;
}
