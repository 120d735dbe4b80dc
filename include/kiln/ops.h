/* kiln — the op table and the one dispatcher.
 *
 * Every op is declared once, in src/ops/ops.def; this header turns that list into the
 * kiln_op enum and describes the per-op facts every layer reads (kiln_op_info).
 */
#ifndef KILN_OPS_H
#define KILN_OPS_H

#include "kiln/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum kiln_op {
#define KILN_OP(ENUM, name, nin, nout, fusion, flags, infer, kernel, grad, cexpr) KILN_OP_##ENUM,
#include "ops.def" /* src/ops/ops.def, on the include path */
#undef KILN_OP
    KILN_OP_COUNT
} kiln_op;

#define KILN_MAX_ATTR_INTS 40
#define KILN_MAX_ATTR_FLOATS 8
/* Control-flow nodes return their branches' / loop's values; the cost of the bound is in
 * kiln_node.out and stack arrays of metas (32 * 72 bytes). */
#define KILN_MAX_OUTPUTS 32
#define KILN_VARIADIC (-1)

/* Non-tensor arguments of an op. Each op declares its layout in ops.def (KILN_ATTRS), which
 * kiln/op_attrs.h turns into named indices (KILN_A_REDUCE_KEEPDIMS, ...). */
typedef struct kiln_attrs {
    int32_t ni, nf;
    int64_t i[KILN_MAX_ATTR_INTS];
    double f[KILN_MAX_ATTR_FLOATS];
} kiln_attrs;

#include "op_attrs.h"

typedef enum kiln_fusion {
    KILN_FUSE_ELEMENTWISE, /* out[i] = expr(in[i]...) after broadcasting; has a C expression */
    KILN_FUSE_REDUCTION,
    KILN_FUSE_VIEW,        /* output aliases input 0 */
    KILN_FUSE_OPAQUE,
} kiln_fusion;

enum kiln_op_flags {
    KILN_OPF_VIEW = 1 << 0,         /* kernel creates out[0] as a view of in[0] */
    KILN_OPF_MUTATES = 1 << 1,      /* kernel writes in[0] in place and returns it as out[0] */
    KILN_OPF_RANDOM = 1 << 2,       /* draws from the global generator */
    KILN_OPF_SAVE_INPUTS = 1 << 3,  /* the gradient rule reads the input values */
    KILN_OPF_SAVE_OUTPUTS = 1 << 4, /* the gradient rule reads the output values */
    KILN_OPF_CONTROL = 1 << 5,      /* runs subgraphs named by attrs (ops.def: if, while); nout in KILN_A_CONTROL_NOUT */
    KILN_OPF_EFFECT = 1 << 6,       /* observable when it runs (print): kept, never merged, order kept */
    KILN_OPF_COMMUTATIVE = 1 << 7,  /* its two inputs may be swapped: same result, shape and dtype */
    /* its attributes hold sizes taken from tensor shapes (a target shape, slice lengths, the
     * shape a backward op produces, a fused group's or a loop gradient's subgraph shapes): a graph
     * rebound to other input shapes (kiln_graph_rebind) must be given them anew, never keep them */
    KILN_OPF_SIZED = 1 << 29,
    /* the inputs it writes in place (KILN_OPF_WRITES_INPUT) are optional running state that,
     * while attribute i[0] is nonzero (training), its outputs never read: given empty tensors
     * there it writes nothing and computes the same outputs (batch_norm's running statistics),
     * which is how recomputation runs it again (src/passes/recompute.c) */
    KILN_OPF_OPTIONAL_STATE = 1 << 30,
    /* math functions the C expression calls (costly per element; codegen's prelude has
     * vectorizable float32 exp, log, erf and tanh) */
    KILN_OPF_EXP = 1 << 24,
    KILN_OPF_LOG = 1 << 25,
    KILN_OPF_ERF = 1 << 26,
    KILN_OPF_TANH = 1 << 27,
    KILN_OPF_LIBM = 1 << 28, /* other libm functions: sqrt, sin, cos, pow, tan, atan2, ... */
};
/* attribute i[0] is the output's kiln_dtype (cast, creation ops); a define: an enum constant is an int */
#define KILN_OPF_DTYPE_ATTR (1u << 31)
/* out[0] is 1-D and holds its inputs' elements one after the other (a gradient bucket); the
 * kernel works in place when it finds its inputs already laid out there, contiguous and in
 * order, so the memory planner may place them so (src/plan/plan.c). Beyond 32 bits: flags is
 * a uint64_t. */
#define KILN_OPF_JOINS_INPUTS (1ull << 32)
/* With SAVE_INPUTS on a two-input op: each input is read only for the other input's gradient
 * (mul: d/da = g*b, d/db = g*a), so the autograd engine saves it only when the other input
 * requires grad. `y[:, 1] *= 3` then changes y in place without invalidating a saved copy that
 * no gradient would read. */
#define KILN_OPF_CROSS_SAVED (1ull << 33)
/* The kernel refuses some input values: an index out of range (gather, index_put, ...), a label
 * outside the classes. Eagerly the error comes at the op's statement; in a graph it comes when
 * the graph runs, out of reach of a try/except around the statement (a trace or ast capture
 * through user code with an `except` clause then runs eagerly: kiln.jit.capture_core). */
#define KILN_OPF_CHECKS_VALUES (1ull << 34)
#define KILN_OPF_MATH (KILN_OPF_EXP | KILN_OPF_LOG | KILN_OPF_ERF | KILN_OPF_TANH | KILN_OPF_LIBM)
/* With SAVE_INPUTS: input k (< 8) is not saved, e.g. state the op updates in place and the
 * gradient rule never reads (batch_norm's running statistics). */
#define KILN_OPF_UNSAVED_INPUT(k) (1u << (8 + (k)))
/* The kernel writes input k (< 8) in place: an effect passes and schedules must keep in order
 * (MUTATES ops also return input 0; batch_norm updates its running statistics). */
#define KILN_OPF_WRITES_INPUT(k) (1u << (16 + (k)))
#define KILN_OPF_WRITES_ANY (0xffu << 16)
/* Running it twice, or not at all, is visible: in-place writes, draws from the generator,
 * printing and checks. Such nodes are kept, never merged, and kept in order. */
#define KILN_OPF_SIDE_EFFECTS (KILN_OPF_MUTATES | KILN_OPF_RANDOM | KILN_OPF_WRITES_ANY | KILN_OPF_EFFECT)
/* Every flag its own bit (bits 0-7 named above, 8-15 unsaved inputs, 16-23 written inputs). */
#define KILN_OPF_HIGH_BITS_ \
    (KILN_OPF_MATH | KILN_OPF_SIZED | KILN_OPF_OPTIONAL_STATE | KILN_OPF_DTYPE_ATTR | KILN_OPF_JOINS_INPUTS | \
     KILN_OPF_CROSS_SAVED | KILN_OPF_CHECKS_VALUES)
_Static_assert(0xffffffull + KILN_OPF_EXP + KILN_OPF_LOG + KILN_OPF_ERF + KILN_OPF_TANH + KILN_OPF_LIBM + KILN_OPF_SIZED +
                       KILN_OPF_OPTIONAL_STATE + KILN_OPF_DTYPE_ATTR + KILN_OPF_JOINS_INPUTS + KILN_OPF_CROSS_SAVED +
                       KILN_OPF_CHECKS_VALUES ==
                   (0xffffffull | KILN_OPF_HIGH_BITS_),
               "two op flags share a bit");

struct kiln_grad_ctx;
typedef kiln_status (*kiln_infer_fn)(kiln_tensor *const *in, int nin, const kiln_attrs *a,
                                     kiln_meta *out);
/* Outputs arrive allocated and contiguous (shape from infer), except for VIEW and MUTATES
 * ops whose kernel sets out[0] itself (a new reference). Inputs may have any strides. */
typedef kiln_status (*kiln_kernel_fn)(kiln_tensor *const *in, int nin, const kiln_attrs *a,
                                      kiln_tensor **out);
/* gout[k] may be NULL (that output got no gradient); sets gin[j] (new reference) for each
 * input with ctx->needs_grad[j], else leaves NULL. Emits ops through kiln_apply only. */
typedef kiln_status (*kiln_grad_fn)(const struct kiln_grad_ctx *ctx, kiln_tensor *const *gout,
                                    kiln_tensor **gin);

/* Forward mode (ops.def KILN_JVP): the tangents of the op's outputs from its inputs' tangents.
 * ctx holds every input and output (ctx->in, ctx->out, never NULL here); ctx->needs_grad[j] tells
 * whether input j has a tangent (tin[j] non-NULL, of input j's meta). Sets tout[k] (new reference,
 * output k's meta) or leaves it NULL (a zero tangent). Emits ops through kiln_apply only, so a
 * traced run records them (src/ir/jvp.c). */
typedef kiln_status (*kiln_jvp_fn)(const struct kiln_grad_ctx *ctx, kiln_tensor *const *tin,
                                   kiln_tensor **tout);

typedef struct kiln_op_info {
    const char *name;
    int nin;  /* KILN_VARIADIC: checked by infer */
    int nout;
    kiln_fusion fusion;
    uint64_t flags;
    kiln_infer_fn infer;
    kiln_kernel_fn kernel;
    kiln_grad_fn grad;   /* kiln_grad_none: not differentiable */
    const char *c_expr; /* elementwise ops: C expression over a, b, c (see ops.def); else NULL */
} kiln_op_info;

/* What a gradient rule sees. in/out hold the saved tensors (detached) when the op's flags ask
 * for them, else NULL; their metas are always available. */
typedef struct kiln_grad_ctx {
    kiln_op op;
    int nin, nout;
    kiln_tensor *const *in;
    kiln_tensor *const *out;
    const kiln_meta *in_meta;
    const kiln_meta *out_meta;
    const kiln_attrs *attrs;
    const bool *needs_grad; /* per input */
} kiln_grad_ctx;

/* Sentinel gradient rule of ops that are not differentiable (ops.def `none`). */
KILN_API kiln_status kiln_grad_none(const kiln_grad_ctx *ctx, kiln_tensor *const *gout,
                                    kiln_tensor **gin);
KILN_API bool kiln_op_differentiable(kiln_op op);

KILN_API extern const kiln_op_info kiln_op_table[KILN_OP_COUNT];
/* The op's forward-mode rule (ops.def KILN_JVP), or NULL when it has none (src/ops/jvp_rules.c). */
KILN_API kiln_jvp_fn kiln_op_jvp(kiln_op op);
KILN_API const kiln_op_info *kiln_op_get(kiln_op op);
/* Number of outputs of op with these attrs (control-flow ops carry it: KILN_A_CONTROL_NOUT). */
static inline int kiln_op_nout(kiln_op op, const kiln_attrs *attrs) {
    int n = kiln_op_table[op].nout;
    return n != KILN_VARIADIC ? n : (int)kiln_attr_int(attrs, KILN_A_CONTROL_NOUT, 0);
}
static inline bool kiln_op_has_side_effects(kiln_op op) {
    return (kiln_op_table[op].flags & KILN_OPF_SIDE_EFFECTS) != 0;
}
/* Whether op's C expression calls a math function (exp, log, erf, ...). */
static inline bool kiln_op_calls_math(kiln_op op) { return (kiln_op_table[op].flags & KILN_OPF_MATH) != 0; }
/* KILN_OP_COUNT when unknown. */
KILN_API kiln_op kiln_op_from_name(const char *name);

/* The one dispatcher: eager execution, autograd recording (and, later, tracing) meet here.
 * Writes the op's nout outputs as new references. */
KILN_API kiln_status kiln_apply(kiln_op op, int nin, kiln_tensor *const *in,
                                const kiln_attrs *attrs, kiln_tensor **out);
/* Shape/dtype inference only. */
KILN_API kiln_status kiln_infer(kiln_op op, int nin, kiln_tensor *const *in,
                                const kiln_attrs *attrs, kiln_meta *out);

/* Mixed precision: the classes of ops.def's KILN_AMP lines and the levels of kiln.amp (documented
 * there; src/ops/amp.c). While the thread's level (kiln_amp_set) is not O0, kiln_apply casts each
 * input to the dtype kiln_amp_input_dtype gives before the kernel (the casts are ops: traced and
 * differentiated like any other); gradient rules run without it. */
typedef enum kiln_amp_class { KILN_AMP_PROMOTE = 0, KILN_AMP_LOW, KILN_AMP_FP32, KILN_AMP_ACCUM } kiln_amp_class;
typedef enum kiln_amp_level { KILN_AMP_O0 = 0, KILN_AMP_O1, KILN_AMP_O2, KILN_AMP_O3 } kiln_amp_level;
KILN_API kiln_amp_class kiln_amp_class_of(kiln_op op);
/* The dtype input k (of dtype d) of op runs in at `level` with low dtype `low`: d where unchanged.
 * leaf: a parameter (a leaf that requires grad; in a graph, an input or capture); exact: a value
 * derived from integers only (kiln_amp_output_exact), never narrowed but by a LOW op. */
KILN_API kiln_dtype kiln_amp_input_dtype(kiln_op op, int k, kiln_amp_level level, kiln_dtype low, kiln_dtype d,
                                         bool leaf, bool exact);
/* Whether op's float outputs are derived from integers only, given whether each input is (a
 * non-float input counts as such): arange with integer start and step, full of an integer value, a
 * cast from an integer or bool dtype, and ops of class PROMOTE or ACCUM whose float inputs all are. */
KILN_API bool kiln_amp_output_exact(kiln_op op, const kiln_attrs *attrs, int nin, const kiln_dtype *in_dtype,
                                    const bool *in_exact);
/* The thread's amp level and low dtype (bfloat16 or float16; float32 with O3 runs every float op in
 * float32: Cell.to_float(float32)); the previous ones in *prev_level, *prev_low when not NULL. */
KILN_API kiln_status kiln_amp_set(kiln_amp_level level, kiln_dtype low, kiln_amp_level *prev_level,
                                  kiln_dtype *prev_low);
KILN_API void kiln_amp_get(kiln_amp_level *level, kiln_dtype *low);

/* Convenience wrappers over kiln_apply for single-output ops. */
KILN_API kiln_status kiln_apply1(kiln_op op, kiln_tensor *a, const kiln_attrs *attrs,
                                 kiln_tensor **out);
KILN_API kiln_status kiln_apply2(kiln_op op, kiln_tensor *a, kiln_tensor *b,
                                 const kiln_attrs *attrs, kiln_tensor **out);

#ifdef __cplusplus
}
#endif
#endif
