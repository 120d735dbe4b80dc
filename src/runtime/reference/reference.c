/* The reference backend ("reference"): runs a plan with nothing of its own making, as a check of
 * the backends that do (kbk, sink). Each node calls its op's kernel from the op table (the eager
 * kernels), into tensors allocated for the call: the plan's arena and offsets are not used, and
 * every value is held until the call ends. A fused group runs its subgraph node by node the same
 * way (no generated code); control-flow nodes run their nested plans on this backend
 * (control_flow.c). It keeps no state between calls, so calls may run concurrently. Registered in
 * src/runtime/backends.def; everything else of it is in this folder. */
#include "../../ir/body.h"
#include "../../ir/control.h"
#include "../backend.h"
#include "../control_flow.h"

const kiln_backend kiln_backend_reference;

typedef struct {
    const kiln_plan *p;
    kiln_control_node **control; /* per node: the executables of an if / while, or NULL */
} reference_state;

static void reference_free(void *state) {
    reference_state *r = state;
    if (!r) return;
    for (int32_t i = 0; r->control && i < r->p->g->nnodes; i++) kiln_control_free(r->control[i]);
    free(r->control);
    free(r);
}

static kiln_status reference_prepare(const kiln_plan *p, kiln_plan_memory *mem, void **state) {
    (void)mem; /* every value gets its own tensor per call */
    reference_state *r = kiln_calloc(1, sizeof *r);
    int32_t nn = p->g->nnodes;
    if (r) r->control = kiln_calloc((size_t)(nn ? nn : 1), sizeof *r->control);
    if (!r || !r->control) {
        free(r);
        return kiln_error(KILN_ERR_MEMORY, "out of memory compiling a graph");
    }
    r->p = p;
    kiln_status s = KILN_OK;
    for (int32_t i = 0; i < nn && s == KILN_OK; i++)
        if (kiln_op_is_control(p->g->nodes[i].op))
            s = kiln_control_prepare(p, i, &kiln_backend_reference, &r->control[i]);
    if (s != KILN_OK) {
        reference_free(r);
        return s;
    }
    *state = r;
    return KILN_OK;
}

static kiln_status run_graph(const kiln_graph *g, const int32_t *order, kiln_control_node *const *control, int nin,
                             kiln_tensor *const *in, int nout, kiln_tensor **out);

/* A fused group: its subgraph (one output) run node by node, the result copied into out. */
static kiln_status run_fused(const kiln_graph *g, const kiln_node *nd, kiln_tensor *const *in, kiln_tensor *out) {
    kiln_graph *sub;
    KILN_TRY(kiln_graph_body(g, nd, 0, &sub));
    if (sub->noutputs != 1) return kiln_error(KILN_ERR_VALUE, "graph: a fused group has %d outputs, not 1", sub->noutputs);
    kiln_tensor *result = NULL;
    KILN_TRY(run_graph(sub, NULL, NULL, nd->nin, in, 1, &result));
    kiln_status s = kiln_copy_into(out, result);
    kiln_tensor_release(result);
    return s;
}

/* One node of g: its kernel from the op table (a fused group's nodes, an if's or while's nested
 * plans) on the tensors of slot[]; its outputs into slot[] (new references). */
static kiln_status run_node(const kiln_graph *g, int32_t i, kiln_control_node *control, kiln_tensor **slot) {
    const kiln_node *nd = &g->nodes[i];
    const kiln_op_info *info = &kiln_op_table[nd->op];
    kiln_tensor *small[8], **ins = nd->nin <= 8 ? small : kiln_malloc(sizeof *ins * (size_t)nd->nin);
    if (!ins) return kiln_error(KILN_ERR_MEMORY, "out of memory running a graph");
    for (int k = 0; k < nd->nin; k++) ins[k] = slot[nd->in[k]];
    kiln_tensor *outs[KILN_MAX_OUTPUTS] = {0};
    kiln_status s = KILN_OK;
    if (!(info->flags & (KILN_OPF_VIEW | KILN_OPF_MUTATES))) /* views and in-place ops make their own */
        for (int k = 0; k < nd->nout && s == KILN_OK; k++) s = kiln_tensor_empty_like_meta(&g->values[nd->out[k]].meta, &outs[k]);
    if (s == KILN_OK) {
        if (nd->op == KILN_OP_FUSED) s = run_fused(g, nd, ins, outs[0]);
        else if (kiln_op_is_control(nd->op) && !control)
            s = kiln_error(KILN_ERR_VALUE, "reference backend: %s inside a fused group", info->name);
        else if (control) s = kiln_control_run(control, nd->nin, ins, nd->nout, outs);
        else s = info->kernel(ins, nd->nin, &nd->attrs, outs);
    }
    if (s == KILN_OK && (info->flags & KILN_OPF_MUTATES)) kiln_tensor_bump_version(ins[0]);
    if (ins != small) free(ins);
    if (s != KILN_OK) {
        kiln_release_all(outs, nd->nout);
        if (nd->loc >= 0) return kiln_error_context(s, "%s (%s)", info->name, g->locs[nd->loc]);
        return kiln_error_context(s, "%s", info->name);
    }
    for (int k = 0; k < nd->nout; k++) slot[nd->out[k]] = outs[k];
    return KILN_OK;
}

/* g on in[] (metas checked), its nodes in order (NULL: as numbered, the order they were recorded);
 * out[] receive new references. */
static kiln_status run_graph(const kiln_graph *g, const int32_t *order, kiln_control_node *const *control, int nin,
                             kiln_tensor *const *in, int nout, kiln_tensor **out) {
    KILN_TRY(kiln_check_inputs(g, nin, in, nout));
    kiln_tensor **slot = kiln_calloc((size_t)(g->nvalues ? g->nvalues : 1), sizeof *slot); /* all owned */
    if (!slot) return kiln_error(KILN_ERR_MEMORY, "out of memory running a graph");
    for (int k = 0; k < nin; k++) kiln_tensor_retain(slot[g->inputs[k]] = in[k]);
    for (int32_t c = 0; c < g->ncaptures; c++) kiln_tensor_retain(slot[g->captures[c]] = g->values[g->captures[c]].bound);
    kiln_status s = KILN_OK;
    for (int32_t step = 0; step < g->nnodes && s == KILN_OK; step++) {
        int32_t i = order ? order[step] : step;
        if ((s = kiln_check_interrupt()) == KILN_OK) s = run_node(g, i, control ? control[i] : NULL, slot);
    }
    for (int k = 0; k < nout && s == KILN_OK; k++) {
        int32_t v = g->outputs[k], root = v; /* a view of a constant is handed out as a copy */
        while (g->values[root].kind == KILN_VALUE_NODE && (kiln_op_table[g->nodes[g->values[root].node].op].flags &
                                                           (KILN_OPF_VIEW | KILN_OPF_MUTATES)) &&
               g->values[root].index == 0)
            root = g->nodes[g->values[root].node].in[0];
        s = kiln_output_hand_out(&g->values[root], slot[v], &out[k]);
        if (s != KILN_OK) kiln_release_all(out, k);
    }
    for (int32_t v = 0; v < g->nvalues; v++) kiln_tensor_release(slot[v]);
    free(slot);
    return s;
}

static kiln_status reference_run(void *state, int nin, kiln_tensor *const *in, int nout, kiln_tensor **out) {
    const reference_state *r = state;
    return run_graph(r->p->g, r->p->order, r->control, nin, in, nout, out);
}

static kiln_status reference_run_into(void *state, int nin, kiln_tensor *const *in, int nout, kiln_tensor *const *into) {
    kiln_tensor *small[8], **out = nout <= 8 ? small : kiln_calloc((size_t)nout, sizeof *out);
    if (!out) return kiln_error(KILN_ERR_MEMORY, "out of memory running a graph");
    kiln_status s = reference_run(state, nin, in, nout, out);
    if (s == KILN_OK) {
        for (int k = 0; k < nout && s == KILN_OK; k++) s = kiln_copy_into(into[k], out[k]);
        kiln_release_all(out, nout);
    }
    if (out != small) free(out);
    return s;
}

const kiln_backend kiln_backend_reference = {
    .name = "reference",
    .prepare = reference_prepare,
    .run = reference_run,
    .run_into = reference_run_into,
    .free = reference_free,
};
