/* Float16 storage for deployment (trace.dump's enable_io16xc32 / enable_ioc16): every float32
 * value of a graph (inputs, constants, node outputs, control-flow bodies too) becomes float16, and
 * ops whose attribute i[0] names a float32 output dtype (KILN_OPF_DTYPE_ATTR: cast, creation ops)
 * name float16. kiln's float16 kernels compute in float32 registers or copies (elementwise,
 * reductions, norms, matmul, convolutions: see src/ops) and round each op's result to float16, so
 * what is stored between ops, and the parameters, is halved (enable_ioc16 also keeps the ops
 * unfused, deploy.py). Run on a graph as recorded or after the
 * folding passes, before the fusion passes (fused groups' subgraphs are not converted). */
#include "../ir/symbolic.h"
#include "passes_internal.h"

static kiln_dtype narrowed(kiln_dtype d) { return d == KILN_DTYPE_FLOAT32 ? KILN_DTYPE_FLOAT16 : d; }

static kiln_status convert_capture(kiln_graph *g, const kiln_value *v, int32_t *id) {
    kiln_tensor *t = v->bound;
    bool narrow = t->meta.dtype == KILN_DTYPE_FLOAT32;
    if (narrow) KILN_TRY(kiln_to_contiguous(v->bound, KILN_DTYPE_FLOAT16, &t));
    kiln_status s = kiln_graph_add_capture(g, t, false, id);
    if (s == KILN_OK) g->values[*id].constant = v->constant;
    if (narrow) kiln_tensor_release(t);
    return s;
}

static kiln_status convert(const kiln_graph *in, kiln_graph *g, int32_t *map) {
    for (int32_t k = 0; k < in->nsubgraphs; k++) {
        kiln_graph *sub = NULL;
        int32_t idx;
        kiln_status s = kiln_graph_to_float16(in->subgraphs[k], &sub);
        if (s == KILN_OK) s = kiln_graph_add_subgraph(g, sub, &idx);
        if (s != KILN_OK) {
            kiln_graph_free(sub);
            return s;
        }
    }
    for (int32_t k = 0; k < in->nlocs; k++) {
        int32_t id;
        KILN_TRY(kiln_graph_add_loc(g, in->locs[k], &id));
    }
    for (int32_t k = 0; k < in->ninputs; k++) {
        kiln_meta m = in->values[in->inputs[k]].meta;
        m.dtype = narrowed(m.dtype);
        KILN_TRY(kiln_graph_add_input(g, &m, &map[in->inputs[k]]));
    }
    for (int32_t k = 0; k < in->ncaptures; k++)
        KILN_TRY(convert_capture(g, &in->values[in->captures[k]], &map[in->captures[k]]));
    int32_t small[16];
    for (int32_t i = 0; i < in->nnodes; i++) {
        const kiln_node *n = &in->nodes[i];
        int32_t *ins = n->nin <= 16 ? small : kiln_malloc(sizeof(int32_t) * (size_t)n->nin);
        if (!ins) return kiln_error(KILN_ERR_MEMORY, "out of memory converting a graph to float16");
        for (int k = 0; k < n->nin; k++) ins[k] = map[n->in[k]];
        kiln_attrs a = n->attrs;
        if ((kiln_op_table[n->op].flags & KILN_OPF_DTYPE_ATTR) &&
            kiln_attr_int(&a, KILN_A_OUTPUT_DTYPE, -1) == KILN_DTYPE_FLOAT32)
            a.i[KILN_A_OUTPUT_DTYPE] = KILN_DTYPE_FLOAT16;
        int32_t outs[KILN_MAX_OUTPUTS];
        kiln_status s = kiln_graph_add_node(g, n->op, n->nin, ins, &a, n->loc, outs);
        if (ins != small) free(ins);
        if (s != KILN_OK) return kiln_error_context(s, "float16: %s", kiln_op_table[n->op].name);
        for (int k = 0; k < n->nout; k++) map[n->out[k]] = outs[k];
    }
    int32_t *outs = kiln_malloc(sizeof(int32_t) * (size_t)(in->noutputs ? in->noutputs : 1));
    if (!outs) return kiln_error(KILN_ERR_MEMORY, "out of memory converting a graph to float16");
    for (int32_t k = 0; k < in->noutputs; k++) outs[k] = map[in->outputs[k]];
    kiln_status s = kiln_graph_set_outputs(g, in->noutputs, outs);
    free(outs);
    return s == KILN_OK ? kiln_graph_carry_names(in, g, map, NULL, 0) : s;
}

kiln_status kiln_graph_to_float16(const kiln_graph *in, kiln_graph **out) {
    *out = NULL;
    KILN_TRY(kiln_graph_require_concrete(in, "to_float16"));
    kiln_graph *g;
    KILN_TRY(kiln_graph_new(&g));
    int32_t *map = kiln_malloc(sizeof(int32_t) * (size_t)(in->nvalues ? in->nvalues : 1));
    kiln_status s = map ? convert(in, g, map) : KILN_ERR_MEMORY;
    free(map);
    if (s == KILN_OK) s = kiln_graph_verify(g);
    if (s != KILN_OK) {
        kiln_graph_free(g);
        return s;
    }
    *out = g;
    return KILN_OK;
}
