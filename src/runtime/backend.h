/* Backends: what runs a plan. Each is one small table of functions over the same plain-data plan
 * (src/plan/plan.h) and the same arena; a compiled graph (kiln_executable) is a plan, its arena
 * and one backend's state. Kernel by kernel ("kbk", src/runtime/kbk.c), the whole-graph sink
 * (src/runtime/sink.c) and the reference (src/runtime/reference/) are peers, registered by name
 * in backends.def; a new one is its own folder and one line there. */
#ifndef KILN_RUNTIME_BACKEND_H
#define KILN_RUNTIME_BACKEND_H

#include "../plan/plan.h"

/* The buffers of a plan: one arena and, per planned value, a tensor over its block. */
typedef struct kiln_plan_memory {
    char *arena;
    kiln_tensor **planned; /* per value: its tensor over the arena, or NULL (not planned) */
} kiln_plan_memory;

typedef struct kiln_backend {
    const char *name;
    /* state for running plan over mem (both outlive the state) */
    kiln_status (*prepare)(const kiln_plan *plan, kiln_plan_memory *mem, void **state);
    /* inputs bound (metas must match); outputs are new references */
    kiln_status (*run)(void *state, int nin, kiln_tensor *const *in, int nout, kiln_tensor **out);
    /* results written into the caller's contiguous buffers into[] (the graph's output metas; none may
     * share memory with an input or a capture) */
    kiln_status (*run_into)(void *state, int nin, kiln_tensor *const *in, int nout, kiln_tensor *const *into);
    void (*free)(void *state);
    /* prepare for a binding of a symbolic plan (kiln_executable_bind): *memo (NULL at first; the
     * caller's, freed by free_memo) holds what the backend kept of the code generated for an earlier
     * binding of the same plan, reused where it fits and replaced where not (NULL: prepare serves) */
    kiln_status (*prepare_bound)(const kiln_plan *plan, kiln_plan_memory *mem, void **memo, void **state);
    void (*free_memo)(void *memo);
    bool (*is_native)(const void *state);         /* runs generated native code (NULL: never) */
    int64_t (*fallback_calls)(const void *state); /* calls it handed to kernel by kernel (NULL: none) */
} kiln_backend;

extern const kiln_backend kiln_backend_kbk;
extern const kiln_backend kiln_backend_sink;

/* The registered backend called name (src/runtime/registry.c; the list is backends.def), the first
 * registered (kbk) for NULL; NULL with a KILN_ERR_VALUE error naming the registered ones when
 * none is called so. */
const kiln_backend *kiln_backend_find(const char *name);

/* A compiled graph over a plan it does not own (nested control-flow bodies: the enclosing plan
 * owns theirs). */
kiln_status kiln_executable_from_plan(const kiln_plan *p, const kiln_backend *be, kiln_executable **out);
const kiln_plan *kiln_executable_plan(const kiln_executable *e);
/* What the compiled bindings of one symbolic plan (one backend) share: the arena, sized by the
 * largest binding seen, and what the backend kept of the code it generated (prepare_bound). */
typedef struct kiln_bindings kiln_bindings;
kiln_status kiln_bindings_new(kiln_bindings **out);
void kiln_bindings_free(kiln_bindings *b); /* executables made with it keep what they use */
size_t kiln_bindings_arena_bytes(const kiln_bindings *b);

/* A compiled graph of one binding of symbolic plan p (kiln_plan_bind: nothing planned again), run by
 * backend be. With shared NULL it has its own arena, sized for the binding, and its backend prepared
 * as for any plan. Else its buffers live in shared's arena, grown when this binding needs more (a new
 * arena of this binding's size serves it and later ones; executables made before keep the one they
 * have until freed), and its backend is prepared from the code generated for an earlier binding
 * where that fits (no code generated: the sink's function takes the sizes from its environment).
 * Executables sharing an arena run one at a time (kiln_executable_run takes its lock), so a new
 * binding runs in memory the earlier ones already touched. */
kiln_status kiln_executable_bind(const kiln_plan *p, const int64_t *bindings, const kiln_backend *be,
                                 kiln_bindings *shared, kiln_executable **out);

/* kiln_executable_run writing its results into into[] (see kiln_backend.run_into). */
kiln_status kiln_executable_run_into(kiln_executable *e, int nin, kiln_tensor *const *inputs, int nout,
                                     kiln_tensor *const *into);

/* The tensor a call hands out for a graph output t whose storage comes from value root: t itself
 * (a new reference), or a private copy when t views a compile-time constant (never the graph's). */
kiln_status kiln_output_hand_out(const kiln_value *root, kiln_tensor *t, kiln_tensor **out);
/* The error for inputs that do not match the graph (KILN_OK when they do). Inline: every run checks. */
static inline kiln_status kiln_check_inputs(const kiln_graph *g, int nin, kiln_tensor *const *inputs, int nout) {
    if (nin != g->ninputs || nout != g->noutputs)
        return kiln_error(KILN_ERR_VALUE, "graph: expected %d inputs and %d outputs, got %d and %d", g->ninputs,
                          g->noutputs, nin, nout);
    for (int k = 0; k < nin; k++) {
        const kiln_meta *want = &g->values[g->inputs[k]].meta;
        if (!kiln_meta_equal(want, &inputs[k]->meta)) {
            char a[160], b[160];
            return kiln_error(KILN_ERR_VALUE, "graph: input %d is %s %s, the graph was compiled for %s %s", k,
                              kiln_dtype_name(inputs[k]->meta.dtype), kiln_shape_str(&inputs[k]->meta, a, sizeof a),
                              kiln_dtype_name(want->dtype), kiln_shape_str(want, b, sizeof b));
        }
    }
    return KILN_OK;
}

#endif
