/* Mixed precision: which dtype each input of an op runs in under amp, from ops.def's KILN_AMP
 * lines (their classes and the levels are documented there), and the thread's amp setting that
 * kiln_apply reads. The eager dispatcher (dispatch.c) and the amp graph pass (src/passes/amp.c)
 * both decide through kiln_amp_input_dtype, so a graph the pass rewrites and a recording of eager
 * amp hold the same casts. */
#include <math.h>

#include "../core/internal.h"
#include "../core/hooks.h"

static const unsigned char amp_classes[KILN_OP_COUNT] = {
#define KILN_OP(...)
#define KILN_AMP(ENUM, cls) [KILN_OP_##ENUM] = KILN_AMP_##cls,
#include "ops.def"
#undef KILN_AMP
#undef KILN_OP
};

kiln_amp_class kiln_amp_class_of(kiln_op op) {
    return (unsigned)op < KILN_OP_COUNT ? (kiln_amp_class)amp_classes[op] : KILN_AMP_PROMOTE;
}

static bool amp_float(kiln_dtype d) {
    return d == KILN_DTYPE_FLOAT32 || d == KILN_DTYPE_FLOAT16 || d == KILN_DTYPE_BFLOAT16;
}

/* Ops whose inputs amp never touches: casts themselves, in-place updates, effects, control flow. */
static bool amp_untouched(kiln_op op) {
    return op == KILN_OP_CAST || (kiln_op_table[op].flags & (KILN_OPF_MUTATES | KILN_OPF_EFFECT | KILN_OPF_CONTROL));
}

kiln_dtype kiln_amp_input_dtype(kiln_op op, int k, kiln_amp_level level, kiln_dtype low, kiln_dtype d, bool leaf,
                                bool exact) {
    if (level == KILN_AMP_O0 || (unsigned)op >= KILN_OP_COUNT || !amp_float(d) || amp_untouched(op)) return d;
    if (k < 32 && (kiln_op_table[op].flags & KILN_OPF_WRITES_INPUT(k))) return d; /* written in place */
    kiln_amp_class c = kiln_amp_class_of(op);
    if (c == KILN_AMP_LOW) return low;
    if (exact) return d;
    if (level == KILN_AMP_O3) return low;
    if (c == KILN_AMP_FP32 || (c == KILN_AMP_ACCUM && level == KILN_AMP_O1)) return KILN_DTYPE_FLOAT32;
    /* PROMOTE, and ACCUM at O2: their inputs' dtype, a float32 parameter cast at O2 */
    return level == KILN_AMP_O2 && leaf && d == KILN_DTYPE_FLOAT32 ? low : d;
}

static bool integral(double v) { return isfinite(v) && v == floor(v); }

bool kiln_amp_output_exact(kiln_op op, const kiln_attrs *attrs, int nin, const kiln_dtype *in_dtype,
                           const bool *in_exact) {
    if ((unsigned)op >= KILN_OP_COUNT) return false;
    if (op == KILN_OP_ARANGE)
        return attrs && integral(kiln_attr_float(attrs, KILN_A_ARANGE_START, 0.5)) &&
               integral(kiln_attr_float(attrs, KILN_A_ARANGE_STEP, 0.5));
    if (op == KILN_OP_FULL) /* a Python number made a tensor (1.0 / x) */
        return attrs && integral(kiln_attr_float(attrs, KILN_A_FULL_VALUE, 0.5));
    if (op == KILN_OP_CAST) return nin == 1 && (!kiln_dtype_is_float(in_dtype[0]) || in_exact[0]);
    if (nin == 0 || amp_untouched(op)) return false;
    kiln_amp_class c = kiln_amp_class_of(op);
    if (c == KILN_AMP_LOW || c == KILN_AMP_FP32) return false;
    bool any_float = false;
    for (int k = 0; k < nin; k++) {
        if (!kiln_dtype_is_float(in_dtype[k])) continue;
        if (!in_exact[k]) return false;
        any_float = true;
    }
    return any_float;
}

kiln_status kiln_amp_set(kiln_amp_level level, kiln_dtype low, kiln_amp_level *prev_level, kiln_dtype *prev_low) {
    if (level < KILN_AMP_O0 || level > KILN_AMP_O3)
        return kiln_error(KILN_ERR_VALUE, "amp level must be O0, O1, O2 or O3, got %d", (int)level);
    if (level != KILN_AMP_O0 && !amp_float(low))
        return kiln_error(KILN_ERR_TYPE, "amp: the low-precision dtype must be bfloat16 or float16 (or float32), got %s",
                          kiln_dtype_name(low));
    if (prev_level) *prev_level = (kiln_amp_level)kiln_thread.amp_level;
    if (prev_low) *prev_low = (kiln_dtype)kiln_thread.amp_low;
    kiln_thread.amp_level = (int8_t)level;
    kiln_thread.amp_low = (int8_t)(level == KILN_AMP_O0 ? 0 : low);
    return KILN_OK;
}

void kiln_amp_get(kiln_amp_level *level, kiln_dtype *low) {
    if (level) *level = (kiln_amp_level)kiln_thread.amp_level;
    if (low) *low = (kiln_dtype)kiln_thread.amp_low;
}
