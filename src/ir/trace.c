/* Trace capture: while a tracer is active on a thread, every op kiln_apply runs is also
 * recorded as a graph node. Tensors are matched to graph values by their uid (never reused, so
 * the tracer need not keep them alive); a tensor met for the first time is captured (by
 * reference, or as a constant copy). */
#include "../core/internal.h"
#include "../core/hooks.h"
#include "../core/ptrmap.h"
#include "control.h"
#include "trace_internal.h"

struct kiln_tracer {
    kiln_graph *graph;
    kiln_ptrmap values;   /* tensor uid -> value id */
    bool capture_constants;
    int32_t recompute, recompute_calls; /* the mark of recorded nodes (Cell.recompute), and the last one given */
    int32_t loc;
    int32_t nops;
    kiln_status failure; /* the first recording error (reported at the end of the trace) */
    kiln_tracer *parent;  /* the tracer active when this one began (nested traces of control-flow bodies) */
    kiln_ptrmap bodies;   /* registered body id + 1 -> subgraph index in graph */
    bool own_loc;         /* told source lines itself (kiln_tracer_set_loc) */
    uint64_t serial;      /* this trace among all (tape nodes name the trace that recorded them) */
    uint64_t first_uid;   /* tensors with this uid or a higher one were made while the function ran
                           * (a nested trace's is its outermost one's) */
    int32_t loc_override; /* while a gradient rule runs: its forward op's location, else -1 */
    int32_t value_reads;  /* values of recorded tensors read by the caller (kiln_tracer_note_value_read) */
    char *first_read_loc; /* where the first of them happened, or NULL */
    /* capture_constants: each tensor copied in as a constant (owned), its value id and the storage
     * version it had, so a caller can tell when the original changes in place */
    kiln_tensor **const_src;
    int32_t *const_value;
    int64_t *const_version;
    int32_t nconst, cap_const;
    /* the tensors the trace does not know whose values the caller read (a global's .item()): each
     * (owned) and the storage version it had then, for the caller to guard */
    kiln_tensor **read_src;
    int64_t *read_version;
    int32_t nread, cap_read;
    /* the undo log (kiln_tracer_keep_undo): each tensor the traced ops write in place, and a copy
     * of it made before its first write */
    bool keep_undo;
    kiln_ptrmap undo_seen; /* tensor uid -> its entry */
    kiln_tensor **undo_dst, **undo_copy;
    int32_t nundo, cap_undo;
};

/* The thread's active tracer lives in core (kiln_thread.trace_active), where kiln_apply reads it. */
static void set_active(kiln_tracer *tr) {
    kiln_thread.trace_active = tr;
    kiln_thread.trace_in_body = tr && tr->parent;
}

/* kiln_apply and kiln_tensor_detach record through core's hooks, set when the library loads. */
static kiln_status current_loc(kiln_tracer *tr);

static void trace_loc_get(uint64_t *trace, int32_t *loc) {
    kiln_tracer *tr = kiln_thread.trace_active;
    *trace = 0, *loc = -1;
    if (!tr || tr->failure != KILN_OK || current_loc(tr) != KILN_OK) return;
    *trace = tr->serial;
    *loc = tr->loc_override >= 0 ? tr->loc_override : tr->loc;
}

static int32_t trace_loc_set(uint64_t trace, int32_t loc) {
    kiln_tracer *tr = kiln_thread.trace_active;
    if (!tr || tr->serial != trace) return -1;
    int32_t was = tr->loc_override;
    tr->loc_override = loc >= 0 && loc < tr->graph->nlocs ? loc : -1;
    return was;
}

__attribute__((constructor)) static void register_hooks(void) {
    kiln_hooks.trace_record = kiln_tracer_record;
    kiln_hooks.trace_alias = kiln_tracer_alias;
    kiln_hooks.trace_before_write = kiln_tracer_before_write;
    kiln_hooks.trace_loc_get = trace_loc_get;
    kiln_hooks.trace_loc_set = trace_loc_set;
}

kiln_tracer *kiln_tracer_active(void) { return kiln_thread.trace_active; }

kiln_tracer *kiln_tracer_suspend(void) {
    kiln_tracer *tr = kiln_thread.trace_active;
    set_active(NULL);
    return tr;
}

void kiln_tracer_resume(kiln_tracer *suspended) { set_active(suspended); }

bool kiln_tracer_in_body(void) { return kiln_thread.trace_in_body; }

/* Notes t, a tensor the trace does not know, as read by value (once per tensor). */
static void remember_outside_read(kiln_tracer *tr, const kiln_tensor *t) {
    for (int32_t k = 0; k < tr->nread; k++)
        if (tr->read_src[k] == t) return;
    if (tr->nread == tr->cap_read) {
        int32_t cap = tr->cap_read ? 2 * tr->cap_read : 4;
        kiln_tensor **src = kiln_realloc(tr->read_src, sizeof *src * (size_t)cap);
        if (src) tr->read_src = src;
        int64_t *ver = kiln_realloc(tr->read_version, sizeof *ver * (size_t)cap);
        if (ver) tr->read_version = ver;
        if (!src || !ver) {
            if (tr->failure == KILN_OK) tr->failure = KILN_ERR_MEMORY;
            return;
        }
        tr->cap_read = cap;
    }
    kiln_tensor_retain((kiln_tensor *)t);
    tr->read_src[tr->nread] = (kiln_tensor *)t;
    tr->read_version[tr->nread++] = kiln_tensor_version(t);
}

void kiln_tracer_note_value_read(const kiln_tensor *t) {
    bool known = false;
    for (kiln_tracer *tr = kiln_thread.trace_active; tr && !known; tr = tr->parent) known = kiln_tracer_knows(tr, t);
    if (!known) { /* a tensor from outside: what the caller computes from its value holds while it is unchanged */
        for (kiln_tracer *tr = kiln_thread.trace_active; tr; tr = tr->parent) remember_outside_read(tr, t);
        return;
    }
    for (kiln_tracer *tr = kiln_thread.trace_active; tr; tr = tr->parent) { /* a body fixed by the read fixes its enclosing graph */
        if (tr->value_reads++ == 0 && tr->loc >= 0) tr->first_read_loc = kiln_strdup(tr->graph->locs[tr->loc]);
    }
}

int32_t kiln_tracer_value_reads(const kiln_tracer *tr, const char **first_loc) {
    if (first_loc) *first_loc = tr->first_read_loc;
    return tr->value_reads;
}

kiln_status kiln_tracer_begin(kiln_tracer **out) {
    kiln_tracer *tr = kiln_calloc(1, sizeof *tr);
    if (!tr) return kiln_error(KILN_ERR_MEMORY, "out of memory starting a trace");
    kiln_status s = kiln_graph_new(&tr->graph);
    if (s != KILN_OK) {
        free(tr);
        return s;
    }
    static _Atomic uint64_t serials;
    tr->loc = -1;
    tr->loc_override = -1;
    tr->serial = atomic_fetch_add(&serials, 1) + 1;
    tr->parent = kiln_thread.trace_active;
    tr->first_uid = tr->parent ? tr->parent->first_uid : kiln_tensor_next_uid();
    set_active(tr);
    *out = tr;
    return KILN_OK;
}

void kiln_tracer_end(kiln_tracer *tr) {
    if (kiln_thread.trace_active == tr) set_active(tr->parent);
    tr->parent = NULL;
}

void kiln_tracer_free(kiln_tracer *tr) {
    if (!tr) return;
    kiln_tracer_end(tr);
    kiln_ptrmap_free(&tr->values);
    kiln_ptrmap_free(&tr->bodies);
    free(tr->first_read_loc);
    for (int32_t k = 0; k < tr->nconst; k++) kiln_tensor_release(tr->const_src[k]);
    free(tr->const_src), free(tr->const_value), free(tr->const_version);
    for (int32_t k = 0; k < tr->nread; k++) kiln_tensor_release(tr->read_src[k]);
    free(tr->read_src), free(tr->read_version);
    kiln_tracer_drop_undo(tr);
    kiln_graph_free(tr->graph);
    free(tr);
}

kiln_graph *kiln_tracer_graph(kiln_tracer *tr) { return tr->graph; }

int32_t kiln_tracer_count(const kiln_tracer *tr) { return tr->nops; }

void kiln_tracer_set_capture_constants(kiln_tracer *tr, bool constants) { tr->capture_constants = constants; }

kiln_status kiln_tracer_set_loc(kiln_tracer *tr, const char *loc) {
    tr->own_loc = true;
    if (!loc) {
        tr->loc = -1;
        return KILN_OK;
    }
    return kiln_graph_add_loc(tr->graph, loc, &tr->loc);
}

static const void *key_of(const kiln_tensor *t) { return (const void *)(uintptr_t)t->uid; }

static kiln_status bind(kiln_tracer *tr, const kiln_tensor *t, int32_t value) {
    return kiln_ptrmap_put(&tr->values, key_of(t), value);
}

void kiln_tracer_alias(const kiln_tensor *t, const kiln_tensor *alias) {
    kiln_tracer *tr = kiln_thread.trace_active;
    if (!tr) return;
    int64_t v = kiln_ptrmap_get(&tr->values, key_of(t));
    if (v >= 0 && bind(tr, alias, (int32_t)v) != KILN_OK && tr->failure == KILN_OK) tr->failure = KILN_ERR_MEMORY;
}

static kiln_status remember_constant_source(kiln_tracer *tr, kiln_tensor *t) {
    if (tr->nconst == tr->cap_const) {
        int32_t cap = tr->cap_const ? 2 * tr->cap_const : 8;
        kiln_tensor **src = kiln_realloc(tr->const_src, sizeof *src * (size_t)cap);
        if (src) tr->const_src = src;
        int32_t *val = kiln_realloc(tr->const_value, sizeof *val * (size_t)cap);
        if (val) tr->const_value = val;
        int64_t *ver = kiln_realloc(tr->const_version, sizeof *ver * (size_t)cap);
        if (ver) tr->const_version = ver;
        if (!src || !val || !ver) return kiln_error(KILN_ERR_MEMORY, "out of memory capturing a constant");
        tr->cap_const = cap;
    }
    kiln_tensor_retain(t);
    tr->const_src[tr->nconst] = t;
    tr->const_value[tr->nconst] = -1;
    tr->const_version[tr->nconst++] = kiln_tensor_version(t);
    return KILN_OK;
}

kiln_status kiln_tracer_add_input(kiln_tracer *tr, kiln_tensor *t) {
    int32_t v;
    KILN_TRY(kiln_graph_add_input(tr->graph, &t->meta, &v));
    return bind(tr, t, v);
}

kiln_status kiln_tracer_value_of(kiln_tracer *tr, kiln_tensor *t, int32_t *value) {
    int64_t v = kiln_ptrmap_get(&tr->values, key_of(t));
    if (v >= 0) {
        *value = (int32_t)v;
        return KILN_OK;
    }
    /* Python numbers become tensors just before an op: they are constants of the trace */
    bool constant = tr->capture_constants || t->literal;
    if (constant && !t->literal) KILN_TRY(remember_constant_source(tr, t));
    KILN_TRY(kiln_graph_add_capture(tr->graph, t, constant, value));
    tr->graph->values[*value].fresh = t->uid >= tr->first_uid;
    if (constant && !t->literal) tr->const_value[tr->nconst - 1] = *value;
    return bind(tr, t, *value);
}

int32_t kiln_tracer_num_constant_sources(const kiln_tracer *tr) { return tr->nconst; }

kiln_tensor *kiln_tracer_constant_source(const kiln_tracer *tr, int32_t k, int32_t *value, int64_t *version) {
    if (k < 0 || k >= tr->nconst) return NULL;
    if (value) *value = tr->const_value[k];
    if (version) *version = tr->const_version[k];
    return tr->const_src[k];
}

int32_t kiln_tracer_num_outside_reads(const kiln_tracer *tr) { return tr->nread; }

kiln_tensor *kiln_tracer_outside_read(const kiln_tracer *tr, int32_t k, int64_t *version) {
    if (k < 0 || k >= tr->nread) return NULL;
    if (version) *version = tr->read_version[k];
    return tr->read_src[k];
}

bool kiln_tracer_knows(const kiln_tracer *tr, const kiln_tensor *t) {
    int64_t v = kiln_ptrmap_get(&tr->values, key_of(t));
    return v >= 0 && tr->graph->values[v].kind != KILN_VALUE_CAPTURED;
}

/* attrs naming registered bodies -> attrs naming subgraphs of the traced graph (copied in once). */
static kiln_status subgraphs_of(kiln_tracer *tr, kiln_op op, const kiln_attrs *a, kiln_attrs *out) {
    *out = *a;
    int slots[4], n = kiln_control_slots(op, slots);
    for (int k = 0; k < n; k++) {
        int64_t id;
        KILN_TRY(kiln_attrs_body(op, a, k, &id));
        const void *key = (const void *)(uintptr_t)(id + 1);
        int64_t idx = kiln_ptrmap_get(&tr->bodies, key);
        if (idx < 0) {
            const kiln_graph *body = kiln_body_of(op, a, k);
            kiln_graph *copy;
            int32_t index;
            if (!body) return KILN_ERR_VALUE;
            KILN_TRY(kiln_graph_clone(body, &copy));
            kiln_status s = kiln_graph_add_subgraph(tr->graph, copy, &index);
            if (s != KILN_OK) {
                kiln_graph_free(copy);
                return s;
            }
            idx = index;
            KILN_TRY(kiln_ptrmap_put(&tr->bodies, key, idx));
        }
        out->i[slots[k]] = idx;
    }
    return KILN_OK;
}

/* A nested trace that is not told source lines records those its enclosing trace is told. */
static kiln_status current_loc(kiln_tracer *tr) {
    if (tr->own_loc) return KILN_OK;
    tr->loc = -1;
    for (kiln_tracer *p = tr->parent; p; p = p->parent)
        if (p->own_loc) return p->loc >= 0 ? kiln_graph_add_loc(tr->graph, p->graph->locs[p->loc], &tr->loc) : KILN_OK;
    return KILN_OK;
}

int32_t kiln_tracer_begin_recompute(kiln_tracer *tr) {
    int32_t was = tr->recompute;
    if (!was) tr->recompute = ++tr->recompute_calls;
    return was;
}

void kiln_tracer_end_recompute(kiln_tracer *tr, int32_t previous) { tr->recompute = previous; }

void kiln_tracer_record(kiln_op op, int nin, kiln_tensor *const *in, const kiln_attrs *attrs, int nout,
                        kiln_tensor **out) {
    kiln_tracer *tr = kiln_thread.trace_active;
    if (!tr || tr->failure != KILN_OK) return;
    set_active(NULL); /* capturing a constant copies through kernels, which must not record */
    int32_t small[8] = {0}, *ids = nin <= 8 ? small : kiln_malloc(sizeof(int32_t) * (size_t)nin);
    kiln_status s = ids ? KILN_OK : kiln_error(KILN_ERR_MEMORY, "out of memory while tracing");
    for (int k = 0; k < nin && s == KILN_OK; k++) s = kiln_tracer_value_of(tr, in[k], &ids[k]);
    kiln_attrs translated;
    if (s == KILN_OK && kiln_op_is_control(op)) {
        s = subgraphs_of(tr, op, attrs, &translated);
        attrs = &translated;
    }
    int32_t outs[KILN_MAX_OUTPUTS];
    if (s == KILN_OK) s = current_loc(tr);
    if (s == KILN_OK)
        s = kiln_graph_add_node(tr->graph, op, nin, ids, attrs, tr->loc_override >= 0 ? tr->loc_override : tr->loc, outs);
    if (s == KILN_OK) tr->graph->nodes[tr->graph->nnodes - 1].recompute = tr->recompute;
    for (int k = 0; k < nout && s == KILN_OK; k++) s = bind(tr, out[k], outs[k]);
    if (ids != small) free(ids);
    if (s != KILN_OK) tr->failure = kiln_error_context(s, "while tracing %s", kiln_op_table[op].name);
    tr->nops++;
    set_active(tr);
}

kiln_status kiln_tracer_status(const kiln_tracer *tr) { return tr->failure; }

void kiln_tracer_keep_undo(kiln_tracer *tr, bool keep) { tr->keep_undo = keep; }

/* The copy of t as it is now, in the undo log of the innermost active tracer keeping one (once
 * per tensor: its value before the trace's first write of it). */
void kiln_tracer_before_write(kiln_op op, int nin, kiln_tensor *const *in) {
    kiln_tracer *tr = kiln_thread.trace_active;
    while (tr && !tr->keep_undo) tr = tr->parent;
    if (!tr || tr->failure != KILN_OK) return;
    uint64_t flags = kiln_op_table[op].flags;
    kiln_tracer *active = kiln_thread.trace_active;
    set_active(NULL); /* the copies are not part of the trace */
    kiln_status s = KILN_OK;
    for (int k = 0; k < nin && s == KILN_OK; k++) {
        bool written = (k == 0 && (flags & KILN_OPF_MUTATES)) || (k < 8 && (flags & KILN_OPF_WRITES_INPUT(k)));
        if (!written || kiln_ptrmap_get(&tr->undo_seen, key_of(in[k])) >= 0) continue;
        if (tr->nundo == tr->cap_undo) {
            int32_t cap = tr->cap_undo ? 2 * tr->cap_undo : 8;
            kiln_tensor **dst = kiln_realloc(tr->undo_dst, sizeof *dst * (size_t)cap);
            if (dst) tr->undo_dst = dst;
            kiln_tensor **copy = kiln_realloc(tr->undo_copy, sizeof *copy * (size_t)cap);
            if (copy) tr->undo_copy = copy;
            if (!dst || !copy) {
                s = kiln_error(KILN_ERR_MEMORY, "out of memory keeping a tensor written while tracing");
                break;
            }
            tr->cap_undo = cap;
        }
        kiln_tensor *copy = NULL;
        s = kiln_tensor_empty_like_meta(&in[k]->meta, &copy);
        if (s == KILN_OK) s = kiln_copy_into(copy, in[k]);
        if (s == KILN_OK) s = kiln_ptrmap_put(&tr->undo_seen, key_of(in[k]), tr->nundo);
        if (s != KILN_OK) {
            kiln_tensor_release(copy);
            break;
        }
        kiln_tensor_retain(in[k]);
        tr->undo_dst[tr->nundo] = in[k];
        tr->undo_copy[tr->nundo++] = copy;
    }
    if (s != KILN_OK) tr->failure = kiln_error_context(s, "while tracing %s", kiln_op_table[op].name);
    set_active(active);
}

kiln_status kiln_tracer_undo_writes(kiln_tracer *tr) {
    kiln_tracer *active = kiln_thread.trace_active;
    set_active(NULL);
    kiln_status s = KILN_OK;
    for (int32_t k = tr->nundo - 1; k >= 0 && s == KILN_OK; k--) { /* the latest first: the earliest copy wins */
        s = kiln_copy_into(tr->undo_dst[k], tr->undo_copy[k]);
        if (s == KILN_OK) kiln_tensor_bump_version(tr->undo_dst[k]);
    }
    set_active(active);
    kiln_tracer_drop_undo(tr);
    return s;
}

void kiln_tracer_drop_undo(kiln_tracer *tr) {
    for (int32_t k = 0; k < tr->nundo; k++) {
        kiln_tensor_release(tr->undo_dst[k]);
        kiln_tensor_release(tr->undo_copy[k]);
    }
    free(tr->undo_dst), free(tr->undo_copy);
    tr->undo_dst = tr->undo_copy = NULL;
    tr->nundo = tr->cap_undo = 0;
    kiln_ptrmap_free(&tr->undo_seen);
}
