/* Constant folding: a node whose inputs are all constants (constant captures nobody writes, or
 * outputs of nodes folded before it) is run at compile time and its used outputs become new
 * constant captures; creation ops (full, arange, ...) fold too. Left alone: effects (in-place
 * writes, random draws), fused groups, outputs above MAX_FOLDED elements (unless
 * fold_large_constants: a dumped model stores them once), nodes whose buffers
 * are written in place, graph outputs (the caller gets a fresh tensor each call, not a shared
 * constant), and nodes whose kernel fails (the error shows at run time as it would eagerly). */
#include "passes_internal.h"

bool kiln_pass_has_effects(const kiln_node *n); /* cse.c */
bool *kiln_pass_written_buffers(const kiln_graph *g);

#define MAX_FOLDED 65536

typedef struct {
    const kiln_graph *src;
    bool *written, *is_output;
    kiln_tensor **known; /* per src value: its constant value (borrowed for captures) */
    bool *owned;         /* per src value: known[v] is ours to release */
    bool *folded;        /* per src node */
    bool any_size;       /* fold_large_constants */
    int32_t nfolded;
} folder;

static bool candidate(const folder *f, const kiln_node *n) {
    /* fused and control-flow nodes run subgraphs, which only the executor can */
    if (kiln_pass_has_effects(n) || n->op == KILN_OP_FUSED || (kiln_op_table[n->op].flags & KILN_OPF_CONTROL)) return false;
    if (n->attr_sym) return false; /* sizes of symbols (a full of s0 elements): no constant holds them */
    for (int k = 0; k < n->nin; k++)
        if (!f->known[n->in[k]]) return false;
    int64_t numel = 0;
    for (int k = 0; k < n->nout; k++) {
        const kiln_value *v = &f->src->values[n->out[k]];
        if (f->written[n->out[k]] || f->is_output[n->out[k]]) return false;
        numel += kiln_meta_numel(&v->meta);
    }
    return numel <= MAX_FOLDED || f->any_size;
}

static kiln_status evaluate(folder *f) {
    const kiln_graph *g = f->src;
    for (int32_t c = 0; c < g->ncaptures; c++) {
        const kiln_value *v = &g->values[g->captures[c]];
        if (v->constant && !f->written[g->captures[c]]) f->known[g->captures[c]] = v->bound;
    }
    kiln_tensor *small[8], **ins = small;
    int cap = 8;
    kiln_status s = KILN_OK;
    for (int32_t i = 0; i < g->nnodes && s == KILN_OK; i++) {
        const kiln_node *n = &g->nodes[i];
        if (!candidate(f, n)) continue;
        if (n->nin > cap) {
            kiln_tensor **grown = kiln_malloc(sizeof *grown * (size_t)n->nin);
            if (!grown) {
                s = kiln_error(KILN_ERR_MEMORY, "out of memory in constant_fold");
                break;
            }
            if (ins != small) free(ins);
            ins = grown;
            cap = n->nin;
        }
        for (int k = 0; k < n->nin; k++) ins[k] = f->known[n->in[k]];
        kiln_tensor *outs[KILN_MAX_OUTPUTS] = {0};
        if (kiln_apply(n->op, n->nin, ins, &n->attrs, outs) != KILN_OK) {
            kiln_clear_error(); /* left to fail at run time */
            continue;
        }
        for (int k = 0; k < n->nout; k++) {
            f->known[n->out[k]] = outs[k];
            f->owned[n->out[k]] = true;
        }
        f->folded[i] = true;
        f->nfolded++;
    }
    if (ins != small) free(ins);
    return s;
}

static kiln_status rewrite(folder *f, kiln_graph **out) {
    const kiln_graph *g = f->src;
    kiln_rewriter rw;
    KILN_TRY(kiln_rewriter_begin(&rw, g));
    kiln_status s = KILN_OK;
    for (int32_t i = 0; i < g->nnodes && s == KILN_OK; i++) {
        const kiln_node *n = &g->nodes[i];
        if (f->folded[i]) continue;
        for (int k = 0; k < n->nin && s == KILN_OK; k++) {
            int32_t v = n->in[k];
            if (rw.map[v] < 0 && f->owned[v]) s = kiln_graph_add_capture(rw.dst, f->known[v], true, &rw.map[v]);
        }
        if (s == KILN_OK) s = kiln_rewriter_copy_node(&rw, i);
    }
    if (s == KILN_OK) return kiln_rewriter_finish(&rw, out);
    kiln_rewriter_abort(&rw);
    return s;
}

kiln_status kiln_pass_constant_fold(const kiln_graph *in, const kiln_pass_options *opt, kiln_graph **out) {
    *out = NULL;
    /* evaluating ops must not record them into a trace */
    if (kiln_tracer_active()) return KILN_OK;
    size_t nv = (size_t)(in->nvalues ? in->nvalues : 1), nn = (size_t)(in->nnodes ? in->nnodes : 1);
    folder f = {.src = in, .any_size = opt->fold_large_constants};
    f.written = kiln_pass_written_buffers(in);
    f.is_output = kiln_calloc(nv, sizeof(bool));
    f.known = kiln_calloc(nv, sizeof(kiln_tensor *));
    f.owned = kiln_calloc(nv, sizeof(bool));
    f.folded = kiln_calloc(nn, sizeof(bool));
    kiln_status s = KILN_OK;
    if (!f.written || !f.is_output || !f.known || !f.owned || !f.folded)
        s = kiln_error(KILN_ERR_MEMORY, "out of memory in constant_fold");
    for (int32_t k = 0; k < in->noutputs && s == KILN_OK; k++) f.is_output[in->outputs[k]] = true;
    if (s == KILN_OK) {
        bool grad = kiln_set_grad_enabled(false);
        s = evaluate(&f);
        kiln_set_grad_enabled(grad);
    }
    if (s == KILN_OK && f.nfolded) s = rewrite(&f, out);
    for (int32_t v = 0; v < in->nvalues && f.known && f.owned; v++)
        if (f.owned[v]) kiln_tensor_release(f.known[v]);
    free(f.written), free(f.is_output), free(f.known), free(f.owned), free(f.folded);
    return s;
}
