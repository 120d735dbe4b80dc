/* Reverse-mode autodiff: recording nodes in kiln_apply, and running gradient rules over them
 * in reverse creation order. */
#include "node.h"

#include "../core/hooks.h"
#include "../core/ptrmap.h"

#include <stdatomic.h>

static _Atomic uint64_t next_seq;

/* kiln_apply and tensor release reach the tape through core's hooks, set when the library loads. */
__attribute__((constructor)) static void register_hooks(void) {
    kiln_hooks.autograd_record = kiln_autograd_record;
    kiln_hooks.grad_node_release = kiln_grad_node_release;
}

kiln_status kiln_tensor_set_requires_grad(kiln_tensor *t, bool requires_grad) {
    if (requires_grad && !kiln_dtype_is_float(t->meta.dtype))
        return kiln_error(KILN_ERR_TYPE, "only floating-point tensors can require grad, got %s",
                          kiln_dtype_name(t->meta.dtype));
    if (!requires_grad && t->grad_fn)
        return kiln_error(KILN_ERR_VALUE, "requires_grad can only be cleared on leaf tensors; use stop_gradient");
    t->requires_grad = requires_grad;
    return KILN_OK;
}

/* ---- nodes ----------------------------------------------------------------------------- */

/* Frees n; the nodes whose last reference it held are pushed on *dying (a list threaded through the
 * nodes themselves: freeing a long chain allocates nothing and does not recurse). */
static void node_free_fields(kiln_grad_node *n, kiln_grad_node **dying) {
    for (int k = 0; k < n->nin; k++) {
        kiln_tensor_release(n->saved_in[k]);
        kiln_tensor_release(n->next[k].leaf);
        kiln_grad_node *child = n->next[k].node;
        if (!child) continue;
        if (atomic_fetch_sub_explicit((_Atomic int64_t *)&child->refcount, 1, memory_order_acq_rel) != 1)
            continue;
        child->dying = *dying;
        *dying = child;
    }
    for (int k = 0; k < n->nout; k++) kiln_tensor_release(n->saved_out[k]);
    if (n->custom) {
        if (n->custom->release) n->custom->release(n->custom->ctx);
        free(n->custom);
    } else if ((kiln_op_table[n->op].flags & KILN_OPF_CONTROL) && kiln_hooks.bodies_hold) {
        kiln_hooks.bodies_hold(n->op, &n->attrs, -1);
    }
    if (n->hooks) kiln_grad_hooks_free(n->hooks);
    free(n->in_meta);
    free(n);
}

void kiln_grad_node_release(kiln_grad_node *node) {
    if (!node) return;
    if (atomic_fetch_sub_explicit((_Atomic int64_t *)&node->refcount, 1, memory_order_acq_rel) != 1) return;
    kiln_grad_node *dying = NULL;
    node_free_fields(node, &dying);
    while (dying) {
        kiln_grad_node *n = dying;
        dying = n->dying;
        node_free_fields(n, &dying);
    }
}

const char *kiln_grad_node_name(const kiln_grad_node *node) {
    return node->custom ? node->custom->name : kiln_op_table[node->op].name;
}

static void node_retain(kiln_grad_node *n) {
    atomic_fetch_add_explicit((_Atomic int64_t *)&n->refcount, 1, memory_order_relaxed);
}

/* One allocation for the node's arrays, laid out after the metas. */
static kiln_grad_node *node_new(kiln_op op, int nin, int nout, const kiln_attrs *attrs, kiln_custom_grad *custom) {
    kiln_grad_node *n = kiln_calloc(1, sizeof *n);
    size_t bytes = sizeof(kiln_meta) * (size_t)(nin + nout) + sizeof(kiln_tensor *) * (size_t)(nin + nout) +
                   sizeof(int64_t) * (size_t)(nin + nout) + sizeof(kiln_grad_edge) * (size_t)nin;
    char *block = n ? kiln_calloc(1, bytes) : NULL;
    if (!block) {
        free(n);
        kiln_error(KILN_ERR_MEMORY, "out of memory recording %s for autograd", custom ? custom->name : kiln_op_table[op].name);
        return NULL;
    }
    n->in_meta = (kiln_meta *)block;
    n->out_meta = n->in_meta + nin;
    n->saved_in = (kiln_tensor **)(n->out_meta + nout);
    n->saved_out = n->saved_in + nin;
    n->saved_version = (int64_t *)(n->saved_out + nout);
    n->next = (kiln_grad_edge *)(n->saved_version + nin + nout);
    n->refcount = 1;
    n->seq = atomic_fetch_add_explicit(&next_seq, 1, memory_order_relaxed);
    n->op = op;
    n->nin = nin;
    n->nout = nout;
    n->attrs = *attrs;
    n->custom = custom;
    n->trace = 0, n->loc = -1;
    n->hooks = NULL;
    if (kiln_hooks.trace_loc_get) kiln_hooks.trace_loc_get(&n->trace, &n->loc);
    /* the gradient rule of a control-flow node reads its bodies: the node keeps them alive */
    if (!custom && (kiln_op_table[op].flags & KILN_OPF_CONTROL) && kiln_hooks.bodies_hold)
        kiln_hooks.bodies_hold(op, attrs, 1);
    return n;
}

uint64_t kiln_autograd_clock(void) { return atomic_load_explicit(&next_seq, memory_order_relaxed); }

/* The edge of input k of n to the history of t. */
static void link_input(kiln_grad_node *n, int k, kiln_tensor *t) {
    n->in_meta[k] = t->meta;
    if (!t->requires_grad) return;
    if (t->grad_fn) {
        n->next[k].node = t->grad_fn;
        n->next[k].output_nr = t->output_nr;
        node_retain(t->grad_fn);
    } else {
        n->next[k].leaf = t;
        kiln_tensor_retain(t);
    }
}

/* The float tensors of out become n's outputs (an earlier history is rebased: an op in place). */
static void link_outputs(kiln_grad_node *n, int nout, kiln_tensor **out) {
    for (int k = 0; k < nout; k++) {
        kiln_tensor *o = out[k];
        if (!kiln_dtype_is_float(o->meta.dtype) || o->grad_fn == n) continue; /* (the same tensor twice) */
        if (o->grad_fn) kiln_grad_node_release(o->grad_fn);
        node_retain(n);
        o->grad_fn = n;
        o->output_nr = k;
        o->requires_grad = true;
    }
}

/* Whether n keeps output k for its gradient: the op's flag, or a while recorded with stored residuals
 * (ops.def: its outputs after the loop values; only its own gradient reads them). */
static bool saves_output(kiln_op op, const kiln_attrs *attrs, int k, int nout) {
    if (kiln_op_table[op].flags & KILN_OPF_SAVE_OUTPUTS) return true;
    return op == KILN_OP_WHILE && k >= nout - kiln_attr_int(attrs, KILN_A_WHILE_NRES, 0);
}

kiln_status kiln_autograd_record(kiln_op op, int nin, kiln_tensor *const *in, const kiln_attrs *attrs,
                                 int nout, kiln_tensor **out) {
    const kiln_op_info *info = &kiln_op_table[op];
    bool mutates = info->flags & KILN_OPF_MUTATES;
    if (mutates && in[0]->requires_grad && !in[0]->grad_fn)
        return kiln_error(KILN_ERR_RUNTIME,
                          "%s: a leaf tensor that requires grad cannot be modified in place; "
                          "modify a copy, or do it under no_grad", info->name);
    kiln_grad_node *n = node_new(op, nin, nout, attrs, NULL);
    if (!n) return KILN_ERR_MEMORY;
    kiln_status s = KILN_OK;
    for (int k = 0; k < nin; k++) {
        kiln_tensor *t = in[k];
        link_input(n, k, t);
        bool cross_unneeded = (info->flags & KILN_OPF_CROSS_SAVED) && nin == 2 && !in[1 - k]->requires_grad;
        if ((info->flags & KILN_OPF_SAVE_INPUTS) && !(k < 8 && (info->flags & KILN_OPF_UNSAVED_INPUT(k))) &&
            !cross_unneeded) {
            /* the tensor itself keeps its history for higher-order gradients; an input that
             * this op overwrites is saved as a plain alias to avoid a cycle */
            if (mutates && k == 0) {
                if (s == KILN_OK) s = kiln_tensor_detach(t, &n->saved_in[k]);
            } else {
                kiln_tensor_retain(t);
                n->saved_in[k] = t;
            }
            n->saved_version[k] = kiln_tensor_version(t);
        }
    }
    for (int k = 0; k < nout; k++) {
        n->out_meta[k] = out[k]->meta;
        if (saves_output(op, attrs, k, nout) && s == KILN_OK) {
            s = kiln_tensor_detach(out[k], &n->saved_out[k]); /* no history: no cycle */
            n->saved_version[nin + k] = kiln_tensor_version(out[k]);
        }
    }
    if (s != KILN_OK) {
        kiln_grad_node_release(n);
        return s;
    }
    link_outputs(n, nout, out);
    kiln_grad_node_release(n);
    return KILN_OK;
}

kiln_status kiln_autograd_record_custom(int nin, kiln_tensor *const *in, int nout, kiln_tensor **out,
                                        const kiln_custom_grad *fn) {
    bool any = false;
    for (int k = 0; k < nin; k++) any |= in[k]->requires_grad;
    if (!any || !kiln_grad_enabled()) {
        if (fn->release) fn->release(fn->ctx);
        return KILN_OK;
    }
    kiln_custom_grad *custom = kiln_malloc(sizeof *custom);
    static const kiln_attrs none;
    kiln_grad_node *n = custom ? node_new((kiln_op)0, nin, nout, &none, custom) : NULL;
    if (!n) {
        if (fn->release) fn->release(fn->ctx);
        free(custom);
        return custom ? KILN_ERR_MEMORY : kiln_error(KILN_ERR_MEMORY, "out of memory recording %s", fn->name);
    }
    *custom = *fn;
    for (int k = 0; k < nin; k++) link_input(n, k, in[k]);
    for (int k = 0; k < nout; k++) n->out_meta[k] = out[k]->meta;
    link_outputs(n, nout, out);
    kiln_grad_node_release(n);
    return KILN_OK;
}

/* ---- gradient hooks ---------------------------------------------------------------------- */

static _Atomic int64_t next_hook_id = 1;

kiln_status kiln_autograd_add_hook(kiln_tensor *t, const kiln_grad_hook *hook, int64_t *id) {
    if (!t->requires_grad) {
        if (hook->release) hook->release(hook->ctx);
        return kiln_error(KILN_ERR_RUNTIME, "register_hook: the tensor does not require grad, so no gradient "
                                            "will reach a hook on it");
    }
    kiln_grad_hook *h = kiln_malloc(sizeof *h);
    if (!h) {
        if (hook->release) hook->release(hook->ctx);
        return kiln_error(KILN_ERR_MEMORY, "out of memory adding a gradient hook");
    }
    *h = *hook;
    h->id = atomic_fetch_add_explicit(&next_hook_id, 1, memory_order_relaxed);
    h->next = NULL;
    /* a leaf's hooks are its own; another tensor's live on the node that made it, for that output
     * (every alias of the output, and every use of it made before the hook was added, sees them) */
    h->output_nr = t->grad_fn ? t->output_nr : 0;
    kiln_grad_hook **tail = t->grad_fn ? &t->grad_fn->hooks : &t->grad_hooks;
    while (*tail) tail = &(*tail)->next;
    *tail = h;
    *id = h->id;
    return KILN_OK;
}

static bool unlink_hook(kiln_grad_hook **list, int64_t id) {
    for (; *list; list = &(*list)->next) {
        if ((*list)->id != id) continue;
        kiln_grad_hook *h = *list;
        *list = h->next;
        h->next = NULL;
        kiln_grad_hooks_free(h);
        return true;
    }
    return false;
}

bool kiln_autograd_remove_hook(kiln_tensor *t, int64_t id) {
    return unlink_hook(&t->grad_hooks, id) || (t->grad_fn && unlink_hook(&t->grad_fn->hooks, id));
}

bool kiln_autograd_has_hooks(const kiln_tensor *t) {
    if (t->grad_hooks) return true;
    for (const kiln_grad_hook *h = t->grad_fn ? t->grad_fn->hooks : NULL; h; h = h->next)
        if (h->output_nr == t->output_nr) return true;
    return false;
}

/* Runs the hooks of list that see output output_nr (all of them: -1) on *g, in order, each on what the
 * one before returned; *g is replaced by what a hook returns (checked: the same shape, cast to g's
 * dtype). */
static kiln_status run_hooks(const kiln_grad_hook *list, int32_t output_nr, kiln_tensor **g) {
    for (const kiln_grad_hook *h = list; h; h = h->next) {
        if (output_nr >= 0 && h->output_nr != output_nr) continue;
        kiln_tensor *out = NULL;
        KILN_TRY(h->fn(h->ctx, *g, &out));
        if (!out) continue;
        const kiln_meta *want = &(*g)->meta;
        bool same = out->meta.ndim == want->ndim;
        for (int d = 0; same && d < want->ndim; d++) same = out->meta.shape[d] == want->shape[d];
        if (!same) {
            char a[96], b[96];
            kiln_status s = kiln_error(KILN_ERR_VALUE, "a gradient hook returned a gradient of shape %s for a "
                                                       "gradient of shape %s", kiln_shape_str(&out->meta, a, sizeof a),
                                       kiln_shape_str(want, b, sizeof b));
            kiln_tensor_release(out);
            return s;
        }
        if (out->meta.dtype != want->dtype) {
            kiln_tensor *c;
            kiln_status s = kiln_emit_cast(out, want->dtype, &c);
            kiln_tensor_release(out);
            KILN_TRY(s);
            out = c;
        }
        kiln_tensor_release(*g);
        *g = out;
    }
    return KILN_OK;
}

/* ---- the backward pass ---------------------------------------------------------------- */

typedef struct {
    kiln_grad_node *node;
    kiln_tensor **grads; /* nout accumulated output gradients */
    bool needed;
} work_item;

typedef struct {
    work_item *items;
    int count, cap;
    kiln_ptrmap index; /* node -> its item */
} work_list;

static int find_item(const work_list *w, const kiln_grad_node *n) { return (int)kiln_ptrmap_get(&w->index, n); }

static int cmp_seq_desc(const void *a, const void *b) {
    const work_item *x = a, *y = b;
    return x->node->seq < y->node->seq ? 1 : (x->node->seq > y->node->seq ? -1 : 0);
}

/* Every node reachable from `roots`, most recent first. */
static kiln_status collect(work_list *w, kiln_grad_node *const *roots, int nroots) {
    kiln_grad_node **stack = NULL;
    int depth = 0, cap = 0;
    for (int r = 0; r < nroots + 1; r++) {
        kiln_grad_node *start = r < nroots ? roots[r] : NULL;
        if (start && depth == 0) {
            if (find_item(w, start) >= 0) continue;
            cap = cap ? cap : 64;
            if (!stack) stack = kiln_malloc(sizeof *stack * (size_t)cap);
            if (!stack) return kiln_error(KILN_ERR_MEMORY, "out of memory in backward");
            stack[depth++] = start;
        }
        while (depth > 0) {
            kiln_grad_node *n = stack[--depth];
            if (find_item(w, n) >= 0) continue;
            if (w->count == w->cap) {
                int ncap = w->cap ? w->cap * 2 : 64;
                work_item *grown = kiln_realloc(w->items, sizeof *grown * (size_t)ncap);
                if (!grown) {
                    free(stack);
                    return kiln_error(KILN_ERR_MEMORY, "out of memory in backward");
                }
                w->items = grown;
                w->cap = ncap;
            }
            if (kiln_ptrmap_put(&w->index, n, w->count) != KILN_OK) {
                free(stack);
                return KILN_ERR_MEMORY;
            }
            w->items[w->count++] = (work_item){n, NULL, false};
            for (int k = 0; k < n->nin; k++) {
                if (!n->next[k].node) continue;
                if (depth == cap) {
                    cap *= 2;
                    kiln_grad_node **grown = kiln_realloc(stack, sizeof *stack * (size_t)cap);
                    if (!grown) {
                        free(stack);
                        return kiln_error(KILN_ERR_MEMORY, "out of memory in backward");
                    }
                    stack = grown;
                }
                stack[depth++] = n->next[k].node;
            }
        }
    }
    free(stack);
    qsort(w->items, (size_t)w->count, sizeof *w->items, cmp_seq_desc);
    for (int k = 0; k < w->count; k++) KILN_TRY(kiln_ptrmap_put(&w->index, w->items[k].node, k));
    return KILN_OK;
}

/* *acc += g (both new references; consumes g). */
static kiln_status accumulate(kiln_tensor **acc, kiln_tensor *g) {
    if (!*acc) {
        *acc = g;
        return KILN_OK;
    }
    kiln_tensor *sum;
    kiln_status s = kiln_emit_binary(KILN_OP_ADD, *acc, g, &sum);
    kiln_tensor_release(g);
    if (s != KILN_OK) return s;
    kiln_tensor_release(*acc);
    *acc = sum;
    return KILN_OK;
}

static kiln_status ones_like(const kiln_tensor *t, kiln_tensor **out) {
    return kiln_emit_full(&t->meta, 1.0, out);
}

/* An alias of a saved output that carries the node's history, for higher-order gradients. */
static kiln_status unpack_output(kiln_grad_node *n, int k, bool create_graph, kiln_tensor **out) {
    kiln_tensor *saved = n->saved_out[k];
    if (!create_graph || !saved || !kiln_dtype_is_float(saved->meta.dtype)) {
        *out = NULL;
        return KILN_OK;
    }
    KILN_TRY(kiln_tensor_detach(saved, out));
    node_retain(n);
    (*out)->grad_fn = n;
    (*out)->output_nr = k;
    (*out)->requires_grad = true;
    return KILN_OK;
}

static kiln_status check_versions(const kiln_grad_node *n) {
    for (int k = 0; k < n->nin + n->nout; k++) {
        kiln_tensor *t = k < n->nin ? n->saved_in[k] : n->saved_out[k - n->nin];
        if (t && kiln_tensor_version(t) != n->saved_version[k])
            return kiln_error(KILN_ERR_RUNTIME,
                              "%s: a tensor needed to compute gradients was modified in place after "
                              "it was used", kiln_op_table[n->op].name);
    }
    return KILN_OK;
}

static kiln_status run_rule(kiln_grad_node *n, kiln_tensor **grads, const bool *needs, bool create_graph,
                            kiln_tensor **gin) {
    KILN_TRY(check_versions(n));
    kiln_tensor *outs[KILN_MAX_OUTPUTS] = {0};
    kiln_status s = KILN_OK;
    /* recorded by a trace, the gradient's ops carry the forward op's source line, not the line the
     * trace reached when the backward ran */
    bool located = n->trace && kiln_hooks.trace_loc_set;
    int32_t outer_loc = located ? kiln_hooks.trace_loc_set(n->trace, n->loc) : -1;
    /* gradients run in the dtypes the forward ran in: amp's casts belong to the forward (a
     * backward() inside an autocast region would otherwise cast the gradients' products again) */
    int8_t amp_level = kiln_thread.amp_level;
    kiln_thread.amp_level = 0;
    if (n->custom) {
        s = n->custom->backward(n->custom->ctx, n->nout, grads, n->nin, needs, create_graph, gin);
        if (s != KILN_OK) kiln_error_context(s, "in the gradient of %s", n->custom->name);
    }
    for (int k = 0; k < n->nout && s == KILN_OK && !n->custom; k++) s = unpack_output(n, k, create_graph, &outs[k]);
    kiln_tensor *const *out_view = create_graph ? outs : n->saved_out;
    if (s == KILN_OK && !n->custom) {
        kiln_grad_ctx ctx = {n->op, n->nin, n->nout, n->saved_in, out_view, n->in_meta, n->out_meta, &n->attrs, needs};
        s = kiln_op_table[n->op].grad(&ctx, grads, gin);
        if (s != KILN_OK) kiln_error_context(s, "in the gradient of %s", kiln_op_table[n->op].name);
    }
    if (located) kiln_hooks.trace_loc_set(n->trace, outer_loc);
    kiln_thread.amp_level = amp_level;
    /* (outs holds an op's outputs, at most KILN_MAX_OUTPUTS; a custom node, a compiled piece, may
     * have more and fills none) */
    for (int k = 0; k < n->nout && !n->custom; k++) kiln_tensor_release(outs[k]);
    for (int k = 0; k < n->nin && s == KILN_OK; k++) {
        if (!gin[k]) continue;
        const kiln_meta *want = &n->in_meta[k], *got = &gin[k]->meta;
        bool same = want->ndim == got->ndim;
        for (int d = 0; same && d < want->ndim; d++) same = want->shape[d] == got->shape[d];
        if (!same && n->custom) {
            s = kiln_error(KILN_ERR_RUNTIME, "%s: the gradient of input %d has the wrong shape", n->custom->name, k);
            break;
        }
        KILN_ASSERT(same); /* a gradient rule returned a wrongly shaped gradient */
        if (got->dtype != want->dtype) { /* e.g. int inputs promoted to float */
            kiln_tensor *c;
            s = kiln_emit_cast(gin[k], want->dtype, &c);
            if (s == KILN_OK) {
                kiln_tensor_release(gin[k]);
                gin[k] = c;
            }
        }
    }
    if (s != KILN_OK) kiln_release_all(gin, n->nin);
    return s;
}

/* Delivers g (consumed), a gradient that reached leaf: to the requested inputs that are leaf and, with
 * accumulate_leaves, into its .grad (without history unless keep_history). */
static kiln_status deliver_leaf(kiln_tensor *leaf, kiln_tensor *g, int nin, kiln_tensor *const *inputs,
                                kiln_tensor **grads, bool accumulate_leaves, bool keep_history) {
    kiln_status s = KILN_OK;
    for (int j = 0; j < nin && s == KILN_OK; j++)
        if (inputs[j] == leaf) {
            kiln_tensor_retain(g);
            s = accumulate(&grads[j], g);
        }
    if (accumulate_leaves && s == KILN_OK) {
        kiln_tensor *d;
        s = keep_history ? KILN_OK : kiln_tensor_detach(g, &d);
        if (s == KILN_OK && !keep_history) {
            kiln_tensor_release(g);
            g = d;
        }
        if (s == KILN_OK) {
            s = accumulate(&leaf->grad, g);
            g = NULL;
        }
    }
    kiln_tensor_release(g);
    return s;
}

/* The gradients of leaves with hooks are summed over the whole pass first: the hooks see the total,
 * once, as with a tensor made by an op (the edges of a leaf are not counted ahead of the pass). */
typedef struct {
    kiln_tensor *leaf; /* owned */
    kiln_tensor *sum;  /* owned */
} held_leaf;

typedef struct {
    held_leaf *items;
    int count, cap;
} held_leaves;

static kiln_status hold_leaf(held_leaves *h, kiln_tensor *leaf, kiln_tensor *g) {
    for (int k = 0; k < h->count; k++)
        if (h->items[k].leaf == leaf) return accumulate(&h->items[k].sum, g);
    if (h->count == h->cap) {
        int ncap = h->cap ? h->cap * 2 : 8;
        held_leaf *grown = kiln_realloc(h->items, sizeof *grown * (size_t)ncap);
        if (!grown) {
            kiln_tensor_release(g);
            return kiln_error(KILN_ERR_MEMORY, "out of memory in backward");
        }
        h->items = grown, h->cap = ncap;
    }
    kiln_tensor_retain(leaf);
    h->items[h->count++] = (held_leaf){leaf, g};
    return KILN_OK;
}

static void held_free(held_leaves *h) {
    for (int k = 0; k < h->count; k++) {
        kiln_tensor_release(h->items[k].leaf);
        kiln_tensor_release(h->items[k].sum);
    }
    free(h->items);
}

/* The shared pass. With `inputs` (nin of them), their gradients land in `grads`; without,
 * gradients accumulate into every reached leaf's .grad. */
static kiln_status run_backward(int nout, kiln_tensor *const *outputs, kiln_tensor *const *grad_outputs,
                                int nin, kiln_tensor *const *inputs, bool create_graph, kiln_tensor **grads) {
    bool accumulate_leaves = inputs == NULL;
    for (int j = 0; j < nin; j++) grads[j] = NULL;
    kiln_grad_node **roots = kiln_malloc(sizeof *roots * (size_t)(nout ? nout : 1));
    if (!roots) return kiln_error(KILN_ERR_MEMORY, "out of memory in backward");
    int nroots = 0;
    for (int k = 0; k < nout; k++) {
        if (!outputs[k]->requires_grad) {
            free(roots);
            return kiln_error(KILN_ERR_RUNTIME, "grad: output %d does not require grad and has no history; "
                                                "was it computed from inputs that require grad, outside no_grad?", k);
        }
        if (outputs[k]->grad_fn) roots[nroots++] = outputs[k]->grad_fn;
    }
    work_list w = {0};
    held_leaves held = {0};
    kiln_status s = collect(&w, roots, nroots);
    free(roots);
    bool prev_mode = kiln_set_grad_enabled(create_graph);

    /* which nodes lead to a requested input */
    for (int i = w.count - 1; i >= 0 && s == KILN_OK; i--) {
        kiln_grad_node *n = w.items[i].node;
        bool needed = accumulate_leaves;
        for (int j = 0; j < nin && !needed; j++) needed = inputs[j]->grad_fn == n;
        for (int k = 0; k < n->nin && !needed; k++) {
            if (n->next[k].leaf)
                for (int j = 0; j < nin && !needed; j++) needed = inputs[j] == n->next[k].leaf;
            if (n->next[k].node) {
                int at = find_item(&w, n->next[k].node);
                needed = at >= 0 && w.items[at].needed;
            }
        }
        w.items[i].needed = needed;
    }
    for (int i = 0; i < w.count && s == KILN_OK; i++) {
        w.items[i].grads = kiln_calloc((size_t)w.items[i].node->nout, sizeof(kiln_tensor *));
        if (!w.items[i].grads) s = kiln_error(KILN_ERR_MEMORY, "out of memory in backward");
    }
    /* seed the outputs' gradients */
    for (int k = 0; k < nout && s == KILN_OK; k++) {
        kiln_tensor *g = grad_outputs && grad_outputs[k] ? grad_outputs[k] : NULL;
        kiln_tensor *seed;
        if (g) {
            kiln_tensor_retain(g);
            seed = g;
        } else {
            s = ones_like(outputs[k], &seed);
            if (s != KILN_OK) break;
        }
        kiln_tensor *o = outputs[k];
        if (o->grad_fn) {
            work_item *it = &w.items[find_item(&w, o->grad_fn)];
            s = accumulate(&it->grads[o->output_nr], seed);
        } else if (o->grad_hooks) { /* a leaf with hooks given as output */
            s = hold_leaf(&held, o, seed);
        } else { /* a leaf given as output */
            for (int j = 0; j < nin; j++)
                if (inputs[j] == o && s == KILN_OK) {
                    kiln_tensor_retain(seed);
                    s = accumulate(&grads[j], seed);
                }
            if (accumulate_leaves && s == KILN_OK) {
                kiln_tensor_retain(seed);
                s = accumulate(&o->grad, seed);
            }
            kiln_tensor_release(seed);
        }
    }
    for (int i = 0; i < w.count && s == KILN_OK; i++) {
        work_item *it = &w.items[i];
        kiln_grad_node *n = it->node;
        /* its outputs' gradients are complete: the hooks on them see each, and may replace it */
        for (int k = 0; n->hooks && it->needed && k < n->nout && s == KILN_OK; k++)
            if (it->grads[k]) s = run_hooks(n->hooks, k, &it->grads[k]);
        for (int j = 0; j < nin && s == KILN_OK; j++) /* a requested non-leaf input */
            if (inputs[j]->grad_fn == n && it->grads[inputs[j]->output_nr]) {
                kiln_tensor_retain(it->grads[inputs[j]->output_nr]);
                s = accumulate(&grads[j], it->grads[inputs[j]->output_nr]);
            }
        if (!it->needed || s != KILN_OK) continue;
        bool any = false;
        for (int k = 0; k < n->nout; k++) any |= it->grads[k] != NULL;
        if (!any) continue;
        bool needs[64], *needs_p = n->nin <= 64 ? needs : kiln_malloc(sizeof(bool) * (size_t)n->nin);
        kiln_tensor *gin_small[8], **gin = n->nin <= 8 ? gin_small : kiln_calloc((size_t)n->nin, sizeof *gin);
        if (!needs_p || !gin) {
            s = kiln_error(KILN_ERR_MEMORY, "out of memory in backward");
            if (needs_p != needs) free(needs_p);
            if (gin != gin_small) free(gin);
            break;
        }
        for (int k = 0; k < n->nin; k++) {
            gin[k] = NULL;
            bool need = false;
            if (n->next[k].node) {
                int at = find_item(&w, n->next[k].node);
                need = at >= 0 && w.items[at].needed;
            } else if (n->next[k].leaf) {
                need = accumulate_leaves;
                for (int j = 0; j < nin && !need; j++) need = inputs[j] == n->next[k].leaf;
            }
            needs_p[k] = need;
        }
        s = run_rule(n, it->grads, needs_p, create_graph, gin);
        for (int k = 0; k < n->nin && s == KILN_OK; k++) {
            if (!gin[k]) continue;
            kiln_tensor *g = gin[k];
            gin[k] = NULL;
            if (!needs_p[k]) {
                kiln_tensor_release(g);
            } else if (n->next[k].node) {
                work_item *to = &w.items[find_item(&w, n->next[k].node)];
                s = accumulate(&to->grads[n->next[k].output_nr], g);
            } else if (n->next[k].leaf->grad_hooks) {
                s = hold_leaf(&held, n->next[k].leaf, g);
            } else {
                s = deliver_leaf(n->next[k].leaf, g, nin, inputs, grads, accumulate_leaves, create_graph);
            }
        }
        kiln_release_all(gin, n->nin); /* what an error left unconsumed */
        if (gin != gin_small) free(gin);
        if (needs_p != needs) free(needs_p);
        kiln_release_all(it->grads, n->nout); /* done with this node: free memory early */
    }
    /* the leaves with hooks: their hooks see each one's whole gradient, then it is delivered */
    for (int k = 0; k < held.count && s == KILN_OK; k++) {
        held_leaf *h = &held.items[k];
        s = run_hooks(h->leaf->grad_hooks, -1, &h->sum);
        if (s != KILN_OK) break; /* (held_free releases the sum) */
        s = deliver_leaf(h->leaf, h->sum, nin, inputs, grads, accumulate_leaves, create_graph);
        h->sum = NULL;
    }
    held_free(&held);
    for (int i = 0; i < w.count; i++) {
        if (w.items[i].grads) kiln_release_all(w.items[i].grads, w.items[i].node->nout);
        free(w.items[i].grads);
    }
    free(w.items);
    kiln_ptrmap_free(&w.index);
    kiln_set_grad_enabled(prev_mode);
    if (s != KILN_OK) kiln_release_all(grads, nin);
    return s;
}

kiln_status kiln_autograd_grad(int nout, kiln_tensor *const *outputs, kiln_tensor *const *grad_outputs,
                               int nin, kiln_tensor *const *inputs, bool create_graph, kiln_tensor **grads) {
    return run_backward(nout, outputs, grad_outputs, nin, inputs, create_graph, grads);
}

kiln_status kiln_autograd_backward(int nout, kiln_tensor *const *outputs, kiln_tensor *const *grad_outputs) {
    return run_backward(nout, outputs, grad_outputs, 0, NULL, false, NULL);
}
