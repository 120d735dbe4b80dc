/* Float16 storage for deployment (trace.dump's enable_io16xc32 / enable_ioc16): every float32
 * value of a graph (inputs, constants, node outputs, control-flow bodies too) becomes float16, and
 * ops whose attribute i[0] names a float32 output dtype (KILN_OPF_DTYPE_ATTR: cast, creation ops)
 * name float16. kiln's float16 kernels compute in float32 registers or copies (elementwise,
 * reductions, norms, matmul, convolutions: see src/ops) and round each op's result to float16, so
 * what is stored between ops, and the parameters, is halved (enable_ioc16 also keeps the ops
 * unfused, deploy.py). Run on a graph as recorded or after the
 * folding passes, before the fusion passes (fused groups' subgraphs are not converted).
 *
 * A graph that computes in 16-bit floats already (amp: bfloat16 or float16 products, its float32
 * values the accumulations, norms and positions amp keeps float32 on purpose) keeps its dtypes:
 * kiln_graph_io_to_float16 makes only its float32 inputs and outputs float16 (an input is widened
 * by a cast where the graph starts, an output rounded by a cast where it ends), so the file
 * computes what the recording computes on the inputs rounded to float16, its outputs rounded. */
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

/* g's subgraphs (each made from in's by `make`: converted, or cloned as it is) and in's source
 * locations, in in's order, so node attributes and locations index the same ones. */
static kiln_status copy_subgraphs_and_locs(const kiln_graph *in, kiln_graph *g,
                                           kiln_status (*make)(const kiln_graph *, kiln_graph **)) {
    for (int32_t k = 0; k < in->nsubgraphs; k++) {
        kiln_graph *sub = NULL;
        int32_t idx;
        kiln_status s = make(in->subgraphs[k], &sub);
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
    return KILN_OK;
}

static kiln_status convert(const kiln_graph *in, kiln_graph *g, int32_t *map) {
    KILN_TRY(copy_subgraphs_and_locs(in, g, kiln_graph_to_float16));
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

static bool has_16bit(const kiln_graph *g) {
    for (int32_t i = 0; i < g->nvalues; i++) {
        kiln_dtype d = g->values[i].meta.dtype;
        if (g->values[i].kind == KILN_VALUE_NODE && (d == KILN_DTYPE_FLOAT16 || d == KILN_DTYPE_BFLOAT16)) return true;
    }
    for (int32_t k = 0; k < g->nsubgraphs; k++)
        if (has_16bit(g->subgraphs[k])) return true;
    return false;
}

bool kiln_graph_computes_16bit(const kiln_graph *g) { return has_16bit(g); }

static kiln_status add_cast(kiln_graph *g, int32_t v, kiln_dtype d, int32_t loc, int32_t *out) {
    kiln_attrs a = {0};
    kiln_attrs_push_int(&a, d);
    return kiln_graph_add_node(g, KILN_OP_CAST, 1, &v, &a, loc, out);
}

/* map: value -> the value that carries its name (inputs: the new float16 input; outputs: their
 * rounding cast); use: value -> what the graph's nodes read (inputs: the widening cast). */
static kiln_status convert_io(const kiln_graph *in, kiln_graph *g, int32_t *map, int32_t *use) {
    KILN_TRY(copy_subgraphs_and_locs(in, g, kiln_graph_clone));
    for (int32_t k = 0; k < in->ninputs; k++) {
        int32_t v = in->inputs[k];
        kiln_meta m = in->values[v].meta;
        m.dtype = narrowed(m.dtype);
        KILN_TRY(kiln_graph_add_input(g, &m, &map[v]));
        use[v] = map[v];
    }
    for (int32_t k = 0; k < in->ncaptures; k++) {
        const kiln_value *c = &in->values[in->captures[k]];
        KILN_TRY(kiln_graph_add_capture(g, c->bound, c->constant, &map[in->captures[k]]));
        use[in->captures[k]] = map[in->captures[k]];
    }
    for (int32_t k = 0; k < in->ninputs; k++) { /* widened where the graph starts */
        int32_t v = in->inputs[k];
        if (in->values[v].meta.dtype == KILN_DTYPE_FLOAT32) KILN_TRY(add_cast(g, map[v], KILN_DTYPE_FLOAT32, -1, &use[v]));
    }
    int32_t small[16];
    for (int32_t i = 0; i < in->nnodes; i++) {
        const kiln_node *n = &in->nodes[i];
        int32_t *ins = n->nin <= 16 ? small : kiln_malloc(sizeof(int32_t) * (size_t)n->nin);
        if (!ins) return kiln_error(KILN_ERR_MEMORY, "out of memory converting a graph's inputs and outputs to float16");
        for (int k = 0; k < n->nin; k++) ins[k] = use[n->in[k]];
        int32_t outs[KILN_MAX_OUTPUTS];
        kiln_status s = kiln_graph_add_node(g, n->op, n->nin, ins, &n->attrs, n->loc, outs);
        if (ins != small) free(ins);
        if (s != KILN_OK) return kiln_error_context(s, "float16 inputs and outputs: %s", kiln_op_table[n->op].name);
        for (int k = 0; k < n->nout; k++) map[n->out[k]] = use[n->out[k]] = outs[k];
    }
    int32_t *outs = kiln_malloc(sizeof(int32_t) * (size_t)(in->noutputs ? in->noutputs : 1));
    if (!outs) return kiln_error(KILN_ERR_MEMORY, "out of memory converting a graph's inputs and outputs to float16");
    kiln_status s = KILN_OK;
    for (int32_t k = 0; k < in->noutputs && s == KILN_OK; k++) {
        int32_t v = in->outputs[k];
        outs[k] = use[v];
        if (in->values[v].meta.dtype != KILN_DTYPE_FLOAT32) continue;
        for (int32_t j = 0; j < k; j++) /* an output returned twice: one cast */
            if (in->outputs[j] == v) outs[k] = outs[j];
        if (outs[k] == use[v]) {
            int32_t loc = in->values[v].kind == KILN_VALUE_NODE ? in->nodes[in->values[v].node].loc : -1;
            s = add_cast(g, use[v], KILN_DTYPE_FLOAT16, loc, &outs[k]);
            if (s == KILN_OK && in->values[v].kind == KILN_VALUE_NODE) map[v] = outs[k];
        }
    }
    if (s == KILN_OK) s = kiln_graph_set_outputs(g, in->noutputs, outs);
    free(outs);
    return s == KILN_OK ? kiln_graph_carry_names(in, g, map, NULL, 0) : s;
}

kiln_status kiln_graph_io_to_float16(const kiln_graph *in, kiln_graph **out) {
    *out = NULL;
    KILN_TRY(kiln_graph_require_concrete(in, "io_to_float16"));
    kiln_graph *g;
    KILN_TRY(kiln_graph_new(&g));
    size_t n = (size_t)(in->nvalues ? in->nvalues : 1);
    int32_t *map = kiln_malloc(sizeof(int32_t) * n), *use = kiln_malloc(sizeof(int32_t) * n);
    kiln_status s = map && use ? convert_io(in, g, map, use) : KILN_ERR_MEMORY;
    free(map), free(use);
    if (s == KILN_OK) s = kiln_graph_verify(g);
    if (s != KILN_OK) {
        kiln_graph_free(g);
        return s;
    }
    *out = g;
    return KILN_OK;
}
