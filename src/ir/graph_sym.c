/* Symbolic sizes in a graph (see symbolic.h): symbols, symbolic inputs, the symbolic inference of
 * a node's outputs through the op table's KILN_SYM rules, the verifier's checks and evaluation at
 * a binding. */
#include "../ops/infer_sym.h"
#include "control.h"
#include "follow.h"
#include "symbolic.h"

kiln_status kiln_graph_add_symbol(kiln_graph *g, int64_t lower, int64_t hint, kiln_sdim *out) {
    if (!g->syms) KILN_TRY(kiln_symtab_new(&g->syms));
    return kiln_sym_new(g->syms, lower, hint, out);
}

/* Whether a is a valid size of g: a constant >= 0, or an entry of g's table. */
static bool valid_dim(const kiln_graph *g, kiln_sdim a) {
    return a.e == 0 ? a.v >= 0 : (g->syms && a.e > 0 && a.e < kiln_symtab_entries(g->syms));
}

kiln_status kiln_graph_add_input_sym(kiln_graph *g, kiln_dtype dtype, const kiln_sshape *shape, int32_t *value) {
    if (shape->ndim < 0 || shape->ndim > KILN_MAX_DIMS)
        return kiln_error(KILN_ERR_VALUE, "graph: an input of %d dimensions (at most %d)", shape->ndim, KILN_MAX_DIMS);
    kiln_meta m = {.dtype = dtype, .ndim = shape->ndim};
    for (int d = 0; d < shape->ndim; d++) {
        if (!valid_dim(g, shape->d[d]))
            return kiln_error(KILN_ERR_VALUE, "graph: input size %d names no size of this graph", d);
        KILN_TRY(kiln_sym_eval(g->syms, shape->d[d], NULL, &m.shape[d]));
    }
    KILN_TRY(kiln_graph_add_input(g, &m, value));
    for (int d = 0; d < shape->ndim; d++) g->values[*value].sym[d] = shape->d[d].e;
    return KILN_OK;
}

void kiln_graph_value_sshape(const kiln_graph *g, int32_t v, kiln_sshape *out) {
    const kiln_value *x = &g->values[v];
    out->ndim = x->meta.ndim;
    for (int d = 0; d < x->meta.ndim; d++) out->d[d] = (kiln_sdim){x->sym[d], x->meta.shape[d]};
}

bool kiln_graph_node_symbolic(const kiln_graph *g, int nin, const int32_t *in, int ni, const int32_t *attr_sym) {
    if (!g->syms) return false;
    for (int k = 0; attr_sym && k < ni; k++)
        if (attr_sym[k]) return true;
    for (int k = 0; k < nin; k++)
        for (int d = 0; d < g->values[in[k]].meta.ndim; d++)
            if (g->values[in[k]].sym[d]) return true;
    return false;
}

static bool same_sshape(const kiln_sshape *x, const kiln_sshape *y) {
    if (x->ndim != y->ndim) return false;
    for (int d = 0; d < x->ndim; d++)
        if (!kiln_sdim_same(x->d[d], y->d[d])) return false;
    return true;
}

/* An if, while or while_grad node's output sizes from its bodies (symbolic copies sharing g's
 * symbols, made by kiln_graph_symbolize): each body takes the node's inputs' expressions; if's
 * branches return the same expressions; a loop body returns its loop values' (sizes invariant
 * over iterations), while_grad's backward body its inputs', and each gradient of a loop value has
 * the value's. */
static kiln_status infer_control_sym(const kiln_graph *g, kiln_op op, int nin, const int32_t *in, const kiln_attrs *a,
                                     int nout, kiln_sshape *out) {
    const char *name = kiln_op_table[op].name;
    int slots[4], ns = kiln_control_slots(op, slots), first = op == KILN_OP_IF ? 1 : 0;
    int nstate = op == KILN_OP_WHILE ? nin : op == KILN_OP_WHILE_GRAD ? nout : nin - 1;
    const kiln_graph *sub[3];
    kiln_sshape x, y;
    if (kiln_loop_nres(op, a) > 0) /* (symbolize refuses them first) */
        return kiln_error(KILN_ERR_NOT_IMPLEMENTED, "%s: stored residuals with symbolic sizes", name);
    for (int k = 0; k < ns; k++) {
        int32_t idx;
        KILN_TRY(kiln_graph_body_index(g, op, a, k, &idx));
        sub[k] = g->subgraphs[idx];
        int count = op == KILN_OP_WHILE_GRAD && k == 2 ? nin : nstate;
        int extra = op == KILN_OP_WHILE_GRAD && k == 2 ? (int)kiln_attr_int(a, KILN_A_WHILE_NRES, 0) : 0;
        if (sub[k]->ninputs != count + extra) return kiln_error(KILN_ERR_VALUE, "%s: a body does not fit the node", name);
        for (int j = 0; j < count; j++) {
            kiln_graph_value_sshape(g, in[first + j], &x);
            kiln_graph_value_sshape(sub[k], sub[k]->inputs[j], &y);
            if (!same_sshape(&x, &y))
                return kiln_error(KILN_ERR_VALUE, "%s: body %d's input %d does not have the node's input sizes as "
                                  "expressions", name, k, j);
        }
    }
    for (int j = 0; j < nout; j++) {
        if (op == KILN_OP_IF) {
            kiln_graph_value_sshape(sub[0], sub[0]->outputs[j], &out[j]);
            kiln_graph_value_sshape(sub[1], sub[1]->outputs[j], &y);
            if (!same_sshape(&out[j], &y))
                return kiln_error(KILN_ERR_VALUE, "if: the branches' output %d sizes are not the same expressions", j);
            continue;
        }
        kiln_graph_value_sshape(g, in[j], &out[j]);
        int nloop = op == KILN_OP_WHILE ? nout : nin - nout;
        if (j < nloop) {
            kiln_graph_value_sshape(sub[1], sub[1]->outputs[j], &y);
            if (!same_sshape(&out[j], &y))
                return kiln_error(KILN_ERR_VALUE, "%s: loop value %d's sizes are not the same expressions after an "
                                  "iteration", name, j);
        }
        if (op == KILN_OP_WHILE_GRAD) {
            kiln_graph_value_sshape(sub[2], sub[2]->outputs[j], &y);
            bool ok = same_sshape(&out[j], &y);
            if (ok && j < nloop) {
                kiln_graph_value_sshape(g, in[nout + j], &y);
                ok = same_sshape(&out[j], &y);
            }
            if (!ok)
                return kiln_error(KILN_ERR_VALUE, "while_grad: gradient %d's sizes are not its input's expressions", j);
        }
    }
    return KILN_OK;
}

kiln_status kiln_graph_infer_sym(const kiln_graph *g, kiln_op op, int nin, const int32_t *in, const kiln_attrs *a,
                                 const int32_t *attr_sym, int nout, const kiln_meta *concrete, kiln_sshape *out) {
    if (kiln_op_is_control(op)) return infer_control_sym(g, op, nin, in, a, nout, out);
    kiln_sshape small[8] = {0};
    kiln_sshape *shapes = nin <= 8 ? small : kiln_malloc(sizeof *shapes * (size_t)nin);
    if (!shapes) return kiln_error(KILN_ERR_MEMORY, "out of memory");
    for (int k = 0; k < nin; k++) kiln_graph_value_sshape(g, in[k], &shapes[k]);
    kiln_sdim ai[KILN_MAX_ATTR_INTS] = {0};
    for (int k = 0; k < a->ni; k++) ai[k] = (kiln_sdim){attr_sym ? attr_sym[k] : 0, a->i[k]};
    kiln_status s = kiln_infer_sym(g->syms, op, nin, shapes, a, ai, nout, concrete, out);
    if (shapes != small) free(shapes);
    return s;
}

kiln_status kiln_graph_value_shape_at(const kiln_graph *g, int32_t v, const int64_t *bindings, int64_t *shape) {
    const kiln_value *x = &g->values[v];
    for (int d = 0; d < x->meta.ndim; d++) {
        if (!x->sym[d]) shape[d] = x->meta.shape[d];
        else KILN_TRY(kiln_sym_eval(g->syms, (kiln_sdim){x->sym[d], x->meta.shape[d]}, bindings, &shape[d]));
    }
    return KILN_OK;
}

kiln_status kiln_graph_require_concrete(const kiln_graph *g, const char *what) {
    if (kiln_graph_is_symbolic(g))
        return kiln_error(KILN_ERR_VALUE, "%s: graphs with symbolic sizes are not supported yet", what);
    for (int32_t k = 0; k < g->nsubgraphs; k++) KILN_TRY(kiln_graph_require_concrete(g->subgraphs[k], what));
    return KILN_OK;
}

/* Value v's entries are g's and its hints its meta's. */
static kiln_status check_value(const kiln_graph *g, int32_t v) {
    const kiln_value *x = &g->values[v];
    for (int d = 0; d < x->meta.ndim; d++) {
        if (!x->sym[d]) continue;
        if (x->kind == KILN_VALUE_CAPTURED || !valid_dim(g, (kiln_sdim){x->sym[d], 0}))
            return kiln_error(KILN_ERR_VALUE, "graph: value %%%d size %d names no symbolic size of the graph", v, d);
        int64_t hint;
        KILN_TRY(kiln_sym_eval(g->syms, (kiln_sdim){x->sym[d], 0}, NULL, &hint));
        if (hint != x->meta.shape[d])
            return kiln_error(KILN_ERR_VALUE, "graph: value %%%d size %d is %lld, its expression's hint %lld", v, d,
                              (long long)x->meta.shape[d], (long long)hint);
    }
    return KILN_OK;
}

kiln_status kiln_graph_verify_sym(const kiln_graph *g) {
    for (int32_t v = 0; v < g->nvalues; v++) KILN_TRY(check_value(g, v));
    for (int32_t i = 0; i < g->nnodes; i++) {
        const kiln_node *n = &g->nodes[i];
        for (int k = 0; n->attr_sym && k < n->attrs.ni; k++) {
            int64_t hint = 0;
            if (n->attr_sym[k] && (!valid_dim(g, kiln_graph_attr_dim(n, k)) ||
                                   kiln_sym_eval(g->syms, kiln_graph_attr_dim(n, k), NULL, &hint) != KILN_OK ||
                                   hint != n->attrs.i[k]))
                return kiln_error(KILN_ERR_VALUE, "graph: attribute %d of node %d (%s) is not a symbolic size of the graph",
                                  k, i, kiln_op_table[n->op].name);
        }
        bool symbolic = kiln_graph_node_symbolic(g, n->nin, n->in, n->attrs.ni, n->attr_sym);
        kiln_sshape got[KILN_MAX_OUTPUTS];
        if (symbolic) {
            kiln_meta concrete[KILN_MAX_OUTPUTS];
            for (int k = 0; k < n->nout; k++) concrete[k] = g->values[n->out[k]].meta;
            KILN_TRY(kiln_graph_infer_sym(g, n->op, n->nin, n->in, &n->attrs, n->attr_sym, n->nout, concrete, got));
        }
        for (int k = 0; k < n->nout; k++) {
            const kiln_value *x = &g->values[n->out[k]];
            for (int d = 0; d < x->meta.ndim; d++)
                if (x->sym[d] != (symbolic ? got[k].d[d].e : 0))
                    return kiln_error(KILN_ERR_VALUE, "graph: output %d of node %d (%s) has symbolic size %d wrong", k, i,
                                      kiln_op_table[n->op].name, d);
        }
    }
    return KILN_OK;
}

void kiln_graph_attr_dims(const kiln_node *n, kiln_sdim *ai) {
    for (int k = 0; k < n->attrs.ni; k++) ai[k] = kiln_graph_attr_dim(n, k);
}

bool kiln_value_same_shape(const kiln_value *a, const kiln_value *b) {
    if (a->meta.ndim != b->meta.ndim) return false;
    for (int d = 0; d < a->meta.ndim; d++)
        if (a->sym[d] != b->sym[d] || a->meta.shape[d] != b->meta.shape[d]) return false;
    return true;
}

bool kiln_node_same_attr_sym(const kiln_node *a, const kiln_node *b) {
    if (a->attrs.ni != b->attrs.ni) return false;
    for (int k = 0; k < a->attrs.ni; k++)
        if ((a->attr_sym ? a->attr_sym[k] : 0) != (b->attr_sym ? b->attr_sym[k] : 0)) return false;
    return true;
}

kiln_status kiln_graph_copy_symbols(const kiln_graph *from, kiln_graph *to) {
    if (!from->syms) return KILN_OK;
    if (to->syms) return kiln_error(KILN_ERR_VALUE, "graph: copying symbols into a graph that has some");
    return kiln_symtab_clone(from->syms, &to->syms);
}

/* Evaluates g's sizes in place (g a private copy) and drops its symbols. */
static kiln_status instantiate_in_place(kiln_graph *g, const int64_t *bindings) {
    for (int32_t v = 0; v < g->nvalues; v++) {
        kiln_value *x = &g->values[v];
        int64_t shape[KILN_MAX_DIMS];
        KILN_TRY(kiln_graph_value_shape_at(g, v, bindings, shape));
        for (int d = 0; d < x->meta.ndim; d++) x->meta.shape[d] = shape[d], x->sym[d] = 0;
    }
    for (int32_t i = 0; i < g->nnodes; i++) {
        kiln_node *n = &g->nodes[i];
        for (int k = 0; n->attr_sym && k < n->attrs.ni; k++)
            if (n->attr_sym[k]) KILN_TRY(kiln_sym_eval(g->syms, kiln_graph_attr_dim(n, k), bindings, &n->attrs.i[k]));
        free(n->attr_sym);
        n->attr_sym = NULL;
    }
    for (int32_t k = 0; k < g->nsubgraphs; k++) KILN_TRY(instantiate_in_place(g->subgraphs[k], bindings));
    kiln_symtab_free(g->syms);
    g->syms = NULL;
    return KILN_OK;
}

/* Whether a graph (or a subgraph) uses symbols other than its own first `count`. */
static bool fewer_symbols(const kiln_graph *g, int32_t count) {
    if (g->syms && kiln_sym_count(g->syms) > count) return true;
    for (int32_t k = 0; k < g->nsubgraphs; k++)
        if (fewer_symbols(g->subgraphs[k], count)) return true;
    return false;
}

static kiln_status verify_all(const kiln_graph *g) {
    KILN_TRY(kiln_graph_verify(g));
    for (int32_t k = 0; k < g->nsubgraphs; k++) KILN_TRY(verify_all(g->subgraphs[k]));
    return KILN_OK;
}

kiln_status kiln_graph_instantiate(const kiln_graph *g, const int64_t *bindings, kiln_graph **out) {
    *out = NULL;
    int32_t count = g->syms ? kiln_sym_count(g->syms) : 0;
    for (int32_t k = 0; k < count; k++)
        if (bindings[k] < kiln_sym_lower(g->syms, k))
            return kiln_error(KILN_ERR_VALUE, "instantiate: s%d = %lld is below its lower bound %lld", k,
                              (long long)bindings[k], (long long)kiln_sym_lower(g->syms, k));
    if (fewer_symbols(g, count)) /* subgraphs share their graph's symbols (copies of its table) */
        return kiln_error(KILN_ERR_VALUE, "instantiate: a subgraph has symbols its graph does not");
    kiln_graph *c;
    KILN_TRY(kiln_graph_clone(g, &c));
    kiln_status s = instantiate_in_place(c, bindings);
    if (s == KILN_OK) s = verify_all(c);
    if (s != KILN_OK) {
        kiln_graph_free(c);
        return kiln_error_context(s == KILN_ERR_MEMORY ? s : KILN_ERR_VALUE, "instantiate");
    }
    *out = c;
    return KILN_OK;
}

/* The votes picked at the followed nodes that had several left (kiln_follow_sizes), in the order
 * met: each attempt tries the next vote of the last such node with one left (a depth-first search
 * over every choice, bounded); the recording is made symbolic only when exactly one choice makes
 * the whole graph infer. */
#define MAX_CHOICES 16
#define MAX_ATTEMPTS 32
typedef struct follow_choices {
    int met, fixed;                   /* met this attempt; picks [0, fixed) given by the search */
    int pick[MAX_CHOICES], options[MAX_CHOICES];
} follow_choices;

/* follow.c's check of a vote: node i of c infers symbolically with the sizes at its span. */
typedef struct sym_follow_check {
    kiln_graph *c;
    int32_t i;
    int first, count;
    const kiln_sdim *now; /* the node's other attributes as sizes */
} sym_follow_check;

static bool sym_follow_fits(void *ctx, const kiln_sdim *sizes) {
    sym_follow_check *f = ctx;
    const kiln_node *n = &f->c->nodes[f->i];
    int32_t attr_sym[KILN_MAX_ATTR_INTS] = {0};
    for (int k = 0; k < n->attrs.ni; k++) {
        kiln_sdim d = k >= f->first && k < f->first + f->count ? sizes[k - f->first] : f->now[k];
        attr_sym[k] = d.e;
    }
    kiln_meta concrete[KILN_MAX_OUTPUTS];
    kiln_sshape shapes[KILN_MAX_OUTPUTS];
    for (int k = 0; k < n->nout; k++) concrete[k] = f->c->values[n->out[k]].meta;
    return kiln_graph_infer_sym(f->c, n->op, n->nin, n->in, &n->attrs, attr_sym, n->nout, concrete, shapes) == KILN_OK;
}

/* A KILN_ATTR_SET_FOLLOW set (a backward pass's node) on node i of c: a reshape, expand, full or a
 * convolution's or pooling's backward gets the expressions of the values its sizes were taken from
 * (kiln_follow_sizes; c still has the recorded sizes as hints), a slice or slice_assign those of
 * the earlier slices recorded with the same attributes (all agreeing); other ops get nothing. */
static kiln_status follow_attrs(kiln_graph *c, int32_t i, kiln_sdim *now, bool *given, follow_choices *ch) {
    kiln_node *n = &c->nodes[i];
    int first, count;
    if (n->op == KILN_OP_SLICE || n->op == KILN_OP_SLICE_ASSIGN) {
        bool found = false;
        for (int32_t j = 0; j < i; j++) {
            const kiln_node *o = &c->nodes[j];
            if ((o->op != KILN_OP_SLICE && o->op != KILN_OP_SLICE_ASSIGN) || o->attrs.ni != n->attrs.ni ||
                memcmp(o->attrs.i, n->attrs.i, sizeof(int64_t) * (size_t)n->attrs.ni) != 0)
                continue;
            for (int k = 0; k < n->attrs.ni; k++)
                if (found && !kiln_sdim_same(now[k], kiln_graph_attr_dim(o, k)))
                    return kiln_error(KILN_ERR_VALUE, "symbolize: node %d (%s) follows slices that differ", i,
                                      kiln_op_table[n->op].name);
            kiln_graph_attr_dims(o, now);
            found = true;
        }
        if (!found)
            return kiln_error(KILN_ERR_VALUE, "symbolize: node %d (%s) has no slice to follow", i,
                              kiln_op_table[n->op].name);
        for (int k = 0; k < n->attrs.ni; k++) given[k] = true;
        return KILN_OK;
    }
    if (!kiln_follow_span(n, &first, &count)) return KILN_OK;
    sym_follow_check f = {c, i, first, count, now};
    kiln_sdim got[KILN_MAX_DIMS];
    int at = ch->met, options;
    if (at == MAX_CHOICES)
        return kiln_error(KILN_ERR_VALUE, "symbolize: node %d (%s): too many followed sizes with several votes", i,
                          kiln_op_table[n->op].name);
    KILN_TRY(kiln_follow_sizes(c, c, i, sym_follow_fits, &f, "symbolize", at < ch->fixed ? ch->pick[at] : 0, &options,
                               got));
    if (options > 1) {
        if (at >= ch->fixed) ch->pick[at] = 0;
        ch->options[at] = options;
        ch->met++;
    }
    for (int k = 0; k < count; k++) now[first + k] = got[k], given[first + k] = true;
    return KILN_OK;
}

/* The attributes of node i of c given by sets as sizes (attr_sym set, hints checked): in order,
 * the last set of an attribute winning, REST sets last (as kiln_graph_rebind applies them). */
static kiln_status symbolize_attrs(kiln_graph *c, int32_t i, int nset, const kiln_attr_sym_set *sets,
                                   follow_choices *ch) {
    kiln_node *n = &c->nodes[i];
    const char *name = kiln_op_table[n->op].name;
    kiln_sdim now[KILN_MAX_ATTR_INTS];
    bool given[KILN_MAX_ATTR_INTS] = {false};
    for (int k = 0; k < n->attrs.ni; k++) now[k] = kiln_sdim_const(n->attrs.i[k]);
    for (int k = 0; k < 2 * nset; k++) {
        const kiln_attr_sym_set *st = &sets[k % nset];
        if (st->node != i || (st->kind == KILN_ATTR_SET_REST) != (k >= nset)) continue;
        if (st->kind == KILN_ATTR_SET_FOLLOW) {
            KILN_TRY(follow_attrs(c, i, now, given, ch));
            continue;
        }
        if (st->index < 0 || st->index >= n->attrs.ni)
            return kiln_error(KILN_ERR_VALUE, "symbolize: node %d (%s) has no attribute %d", i, name, st->index);
        kiln_sdim d = st->value;
        if (st->kind == KILN_ATTR_SET_DIM || st->kind == KILN_ATTR_SET_REST) {
            if (n->nin < 1) return kiln_error(KILN_ERR_VALUE, "symbolize: node %d (%s) has no input", i, name);
            kiln_sshape x;
            kiln_graph_value_sshape(c, n->in[0], &x);
            if (st->kind == KILN_ATTR_SET_DIM) {
                if (d.e || d.v < 0 || d.v >= x.ndim)
                    return kiln_error(KILN_ERR_VALUE, "symbolize: node %d (%s) names a dimension it lacks", i, name);
                d = x.d[d.v];
            } else { /* input 0's element count over the other sizes, exact as expressions */
                kiln_sdim others = kiln_sdim_const(1);
                for (int j = 0; j < n->attrs.ni; j++)
                    if (j != st->index) KILN_TRY(kiln_sym_mul(c->syms, others, now[j], &others));
                d = kiln_sdim_const(1);
                for (int j = 0; j < x.ndim; j++) KILN_TRY(kiln_sym_mul(c->syms, d, x.d[j], &d));
                kiln_status s = kiln_sym_divexact(c->syms, d, others, &d);
                if (s != KILN_OK) return kiln_error_context(s, "symbolize: node %d (%s)", i, name);
            }
        } else if (st->kind != KILN_ATTR_SET_VALUE) {
            return kiln_error(KILN_ERR_VALUE, "symbolize: node %d (%s): sizes that follow other values are not symbolic", i,
                              name);
        } else if (d.e && !valid_dim(c, d)) {
            return kiln_error(KILN_ERR_VALUE, "symbolize: node %d (%s) attribute %d names no size", i, name, st->index);
        }
        now[st->index] = d;
        given[st->index] = true;
    }
    for (int k = 0; k < n->attrs.ni; k++) {
        if (!given[k]) continue;
        if (now[k].v != n->attrs.i[k])
            return kiln_error(KILN_ERR_VALUE, "symbolize: node %d (%s) attribute %d is %lld, its size %lld", i, name, k,
                              (long long)n->attrs.i[k], (long long)now[k].v);
        if (!now[k].e) continue;
        if (!n->attr_sym) {
            n->attr_sym = kiln_calloc((size_t)n->attrs.ni, sizeof *n->attr_sym);
            if (!n->attr_sym) return kiln_error(KILN_ERR_MEMORY, "out of memory");
        }
        n->attr_sym[k] = now[k].e;
    }
    return KILN_OK;
}

static kiln_status symbolize_into(kiln_graph *c, const kiln_sshape *inputs, int nset, const kiln_attr_sym_set *sets,
                                  follow_choices *ch);

/* Control node n of c: each body replaced by a symbolic copy taking the node's inputs' sizes and
 * sharing c's table while it is made (then given a copy of it); a while_grad's backward body,
 * made of gradient rules, follows the sizes its nodes were recorded from. A body an earlier node
 * shares is made already (kiln_graph_infer_sym then checks it takes this node's sizes). */
static kiln_status symbolize_bodies(kiln_graph *c, const kiln_node *n, follow_choices *ch) {
    int slots[4], ns = kiln_control_slots(n->op, slots), first = n->op == KILN_OP_IF ? 1 : 0;
    for (int k = 0; k < ns; k++) {
        int32_t idx;
        KILN_TRY(kiln_graph_body_index(c, n->op, &n->attrs, k, &idx));
        if (kiln_loop_nres(n->op, &n->attrs) > 0)
            return kiln_error(KILN_ERR_NOT_IMPLEMENTED, "symbolize: a loop gradient storing residuals (sizes fixed "
                              "per step); set kiln.set_context(loop_residual_budget=0) to recompute them");
        if (c->subgraphs[idx]->ninputs > n->nin - first)
            return kiln_error(KILN_ERR_VALUE, "symbolize: %s names a subgraph it cannot make symbolic",
                              kiln_op_table[n->op].name);
        if (c->subgraphs[idx]->syms) continue; /* shared with an earlier node (a while and its while_grad): made */
        kiln_graph *b = NULL;
        const kiln_graph *sub = c->subgraphs[idx];
        int nset = n->op == KILN_OP_WHILE_GRAD && k == 2 ? sub->nnodes : 0;
        kiln_sshape *in = kiln_calloc((size_t)(sub->ninputs ? sub->ninputs : 1), sizeof *in);
        kiln_attr_sym_set *sets = kiln_calloc((size_t)(nset ? nset : 1), sizeof *sets);
        kiln_status s = in && sets ? kiln_graph_clone(sub, &b) : kiln_error(KILN_ERR_MEMORY, "out of memory");
        for (int j = 0; s == KILN_OK && j < sub->ninputs; j++) kiln_graph_value_sshape(c, n->in[first + j], &in[j]);
        for (int j = 0; j < nset; j++) sets[j] = (kiln_attr_sym_set){j, 0, KILN_ATTR_SET_FOLLOW, kiln_sdim_const(0)};
        if (s == KILN_OK) {
            b->syms = c->syms; /* borrowed while it is made */
            s = symbolize_into(b, in, nset, sets, ch);
            b->syms = NULL;
        }
        if (s == KILN_OK) s = kiln_symtab_clone(c->syms, &b->syms);
        free(in), free(sets);
        if (s != KILN_OK) {
            kiln_graph_free(b);
            return kiln_error_context(s, "symbolize: a body of %s", kiln_op_table[n->op].name);
        }
        kiln_graph_free(c->subgraphs[idx]);
        c->subgraphs[idx] = b;
    }
    return KILN_OK;
}

/* c (a clone of the recording, its table set) made symbolic in place. */
static kiln_status symbolize_into(kiln_graph *c, const kiln_sshape *inputs, int nset, const kiln_attr_sym_set *sets,
                                  follow_choices *ch) {
    kiln_status s = KILN_OK;
    for (int32_t k = 0; k < c->ninputs && s == KILN_OK; k++) {
        kiln_value *x = &c->values[c->inputs[k]];
        if (inputs[k].ndim != x->meta.ndim) s = kiln_error(KILN_ERR_VALUE, "symbolize: input %d has %d sizes", k, x->meta.ndim);
        for (int d = 0; d < x->meta.ndim && s == KILN_OK; d++) {
            kiln_sdim e = inputs[k].d[d];
            if (e.e == 0 ? e.v != x->meta.shape[d] : !valid_dim(c, e) || e.v != x->meta.shape[d])
                s = kiln_error(KILN_ERR_VALUE, "symbolize: input %d size %d is %lld, not its expression's hint", k, d,
                               (long long)x->meta.shape[d]);
            else
                x->sym[d] = e.e;
        }
    }
    for (int32_t i = 0; i < c->nnodes && s == KILN_OK; i++) {
        kiln_node *n = &c->nodes[i];
        s = symbolize_attrs(c, i, nset, sets, ch);
        if (s != KILN_OK || !kiln_graph_node_symbolic(c, n->nin, n->in, n->attrs.ni, n->attr_sym)) continue;
        bool named = kiln_op_is_control(n->op); /* its bodies are made symbolic */
        for (int k = 0; k < nset && !named; k++) named = sets[k].node == i;
        if (!named && (kiln_op_table[n->op].flags & KILN_OPF_SIZED)) { /* as kiln_graph_rebind refuses it */
            s = kiln_error(KILN_ERR_VALUE, "symbolize: node %d (%s) keeps sizes taken from shapes that no set gives", i,
                           kiln_op_table[n->op].name);
            continue;
        }
        if (kiln_op_is_control(n->op) && (s = symbolize_bodies(c, n, ch)) != KILN_OK) continue;
        kiln_meta concrete[KILN_MAX_OUTPUTS];
        kiln_sshape shapes[KILN_MAX_OUTPUTS];
        for (int k = 0; k < n->nout; k++) concrete[k] = c->values[n->out[k]].meta;
        s = kiln_graph_infer_sym(c, n->op, n->nin, n->in, &n->attrs, n->attr_sym, n->nout, concrete, shapes);
        for (int k = 0; k < n->nout && s == KILN_OK; k++)
            for (int d = 0; d < shapes[k].ndim; d++) c->values[n->out[k]].sym[d] = shapes[k].d[d].e;
        if (s != KILN_OK) s = kiln_error_context(s, "symbolize: node %d", i);
    }
    return s;
}

/* One attempt of kiln_graph_symbolize with the choices ch (syms: taken). */
static kiln_status symbolize_once(const kiln_graph *g, kiln_symtab *syms, const kiln_sshape *inputs, int nset,
                                  const kiln_attr_sym_set *sets, follow_choices *ch, kiln_graph **out) {
    *out = NULL;
    kiln_graph *c = NULL;
    kiln_status s = kiln_graph_clone(g, &c);
    if (s != KILN_OK) {
        kiln_symtab_free(syms);
        return s;
    }
    c->syms = syms;
    s = symbolize_into(c, inputs, nset, sets, ch);
    if (s == KILN_OK) s = kiln_graph_verify(c);
    if (s != KILN_OK) {
        kiln_graph_free(c);
        return s;
    }
    *out = c;
    return KILN_OK;
}

kiln_status kiln_graph_symbolize(const kiln_graph *g, kiln_symtab *syms, const kiln_sshape *inputs, int nset,
                                 const kiln_attr_sym_set *sets, kiln_graph **out) {
    *out = NULL;
    kiln_status s = kiln_graph_require_concrete(g, "symbolize");
    follow_choices ch = {0};
    kiln_graph *found = NULL; /* the choices that made it: taken only when no other choices do too */
    bool complete = false;
    for (int attempt = 0; s == KILN_OK || s == KILN_ERR_VALUE || s == KILN_ERR_LIMIT; attempt++) {
        kiln_symtab *t;
        kiln_graph *c = NULL;
        ch.met = 0;
        if ((s = kiln_symtab_clone(syms, &t)) != KILN_OK) break;
        s = symbolize_once(g, t, inputs, nset, sets, &ch, &c);
        if (s == KILN_OK && found) { /* two readings of the recording hold: it cannot tell which it is */
            kiln_graph_free(c);
            s = kiln_error(KILN_ERR_VALUE, "symbolize: followed sizes that two values held at the capture fit "
                                           "either way");
            break;
        }
        if (s == KILN_OK) found = c;
        int j = ch.met - 1; /* the last choice with a vote left to try */
        while (j >= 0 && ch.pick[j] + 1 >= ch.options[j]) j--;
        if (j < 0) {
            complete = true;
            break;
        }
        if (attempt + 1 == MAX_ATTEMPTS) {
            s = kiln_error(KILN_ERR_VALUE, "symbolize: too many choices of followed sizes to try");
            break;
        }
        ch.pick[j]++;
        ch.fixed = j + 1;
    }
    kiln_symtab_free(syms);
    if (found && complete) {
        *out = found;
        return KILN_OK;
    }
    kiln_graph_free(found);
    return s == KILN_OK ? kiln_error(KILN_ERR_VALUE, "symbolize: internal: no result") : s;
}
