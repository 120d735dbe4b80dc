/* kiln_apply: the one dispatcher. Checks arguments, infers output metas, allocates outputs,
 * runs the kernel and records the op for the tracer and autograd (through their hooks). */
#include "../core/internal.h"
#include "../core/hooks.h"
#include "../core/profile.h"
#include "footprint.h"

static const kiln_attrs no_attrs;

kiln_status kiln_infer(kiln_op op, int nin, kiln_tensor *const *in, const kiln_attrs *attrs,
                       kiln_meta *out) {
    if ((unsigned)op >= KILN_OP_COUNT) return kiln_error(KILN_ERR_VALUE, "unknown op %d", (int)op);
    const kiln_op_info *info = &kiln_op_table[op];
    if (info->nin != KILN_VARIADIC && nin != info->nin)
        return kiln_error(KILN_ERR_TYPE, "%s: expected %d tensor inputs, got %d", info->name, info->nin, nin);
    for (int k = 0; k < nin; k++)
        if (!in[k]) return kiln_error(KILN_ERR_TYPE, "%s: input %d is missing", info->name, k);
    kiln_status s = info->infer(in, nin, attrs ? attrs : &no_attrs, out);
    if (s != KILN_OK && info->fusion == KILN_FUSE_ELEMENTWISE) kiln_error_context(s, "%s", info->name);
    return s;
}

/* Marks op's float outputs derived from integers only (amp keeps them float32: src/ops/amp.c). */
static void mark_exact(kiln_op op, int nin, kiln_tensor *const *in, const kiln_attrs *attrs, int nout,
                       kiln_tensor **out) {
    kiln_dtype small_d[8];
    bool small_e[8];
    if (nin > 8) return; /* no integer-only op takes so many */
    for (int k = 0; k < nin; k++) small_d[k] = in[k]->meta.dtype, small_e[k] = in[k]->amp_exact || in[k]->literal;
    bool exact = kiln_amp_output_exact(op, attrs, nin, small_d, small_e);
    for (int k = 0; k < nout; k++)
        if (out[k] && kiln_dtype_is_float(out[k]->meta.dtype)) out[k]->amp_exact = exact;
}

static kiln_status apply_plain(kiln_op op, int nin, kiln_tensor *const *in, const kiln_attrs *attrs,
                               kiln_tensor **out) {
    kiln_meta metas[KILN_MAX_OUTPUTS];
    if (!attrs) attrs = &no_attrs;
    KILN_TRY(kiln_infer(op, nin, in, attrs, metas));
    const kiln_op_info *info = &kiln_op_table[op];
    int nout = kiln_op_nout(op, attrs);
    for (int k = 0; k < nout; k++) out[k] = NULL;
    kiln_status s = KILN_OK;
    if (!(info->flags & (KILN_OPF_VIEW | KILN_OPF_MUTATES))) {
        for (int k = 0; k < nout && s == KILN_OK; k++) s = kiln_tensor_empty_like_meta(&metas[k], &out[k]);
    }
    if (s == KILN_OK && kiln_thread.trace_active && (info->flags & (KILN_OPF_MUTATES | KILN_OPF_WRITES_ANY)) &&
        kiln_hooks.trace_before_write)
        kiln_hooks.trace_before_write(op, nin, in);
    if (s == KILN_OK) {
        if (kiln_profiling()) {
            char where[512];
            const char *loc = kiln_profile_eager_loc ? kiln_profile_eager_loc(where, sizeof where) : NULL;
            int64_t start = kiln_profile_begin();
            s = info->kernel(in, nin, attrs, out);
            kiln_profile_op_info what = {.source = KILN_PROFILE_EAGER, .op = op, .attrs = attrs, .node = -1, .flops = -1,
                                         .loc = loc};
            kiln_profile_tensors(&what, nin, in, nout, out, start);
        } else {
            s = info->kernel(in, nin, attrs, out);
        }
    }
    if (s != KILN_OK) {
        kiln_release_all(out, nout);
        return s;
    }
    if (info->flags & KILN_OPF_MUTATES) kiln_tensor_bump_version(in[0]);
    else mark_exact(op, nin, in, attrs, nout, out);
    /* before autograd: the aliases it saves of the outputs must map to the recorded values */
    if (kiln_thread.trace_active) kiln_hooks.trace_record(op, nin, in, attrs, nout, out);
    /* An op without a gradient rule is recorded too when its inputs require grad: its rule
     * (kiln_grad_none) raises when a gradient reaches it. Left off the tape, its outputs would be
     * constants and a gradient through them silently zero (a second derivative through tanh's
     * backward op). In-place updates and effects stay off: nothing differentiates through them. */
    bool recorded = info->grad != kiln_grad_none ||
                    !(info->flags & (KILN_OPF_MUTATES | KILN_OPF_WRITES_ANY | KILN_OPF_EFFECT));
    if (!kiln_thread.grad_disabled && recorded) {
        bool any = false;
        for (int k = 0; k < nin; k++) any |= in[k]->requires_grad;
        if (any) {
            s = kiln_hooks.autograd_record(op, nin, in, attrs, nout, out);
            if (s != KILN_OK) kiln_release_all(out, nout);
        }
    }
    return s;
}

/* Under amp: each input cast (by the cast op, so traced and differentiated) to the dtype the op's
 * KILN_AMP class gives it, then the op. */
static kiln_status apply_amp(kiln_op op, int nin, kiln_tensor *const *in, const kiln_attrs *attrs, kiln_tensor **out) {
    kiln_amp_level level = (kiln_amp_level)kiln_thread.amp_level;
    kiln_dtype low = (kiln_dtype)kiln_thread.amp_low;
    kiln_tensor *small[16], **cast = nin <= 16 ? small : kiln_calloc((size_t)nin, sizeof *cast);
    if (!cast) return kiln_error(KILN_ERR_MEMORY, "out of memory casting inputs for amp");
    bool any = false;
    kiln_status s = KILN_OK;
    for (int k = 0; k < nin; k++) cast[k] = NULL;
    for (int k = 0; k < nin && s == KILN_OK; k++) {
        kiln_tensor *t = in[k];
        if (!t) continue;
        bool leaf = t->requires_grad && !t->grad_fn;
        kiln_dtype want = kiln_amp_input_dtype(op, k, level, low, t->meta.dtype, leaf, t->amp_exact);
        if (want == t->meta.dtype) continue;
        kiln_attrs a = {0};
        kiln_attrs_push_int(&a, want);
        s = apply_plain(KILN_OP_CAST, 1, &t, &a, &cast[k]);
        any = true;
    }
    if (s == KILN_OK) {
        if (any) {
            for (int k = 0; k < nin; k++)
                if (!cast[k] && in[k]) kiln_tensor_retain(cast[k] = in[k]);
            s = apply_plain(op, nin, cast, attrs, out);
        } else {
            s = apply_plain(op, nin, in, attrs, out);
        }
    }
    for (int k = 0; k < nin; k++) kiln_tensor_release(cast[k]);
    if (cast != small) free(cast);
    return s;
}

kiln_status kiln_apply(kiln_op op, int nin, kiln_tensor *const *in, const kiln_attrs *attrs,
                       kiln_tensor **out) {
    if (kiln_thread.amp_level && op != KILN_OP_CAST) return apply_amp(op, nin, in, attrs, out);
    return apply_plain(op, nin, in, attrs, out);
}

kiln_status kiln_apply1(kiln_op op, kiln_tensor *a, const kiln_attrs *attrs, kiln_tensor **out) {
    return kiln_apply(op, 1, &a, attrs, out);
}

kiln_status kiln_apply2(kiln_op op, kiln_tensor *a, kiln_tensor *b, const kiln_attrs *attrs,
                        kiln_tensor **out) {
    kiln_tensor *in[2] = {a, b};
    return kiln_apply(op, 2, in, attrs, out);
}
