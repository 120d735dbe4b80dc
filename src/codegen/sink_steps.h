/* The steps of a sunk graph: what src/runtime/sink.c prepares and runs, and what
 * src/codegen/emit_graph.c turns into one C function. */
#ifndef KILN_SINK_STEPS_H
#define KILN_SINK_STEPS_H

#include "codegen.h"
#include "fused.h"

#define KILN_SINK_MAX_OPERANDS 33 /* a fused group's output and up to 32 inputs, as generated kernels take */

typedef enum kiln_sink_step_kind {
    KILN_SINK_KERNEL,       /* out = kernel(in): outputs are the pre-made tensors; a lone elementwise node
                               whose generated loop is exact runs that loop when `native` */
    KILN_SINK_MUTATES,      /* kernel writes in[0] in place (its returned reference is dropped); version bumped */
    KILN_SINK_RESHAPE_COPY, /* a reshape whose input layout needs a copy: in[0]'s elements into out, row-major */
    KILN_SINK_FUSED,        /* a fused group: an inlined generated loop when `native`, else kiln_fused_run */
    KILN_SINK_VIEW,         /* a view made at bind time: nothing runs (present only to poison buffers after it) */
} kiln_sink_step_kind;

typedef struct kiln_sink_step {
    kiln_sink_step_kind kind;
    int32_t node;
    int32_t nin, nout;
    const int32_t *in; /* value ids (the graph's) */
    int32_t out[KILN_MAX_OUTPUTS];
    kiln_fused_kernel *fused;
    /* native fused loop: the kernel's C source and name, and its loop over the fixed layouts (byte
     * strides st[op * KILN_MAX_DIMS + d], op 0 the output, 1 + k input k; the generated function reads
     * shape and st through the environment, so its code is the same at any sizes); `loaded`: the same kernel
     * already loaded in this process (built for the plan's fused group), called through the
     * environment instead of compiled into the graph's function again */
    bool native;
    char *source;
    char symbol[48];
    kiln_fused_fn loaded;
    int ndim;
    int8_t inner[KILN_SINK_MAX_OPERANDS]; /* how each operand moves along the inner axis (KILN_INNER_*) */
    int64_t shape[KILN_MAX_DIMS];
    int64_t *st;
    const int32_t *poison_after; /* debug: values whose buffers are poisoned after the step (-1 ended), or NULL */
} kiln_sink_step;

/* The environment the generated function reads: the same text is compiled into sink.c and
 * emitted ahead of the generated code, with STATUS kiln_status there and int here (the same ABI). */
#define KILN_SINK_ENV_BODY(STATUS)                                                                   \
    kiln_tensor **t;                                                                                 \
    char **d;                                                                                        \
    STATUS (*const *k)(kiln_tensor *const *, int, const kiln_attrs *, kiln_tensor **);              \
    const kiln_attrs *const *a;                                                                      \
    void *const *fk;                                                                                 \
    void (*const *gf)(char *const *, int, const int64_t *, const int64_t *);                         \
    STATUS (*fused_run)(void *, int, kiln_tensor *const *, kiln_tensor *);                           \
    STATUS (*reshape_copy)(kiln_tensor *, kiln_tensor *);                                            \
    void (*release)(kiln_tensor *);                                                                  \
    void (*bump)(kiln_tensor *);                                                                     \
    void (*poison)(kiln_tensor *);                                                                   \
    const int64_t *const *shp;   /* per step: a native loop's sizes (ndim of them), else NULL */     \
    const int64_t *const *str;   /* per step: its byte strides (see kiln_sink_step.st), else NULL */ \
    const volatile int *stop;    /* nonzero: an interrupt was requested (checked before steps) */    \
    STATUS (*interrupted)(void); /* then: its status on this thread (0: go on) */                    \
    int step;

typedef struct kiln_sink_env {
    KILN_SINK_ENV_BODY(kiln_status)
} kiln_sink_env;

/* The generated entry point: 0 when every step ran, else the failing status with env->step set. */
typedef int (*kiln_sink_fn)(kiln_sink_env *env);

/* C source of the function running `steps` in order (emit_graph.c); its name goes to symbol
 * (kiln_sink_<16 hex digits>, a hash of the code). *source is malloc'd. */
kiln_status kiln_sink_emit(const kiln_graph *g, const kiln_sink_step *steps, int32_t nsteps, char **source,
                           char symbol[48]);

#endif
