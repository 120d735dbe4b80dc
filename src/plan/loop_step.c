/* kiln_plan_compose_loop_step (see plan.h). */
#include "plan.h"

#include "../ir/control.h"

/* A while's iteration as one graph, so a compiled loop runs one plan per iteration:
 * (v..., lifted...) -> (the body's next v..., the cond of them).
 * The body is copied as it is; the cond's nodes follow, reading the body's outputs for the loop
 * values and the shared inputs for the lifted ones, its subgraphs appended after the body's. */
kiln_status kiln_plan_compose_loop_step(const kiln_graph *cond, const kiln_graph *body, int nloop, kiln_graph **out) {
    kiln_graph *g = NULL;
    KILN_TRY(kiln_graph_clone(body, &g));
    int32_t base = g->nsubgraphs, *map = kiln_malloc(sizeof(int32_t) * (size_t)(cond->nvalues ? cond->nvalues : 1));
    kiln_status s = map ? KILN_OK : kiln_error(KILN_ERR_MEMORY, "out of memory compiling a loop");
    for (int32_t k = 0; k < cond->nsubgraphs && s == KILN_OK; k++) {
        kiln_graph *sub = NULL;
        int32_t index;
        s = kiln_graph_clone(cond->subgraphs[k], &sub);
        if (s == KILN_OK) s = kiln_graph_add_subgraph(g, sub, &index);
        if (s != KILN_OK) kiln_graph_free(sub);
    }
    for (int32_t k = 0; k < cond->ninputs && s == KILN_OK; k++)
        map[cond->inputs[k]] = k < nloop ? body->outputs[k] : g->inputs[k];
    for (int32_t k = 0; k < cond->ncaptures && s == KILN_OK; k++) {
        const kiln_value *v = &cond->values[cond->captures[k]];
        s = kiln_graph_add_capture(g, v->bound, v->constant, &map[cond->captures[k]]);
    }
    for (int32_t i = 0; i < cond->nnodes && s == KILN_OK; i++) {
        const kiln_node *nd = &cond->nodes[i];
        kiln_attrs a = nd->attrs;
        for (int k = 0; k < kiln_op_nbodies(nd->op); k++) { /* its subgraphs, now after g's own */
            int slot = kiln_op_body_attr(nd->op, k);
            if (slot < a.ni) a.i[slot] += base;
        }
        int32_t loc = -1, *in = kiln_malloc(sizeof(int32_t) * (size_t)(nd->nin ? nd->nin : 1)), outs[KILN_MAX_OUTPUTS];
        if (!in) s = kiln_error(KILN_ERR_MEMORY, "out of memory compiling a loop");
        for (int k = 0; k < nd->nin && s == KILN_OK; k++) in[k] = map[nd->in[k]];
        if (s == KILN_OK && nd->loc >= 0) s = kiln_graph_add_loc(g, cond->locs[nd->loc], &loc);
        if (s == KILN_OK) s = kiln_graph_add_node(g, nd->op, nd->nin, in, &a, loc, outs);
        for (int k = 0; k < nd->nout && s == KILN_OK; k++) map[nd->out[k]] = outs[k];
        free(in);
    }
    int32_t *outputs = s == KILN_OK ? kiln_malloc(sizeof(int32_t) * (size_t)(nloop + 1)) : NULL;
    if (s == KILN_OK && !outputs) s = kiln_error(KILN_ERR_MEMORY, "out of memory compiling a loop");
    if (s == KILN_OK) {
        memcpy(outputs, body->outputs, sizeof(int32_t) * (size_t)nloop);
        outputs[nloop] = map[cond->outputs[0]];
        s = kiln_graph_set_outputs(g, nloop + 1, outputs);
    }
    free(map), free(outputs);
    if (s != KILN_OK) {
        kiln_graph_free(g);
        return kiln_error_context(s, "composing a loop's body and condition");
    }
    *out = g;
    return KILN_OK;
}

