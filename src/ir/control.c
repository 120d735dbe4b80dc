/* Control flow in the IR: which attrs name subgraphs, shape inference, the body registry,
 * capture lifting and the eager interpreter (see control.h). */
#include <pthread.h>

#include "control.h"

#include "../core/hooks.h"
#include "trace_internal.h"

int kiln_control_slots(kiln_op op, int *slots) {
    if (!kiln_op_is_control(op)) return 0;
    int n = kiln_op_nbodies(op);
    for (int k = 0; k < n; k++) slots[k] = kiln_op_body_attr(op, k);
    return n;
}

static const char *meta_text(const kiln_meta *m, char *buf, size_t size) {
    char shape[160];
    snprintf(buf, size, "%s %s", kiln_dtype_name(m->dtype), kiln_shape_str(m, shape, sizeof shape));
    return buf;
}

/* Checks that sub takes exactly the metas in[0..nin), then `extra` more (stored residuals). */
static kiln_status check_inputs_then(const char *op, const char *what, const kiln_graph *sub, int nin,
                                     const kiln_meta *in, int extra) {
    if (sub->ninputs != nin + extra)
        return kiln_error(KILN_ERR_VALUE, "%s: the %s subgraph takes %d inputs, the node gives it %d", op, what,
                          sub->ninputs, nin + extra);
    for (int k = 0; k < nin; k++) {
        const kiln_meta *want = &sub->values[sub->inputs[k]].meta;
        if (!kiln_meta_equal(want, &in[k])) {
            char a[200], b[200];
            return kiln_error(KILN_ERR_VALUE, "%s: input %d of the %s subgraph is %s, the node gives it %s", op, k,
                              what, meta_text(want, a, sizeof a), meta_text(&in[k], b, sizeof b));
        }
    }
    return KILN_OK;
}

static kiln_status check_inputs(const char *op, const char *what, const kiln_graph *sub, int nin, const kiln_meta *in) {
    return check_inputs_then(op, what, sub, nin, in, 0);
}

/* Checks that sub returns the metas want[0..n), then `extra` more values. */
static kiln_status check_outputs_then(const char *op, const char *what, const kiln_graph *sub, int n,
                                      const kiln_meta *want, const char *want_what, int extra) {
    if (sub->noutputs != n + extra)
        return kiln_error(KILN_ERR_VALUE, "%s: the %s subgraph returns %d values, expected %d", op, what,
                          sub->noutputs, n + extra);
    for (int k = 0; k < n; k++) {
        const kiln_meta *got = &sub->values[sub->outputs[k]].meta;
        if (!kiln_meta_equal(got, &want[k])) {
            char a[200], b[200];
            return kiln_error(KILN_ERR_VALUE, "%s: output %d of the %s subgraph is %s but %s is %s", op, k, what,
                              meta_text(got, a, sizeof a), want_what, meta_text(&want[k], b, sizeof b));
        }
    }
    return KILN_OK;
}

static kiln_status check_outputs(const char *op, const char *what, const kiln_graph *sub, int n, const kiln_meta *want,
                                 const char *want_what) {
    return check_outputs_then(op, what, sub, n, want, want_what, 0);
}

/* Whether node i of g writes in place only a buffer the body itself just filled: in[0] of a
 * MUTATES op writing no other input, made by a `full` node of g and read by no other node nor
 * returned. A slice's gradient is such a write (zeros, then slice_assign): no value from outside
 * the body is changed, so the body stays pure to the graph around it. */
static bool writes_own_fresh_buffer(const kiln_graph *g, int32_t i) {
    const kiln_node *nd = &g->nodes[i];
    uint64_t f = kiln_op_table[nd->op].flags;
    if (!(f & KILN_OPF_MUTATES) || (f & (KILN_OPF_RANDOM | KILN_OPF_EFFECT)) ||
        (f & KILN_OPF_WRITES_ANY) != KILN_OPF_WRITES_INPUT(0) || nd->nin < 1)
        return false;
    int32_t target = nd->in[0];
    const kiln_value *v = &g->values[target];
    if (v->kind != KILN_VALUE_NODE || g->nodes[v->node].op != KILN_OP_FULL) return false;
    for (int32_t j = 0; j < g->nnodes; j++)
        for (int k = 0; k < g->nodes[j].nin; k++)
            if (g->nodes[j].in[k] == target && (j != i || k != 0)) return false;
    for (int32_t k = 0; k < g->noutputs; k++)
        if (g->outputs[k] == target) return false;
    return true;
}

/* Subgraphs of control flow are pure: passes may drop unused control-flow nodes and merge
 * identical ones like any other pure op (nested control flow was checked when added). */
static kiln_status check_pure(const kiln_graph *g) {
    for (int32_t i = 0; i < g->nnodes; i++) {
        uint64_t f = kiln_op_table[g->nodes[i].op].flags;
        if ((f & (KILN_OPF_MUTATES | KILN_OPF_WRITES_ANY | KILN_OPF_RANDOM)) && !writes_own_fresh_buffer(g, i))
            return kiln_error(KILN_ERR_NOT_IMPLEMENTED,
                              "control flow: a branch or loop body %s (%s); bodies must be free of in-place "
                              "writes and random ops",
                              (f & KILN_OPF_RANDOM) ? "draws random numbers" : "writes a tensor in place",
                              kiln_op_table[g->nodes[i].op].name);
    }
    return KILN_OK;
}

kiln_status kiln_control_infer(kiln_op op, int nin, const kiln_meta *in, const kiln_attrs *a,
                               const kiln_graph *const *subs, kiln_meta *out) {
    const char *name = kiln_op_table[op].name;
    int nout = kiln_op_nout(op, a);
    if (nout < 1 || nout > KILN_MAX_OUTPUTS)
        return kiln_error(KILN_ERR_VALUE, "%s: %d outputs (at most %d are supported)", name, nout, KILN_MAX_OUTPUTS);
    int slots[4], nsubs = kiln_control_slots(op, slots);
    for (int k = 0; k < nsubs; k++) KILN_TRY(check_pure(subs[k]));
    if (op == KILN_OP_IF) {
        if (nin < 1) return kiln_error(KILN_ERR_TYPE, "if: missing the predicate");
        if (kiln_meta_numel(&in[0]) != 1) {
            char b[200];
            return kiln_error(KILN_ERR_VALUE, "if: the predicate must have one element, got %s", meta_text(&in[0], b, sizeof b));
        }
        KILN_TRY(check_inputs(name, "then", subs[0], nin - 1, in + 1));
        KILN_TRY(check_inputs(name, "else", subs[1], nin - 1, in + 1));
        if (subs[0]->noutputs != nout)
            return kiln_error(KILN_ERR_VALUE, "if: the then subgraph returns %d values, the node has %d outputs",
                              subs[0]->noutputs, nout);
        for (int k = 0; k < nout; k++) out[k] = subs[0]->values[subs[0]->outputs[k]].meta;
        return check_outputs(name, "else", subs[1], nout, out, "the then subgraph's");
    }
    /* while and while_grad: (v..., lifted...[, gv...][, R...]) */
    int nres = kiln_loop_nres(op, a);
    bool given = kiln_loop_given(op, a);
    int nloop = kiln_loop_nloop(op, a, nin, nout);
    int nd = kiln_loop_nstacked(op, a);            /* stacked cotangents after while_grad's gradients */
    int nstate = op == KILN_OP_WHILE ? nin : nout - nd; /* loop values and lifted tensors */
    int nbase = nin - (given ? nres : 0);          /* the inputs before stored residuals given */
    int64_t trips = kiln_attr_int(a, KILN_A_WHILE_TRIPS, 0);
    if (nres < 0 || (nres > 0 && op == KILN_OP_WHILE && trips <= 0))
        return kiln_error(KILN_ERR_VALUE, "%s: %d stored residuals over %lld steps", name, nres, (long long)trips);
    if (nloop < 1 || nstate < nloop || nbase < nstate || nd < 0 || (nd > 0 && !given))
        return kiln_error(KILN_ERR_VALUE, "%s: %d inputs do not fit %d outputs", name, nin, nout);
    KILN_TRY(check_inputs(name, "cond", subs[0], nstate, in));
    if (subs[0]->noutputs != 1 || kiln_meta_numel(&subs[0]->values[subs[0]->outputs[0]].meta) != 1)
        return kiln_error(KILN_ERR_VALUE, "%s: the cond subgraph must return one value with one element", name);
    KILN_TRY(check_inputs(name, "body", subs[1], nstate, in));
    /* stored residuals: the body returns them after the loop values, the backward body takes
     * them after the node's inputs (a row of each when its while stored them) */
    KILN_TRY(check_outputs_then(name, "body", subs[1], nloop, in, "the loop value", nres));
    if (op == KILN_OP_WHILE_GRAD) {
        KILN_TRY(check_inputs_then(name, "backward", subs[2], nbase, in, nres));
        KILN_TRY(check_outputs_then(name, "backward", subs[2], nstate, in, "the input", nd));
        for (int k = 0; k < nres; k++) {
            const kiln_meta *r = &subs[1]->values[subs[1]->outputs[nloop + k]].meta;
            const kiln_meta *want = &subs[2]->values[subs[2]->inputs[nbase + k]].meta;
            kiln_meta stacked;
            if (!kiln_meta_equal(r, want))
                return kiln_error(KILN_ERR_VALUE, "while_grad: stored residual %d does not match the backward body's "
                                  "input", k);
            if (given && (kiln_loop_stacked_meta(r, trips, &stacked) != KILN_OK ||
                          !kiln_meta_equal(&stacked, &in[nbase + k])))
                return kiln_error(KILN_ERR_VALUE, "while_grad: the stored residual buffer %d does not hold %lld steps "
                                  "of the residual", k, (long long)trips);
        }
        for (int k = 0; k < nloop; k++)
            if (!kiln_meta_equal(&in[nstate + k], &in[k]))
                return kiln_error(KILN_ERR_VALUE, "while_grad: the gradient of loop value %d does not match it", k);
    }
    for (int k = 0; k < (op == KILN_OP_WHILE ? nloop : nstate); k++) out[k] = in[k];
    for (int k = 0; k < nd; k++)
        KILN_TRY(kiln_loop_stacked_meta(&subs[2]->values[subs[2]->outputs[nstate + k]].meta, trips, &out[nstate + k]));
    for (int k = 0; op == KILN_OP_WHILE && k < nres; k++)
        KILN_TRY(kiln_loop_stacked_meta(&subs[1]->values[subs[1]->outputs[nloop + k]].meta, trips, &out[nloop + k]));
    return KILN_OK;
}

kiln_status kiln_loop_stacked_meta(const kiln_meta *m, int64_t trips, kiln_meta *out) {
    if (m->ndim + 1 > KILN_MAX_DIMS)
        return kiln_error(KILN_ERR_NOT_IMPLEMENTED, "a loop's stored residual of %d dimensions (at most %d)", m->ndim,
                          KILN_MAX_DIMS - 1);
    *out = *m;
    out->ndim = m->ndim + 1;
    out->shape[0] = trips;
    memcpy(out->shape + 1, m->shape, sizeof *m->shape * (size_t)m->ndim);
    return KILN_OK;
}

/* ---- the registry ------------------------------------------------------------------------------ */

/* A registered body: its graph, the ids of its subgraphs' bodies (references it holds) and the
 * references held on it. A body whose last reference goes is freed; its id is never reused. */
typedef struct {
    kiln_graph *g;
    int64_t *sub_ids;
    int64_t held; /* a body this one holds (kiln_body_hold), or -1 */
    int64_t refs;
} body;

static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static body **bodies; /* by id: the body, or NULL once released */
static int64_t nbodies, cap_bodies, nlive;

static void body_free(body *b);
kiln_status kiln_body_register(kiln_graph *g, int64_t *id) {
    kiln_status s = kiln_graph_verify(g);
    if (s == KILN_OK) s = check_pure(g);
    body *b = s == KILN_OK ? kiln_calloc(1, sizeof *b) : NULL;
    if (s == KILN_OK && !b) s = kiln_error(KILN_ERR_MEMORY, "out of memory registering a body");
    if (s == KILN_OK) {
        b->g = g;
        b->held = -1;
        b->refs = 1;
        b->sub_ids = kiln_malloc(sizeof(int64_t) * (size_t)(g->nsubgraphs ? g->nsubgraphs : 1));
        if (!b->sub_ids) s = kiln_error(KILN_ERR_MEMORY, "out of memory registering a body");
        for (int32_t k = 0; b->sub_ids && k < g->nsubgraphs; k++) b->sub_ids[k] = -1;
    }
    for (int32_t k = 0; k < g->nsubgraphs && s == KILN_OK; k++) {
        kiln_graph *sub;
        s = kiln_graph_clone(g->subgraphs[k], &sub);
        if (s == KILN_OK) s = kiln_body_register(sub, &b->sub_ids[k]);
    }
    if (s == KILN_OK) {
        pthread_mutex_lock(&registry_lock);
        if (nbodies == cap_bodies) {
            int64_t ncap = cap_bodies ? cap_bodies * 2 : 64;
            body **grown = kiln_realloc(bodies, sizeof *grown * (size_t)ncap);
            if (grown) bodies = grown, cap_bodies = ncap;
        }
        if (nbodies < cap_bodies) {
            bodies[nbodies] = b;
            *id = nbodies++;
            nlive++;
        } else {
            s = kiln_error(KILN_ERR_MEMORY, "out of memory registering a body");
        }
        pthread_mutex_unlock(&registry_lock);
    }
    if (s != KILN_OK) {
        for (int32_t k = 0; b && b->sub_ids && k < g->nsubgraphs; k++) kiln_body_release(b->sub_ids[k]);
        if (b) free(b->sub_ids);
        free(b);
        kiln_graph_free(g);
    }
    return s;
}

static void body_free(body *b) {
    for (int32_t k = 0; k < b->g->nsubgraphs; k++) kiln_body_release(b->sub_ids[k]);
    kiln_body_release(b->held);
    kiln_graph_free(b->g);
    free(b->sub_ids);
    free(b);
}

void kiln_body_retain(int64_t id) {
    pthread_mutex_lock(&registry_lock);
    if (id >= 0 && id < nbodies && bodies[id]) bodies[id]->refs++;
    pthread_mutex_unlock(&registry_lock);
}

void kiln_body_release(int64_t id) {
    body *dead = NULL;
    pthread_mutex_lock(&registry_lock);
    if (id >= 0 && id < nbodies && bodies[id] && --bodies[id]->refs == 0) {
        dead = bodies[id];
        bodies[id] = NULL;
        nlive--;
    }
    pthread_mutex_unlock(&registry_lock);
    if (dead) body_free(dead);
}

int64_t kiln_body_live_count(void) {
    pthread_mutex_lock(&registry_lock);
    int64_t n = nlive;
    pthread_mutex_unlock(&registry_lock);
    return n;
}

/* The tape keeps the bodies of the control-flow nodes it records (see core/hooks.h). */
static void bodies_hold(kiln_op op, const kiln_attrs *a, int delta) {
    int slots[4], n = kiln_control_slots(op, slots);
    for (int k = 0; k < n; k++)
        if (slots[k] < a->ni) {
            if (delta > 0) kiln_body_retain(a->i[slots[k]]);
            else kiln_body_release(a->i[slots[k]]);
        }
}

__attribute__((constructor)) static void register_bodies_hold(void) { kiln_hooks.bodies_hold = bodies_hold; }

static body *lookup(int64_t id) {
    pthread_mutex_lock(&registry_lock);
    body *b = id >= 0 && id < nbodies ? bodies[id] : NULL;
    pthread_mutex_unlock(&registry_lock);
    if (!b) kiln_error(KILN_ERR_VALUE, "control flow: no registered body %lld (never registered, or released)",
                       (long long)id);
    return b;
}

kiln_status kiln_body_hold(int64_t holder, int64_t held) {
    body *b = lookup(holder);
    if (!b) return KILN_ERR_VALUE;
    if (!kiln_body_graph(held)) return KILN_ERR_VALUE;
    kiln_body_retain(held);
    pthread_mutex_lock(&registry_lock);
    int64_t old = b->held;
    b->held = held;
    pthread_mutex_unlock(&registry_lock);
    kiln_body_release(old);
    return KILN_OK;
}

int64_t kiln_body_held(int64_t id) {
    body *b = lookup(id);
    return b ? b->held : -1;
}

const kiln_graph *kiln_body_graph(int64_t id) {
    body *b = lookup(id);
    return b ? b->g : NULL;
}

const kiln_graph *kiln_body_of(kiln_op op, const kiln_attrs *a, int k) {
    int64_t id;
    if (kiln_attrs_body(op, a, k, &id) != KILN_OK) return NULL;
    const kiln_graph *g = kiln_body_graph(id);
    if (!g) kiln_error_context(KILN_ERR_VALUE, "%s", kiln_op_table[op].name);
    return g;
}

kiln_status kiln_body_node_attrs(int64_t id, const kiln_node *n, kiln_attrs *out) {
    body *b = lookup(id);
    if (!b) return KILN_ERR_VALUE;
    *out = n->attrs;
    int slots[4], ns = kiln_control_slots(n->op, slots);
    for (int k = 0; k < ns; k++) {
        int32_t idx;
        KILN_TRY(kiln_graph_body_index(b->g, n->op, &n->attrs, k, &idx));
        out->i[slots[k]] = b->sub_ids[idx];
    }
    return KILN_OK;
}

/* ---- interpreting a body eagerly ------------------------------------------------------------------ */

kiln_status kiln_body_interpret(int64_t id, int nin, kiln_tensor *const *in, int nout, kiln_tensor **out) {
    body *b = lookup(id);
    if (!b) return KILN_ERR_VALUE;
    const kiln_graph *g = b->g;
    if (nin != g->ninputs || nout != g->noutputs)
        return kiln_error(KILN_ERR_VALUE, "control flow: the body takes %d inputs and returns %d values, got %d and %d",
                          g->ninputs, g->noutputs, nin, nout);
    kiln_tensor **slot = kiln_calloc((size_t)(g->nvalues ? g->nvalues : 1), sizeof *slot);
    kiln_tensor **ins = NULL;
    int cap_in = 0;
    if (!slot) return kiln_error(KILN_ERR_MEMORY, "out of memory running a body");
    for (int k = 0; k < nin; k++) {
        kiln_tensor_retain(in[k]);
        slot[g->inputs[k]] = in[k];
    }
    for (int32_t c = 0; c < g->ncaptures; c++) {
        kiln_tensor *t = g->values[g->captures[c]].bound;
        kiln_tensor_retain(t);
        slot[g->captures[c]] = t;
    }
    kiln_status s = KILN_OK;
    for (int32_t i = 0; i < g->nnodes && s == KILN_OK; i++) {
        const kiln_node *n = &g->nodes[i];
        if (n->nin > cap_in) {
            kiln_tensor **grown = kiln_realloc(ins, sizeof *grown * (size_t)n->nin);
            if (!grown) {
                s = kiln_error(KILN_ERR_MEMORY, "out of memory running a body");
                break;
            }
            ins = grown;
            cap_in = n->nin;
        }
        for (int k = 0; k < n->nin; k++) ins[k] = slot[n->in[k]];
        kiln_attrs a = n->attrs;
        if (kiln_op_is_control(n->op)) s = kiln_body_node_attrs(id, n, &a);
        kiln_tensor *outs[KILN_MAX_OUTPUTS] = {0};
        if (s == KILN_OK) s = kiln_apply(n->op, n->nin, ins, &a, outs);
        if (s != KILN_OK) {
            if (n->loc >= 0) kiln_error_context(s, "%s (%s)", kiln_op_table[n->op].name, g->locs[n->loc]);
            break;
        }
        for (int k = 0; k < n->nout; k++) slot[n->out[k]] = outs[k];
    }
    for (int k = 0; k < nout && s == KILN_OK; k++) {
        out[k] = slot[g->outputs[k]];
        kiln_tensor_retain(out[k]);
    }
    kiln_release_all(slot, g->nvalues);
    free(slot), free(ins);
    return s;
}

/* ---- lifting captures into inputs ---------------------------------------------------------------- */

kiln_status kiln_graph_capture_to_input(kiln_graph *g, int32_t v) {
    int32_t *grown = kiln_realloc(g->inputs, sizeof(int32_t) * (size_t)(g->ninputs + 1));
    if (!grown) return kiln_error(KILN_ERR_MEMORY, "out of memory lifting captures");
    g->inputs = grown;
    g->cap_inputs = g->ninputs + 1;
    kiln_value *val = &g->values[v];
    int32_t c = val->index;
    for (int32_t k = c + 1; k < g->ncaptures; k++) {
        g->captures[k - 1] = g->captures[k];
        g->values[g->captures[k - 1]].index = k - 1;
    }
    g->ncaptures--;
    kiln_tensor_release(val->bound);
    val->bound = NULL;
    val->kind = KILN_VALUE_INPUT;
    val->index = g->ninputs;
    g->inputs[g->ninputs++] = v;
    return KILN_OK;
}

kiln_status kiln_bodies_lift(int n, kiln_graph *const *bodies_in, kiln_tensor ***lifted, int *nlifted) {
    int total = 0;
    for (int b = 0; b < n; b++) total += bodies_in[b]->ncaptures;
    kiln_tensor **list = kiln_malloc(sizeof *list * (size_t)(total ? total : 1));
    if (!list) return kiln_error(KILN_ERR_MEMORY, "out of memory lifting captures");
    int count = 0;
    for (int b = 0; b < n; b++) {
        const kiln_graph *g = bodies_in[b];
        for (int32_t c = 0; c < g->ncaptures; c++) {
            const kiln_value *v = &g->values[g->captures[c]];
            if (v->constant) continue;
            bool seen = false;
            for (int k = 0; k < count && !seen; k++) seen = list[k] == v->bound;
            if (!seen) {
                kiln_tensor_retain(v->bound);
                list[count++] = v->bound;
            }
        }
    }
    kiln_status s = KILN_OK;
    for (int b = 0; b < n && s == KILN_OK; b++) {
        kiln_graph *g = bodies_in[b];
        for (int k = 0; k < count && s == KILN_OK; k++) {
            int32_t found = -1;
            for (int32_t c = 0; c < g->ncaptures && found < 0; c++) {
                const kiln_value *v = &g->values[g->captures[c]];
                if (!v->constant && v->bound == list[k]) found = g->captures[c];
            }
            if (found >= 0) s = kiln_graph_capture_to_input(g, found);
            else s = kiln_graph_add_input(g, &list[k]->meta, &found);
        }
    }
    if (s != KILN_OK) {
        kiln_release_all(list, count);
        free(list);
        return s;
    }
    *lifted = list;
    *nlifted = count;
    return KILN_OK;
}
