/* Optimizer updates, in place on (param, grad, state...): PyTorch's SGD and Adam (with AMSGrad).
 *
 * Parameters and state tensors must be contiguous float32 or float64 of one dtype and shape;
 * the gradient may have any layout and float dtype (it is converted to the parameter's).
 * Kernels write in[0] and the state tensors, bump their versions and return in[0] as out[0].
 * Each element is updated independently, so results do not depend on the thread count.
 * The learning rate is attribute f[0], or an optional last input: a 1-element float tensor read
 * when the update runs (a schedule computed in a compiled training step from its step count). */
#include <math.h>

#include "../core/internal.h"

/* nin: the op's inputs without a learning-rate tensor; given one more, check that it is one. */
static kiln_status check_lr_input(const char *op, kiln_tensor *const *in, int nin, int base) {
    if (nin != base && nin != base + 1)
        return kiln_error(KILN_ERR_TYPE, "%s: expected %d tensor inputs (%d with a learning-rate tensor), got %d", op,
                          base, base + 1, nin);
    if (nin == base + 1 && (!kiln_dtype_is_float(in[base]->meta.dtype) || in[base]->numel != 1)) {
        char buf[160];
        return kiln_error(KILN_ERR_TYPE, "%s: the learning rate must be a 1-element float tensor, got %s %s", op,
                          kiln_dtype_name(in[base]->meta.dtype), kiln_shape_str(&in[base]->meta, buf, sizeof buf));
    }
    return KILN_OK;
}

/* The learning rate: the tensor after the base inputs when given (>= 0), else attribute f[0]. */
static kiln_status learning_rate(const char *op, kiln_tensor *const *in, int nin, int base, const kiln_attrs *a,
                                 double *lr) {
    *lr = nin > base ? kiln_tensor_get_double(in[base], 0) : a->f[0];
    if (!(*lr >= 0)) return kiln_error(KILN_ERR_VALUE, "%s: the learning rate must be >= 0, got %g", op, *lr);
    return KILN_OK;
}

static kiln_status check_state(const char *op, const char *what, const kiln_tensor *p, const kiln_tensor *t) {
    const kiln_meta *pm = &p->meta, *m = &t->meta;
    bool same = pm->ndim == m->ndim && pm->dtype == m->dtype;
    for (int d = 0; same && d < pm->ndim; d++) same = pm->shape[d] == m->shape[d];
    if (!same) {
        char a[160], b[160];
        return kiln_error(KILN_ERR_VALUE, "%s: %s must match the parameter, got %s %s for a %s parameter of shape %s", op,
                          what, kiln_dtype_name(m->dtype), kiln_shape_str(m, a, sizeof a), kiln_dtype_name(pm->dtype),
                          kiln_shape_str(pm, b, sizeof b));
    }
    return KILN_OK;
}

static kiln_status check_update(const char *op, kiln_tensor *const *in, int nstate, const char *const *names,
                                const kiln_attrs *a, int ni, int nf) {
    KILN_TRY(kiln_attrs_expect(op, a, ni, nf));
    const kiln_meta *pm = &in[0]->meta;
    if (pm->dtype != KILN_DTYPE_FLOAT32 && pm->dtype != KILN_DTYPE_FLOAT64)
        return kiln_error(KILN_ERR_TYPE, "%s: parameters must be float32 or float64, got %s", op, kiln_dtype_name(pm->dtype));
    const kiln_meta *gm = &in[1]->meta;
    bool same = gm->ndim == pm->ndim && kiln_dtype_is_float(gm->dtype);
    for (int d = 0; same && d < pm->ndim; d++) same = gm->shape[d] == pm->shape[d];
    if (!same) {
        char sa[160], sb[160];
        return kiln_error(KILN_ERR_VALUE, "%s: the gradient (%s %s) must be a float tensor of the parameter's shape %s", op,
                          kiln_dtype_name(gm->dtype), kiln_shape_str(gm, sa, sizeof sa), kiln_shape_str(pm, sb, sizeof sb));
    }
    for (int k = 0; k < nstate; k++) KILN_TRY(check_state(op, names[k], in[0], in[2 + k]));
    return KILN_OK;
}

/* The step counter: a contiguous 1-element int64 tensor (the last input). */
static kiln_status check_step(const char *op, const kiln_tensor *step) {
    if (step->meta.dtype != KILN_DTYPE_INT64 || step->numel != 1) {
        char buf[160];
        return kiln_error(KILN_ERR_TYPE, "%s: step must be a 1-element int64 tensor, got %s %s", op,
                          kiln_dtype_name(step->meta.dtype), kiln_shape_str(&step->meta, buf, sizeof buf));
    }
    return KILN_OK;
}

/* Increments the step counter; the new count, or an error for a negative counter. */
static kiln_status next_step(const char *op, kiln_tensor *step, int64_t *count) {
    int64_t *c = step->data;
    if (*c < 0 || *c == INT64_MAX)
        return kiln_error(KILN_ERR_VALUE, "%s: the step counter holds %lld; it counts updates from 0", op, (long long)*c);
    *c += 1;
    kiln_tensor_bump_version(step);
    *count = *c;
    return KILN_OK;
}

/* The parameter and the optimizer state in[0..n) (but the gradient, in[1]) and the step counter
 * in[step] are written in place: contiguous and writable. */
static kiln_status check_writable(const char *op, kiln_tensor *const *in, int n, int step) {
    for (int k = 0; k < n; k++) {
        if (k == 1) continue; /* the gradient is only read */
        const char *what = k == 0 ? "the parameter" : "the optimizer state";
        if (!kiln_tensor_is_contiguous(in[k]))
            return kiln_error(KILN_ERR_VALUE, "%s: %s must be contiguous to be updated in place", op, what);
        KILN_TRY(kiln_check_writable(op, what, in[k]));
    }
    return kiln_check_writable(op, "the step counter", in[step]);
}

/* ---- sgd ----------------------------------------------------------------------------------
 * d = g + weight_decay * p
 * with momentum: buf = momentum * buf + (1 - dampening) * d; d = nesterov ? d + momentum * buf : buf
 * p -= lr * d
 * On the first step (t == 1) buf = d, as in PyTorch. Without momentum, buf is neither read nor
 * checked. */

KILN_INFER(sgd_update) {
    static const char *const names[] = {"the momentum buffer"};
    KILN_TRY(check_lr_input("sgd_update", in, nin, 4));
    KILN_TRY(check_update("sgd_update", in, a->nf >= 2 && a->f[1] != 0.0 ? 1 : 0, names, a, 1, 4));
    KILN_TRY(check_step("sgd_update", in[3]));
    if (a->f[1] < 0 || a->f[3] < 0 || a->f[2] < 0)
        return kiln_error(KILN_ERR_VALUE, "sgd_update: momentum, weight_decay and dampening must be >= 0, got %g, %g, %g",
                          a->f[1], a->f[2], a->f[3]);
    if (a->i[0] && (a->f[1] <= 0 || a->f[3] != 0))
        return kiln_error(KILN_ERR_VALUE, "sgd_update: nesterov needs momentum > 0 and dampening = 0");
    out[0] = in[0]->meta;
    return KILN_OK;
}

#define SGD_LOOP(T)                                                                           \
    do {                                                                                      \
        T *restrict p = in[0]->data, *restrict buf = momentum != 0 ? in[2]->data : NULL;      \
        const T *restrict g = grad->data;                                                     \
        const T lr = (T)lr_value, mom = (T)momentum, wd = (T)a->f[2], damp = (T)(1 - dampening); \
        const bool nesterov = a->i[0] != 0;                                                   \
        _Pragma("omp parallel for schedule(static) if (n >= KILN_PARALLEL_MIN)")              \
        for (int64_t i = 0; i < n; i++) {                                                     \
            T d = g[i] + wd * p[i];                                                           \
            if (buf) {                                                                        \
                T b = mom * buf[i] + damp * d;                                                \
                buf[i] = b;                                                                   \
                d = nesterov ? d + mom * b : b;                                               \
            }                                                                                 \
            p[i] -= lr * d;                                                                   \
        }                                                                                     \
    } while (0)

KILN_KERNEL(sgd_update) {
    double momentum = a->f[1], lr_value;
    KILN_TRY(learning_rate("sgd_update", in, nin, 4, a, &lr_value));
    KILN_TRY(check_writable("sgd_update", in, momentum != 0 ? 3 : 1, 3));
    int64_t t = 0;
    KILN_TRY(next_step("sgd_update", in[3], &t));
    double dampening = t == 1 ? 0.0 : a->f[3];
    kiln_tensor *grad;
    KILN_TRY(kiln_to_contiguous(in[1], in[0]->meta.dtype, &grad));
    int64_t n = in[0]->numel;
    if (in[0]->meta.dtype == KILN_DTYPE_FLOAT64)
        SGD_LOOP(double);
    else
        SGD_LOOP(float);
    kiln_tensor_release(grad);
    kiln_tensor_bump_version(in[0]);
    if (momentum != 0) kiln_tensor_bump_version(in[2]);
    kiln_tensor_retain(in[0]);
    out[0] = in[0];
    return KILN_OK;
}

/* ---- adam ---------------------------------------------------------------------------------
 * g += weight_decay * p (L2); m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2
 * p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps), t = step (1-based)
 * AMSGrad (adam_amsgrad_update, one more state tensor vmax before the step counter):
 * vmax = max(vmax, v) and sqrt(vmax) instead of sqrt(v), as PyTorch's amsgrad=True (vmax holds
 * the largest v, not bias-corrected). The two ops share everything below; nstate is 2 or 3. */

static kiln_status adam_infer(const char *op, kiln_tensor *const *in, int nin, const kiln_attrs *a, int nstate,
                              kiln_meta *out) {
    static const char *const names[] = {"the first moment m", "the second moment v", "the largest second moment vmax"};
    KILN_TRY(check_lr_input(op, in, nin, 3 + nstate));
    KILN_TRY(check_update(op, in, nstate, names, a, 0, 5));
    KILN_TRY(check_step(op, in[2 + nstate]));
    if (!(a->f[1] >= 0 && a->f[1] < 1 && a->f[2] >= 0 && a->f[2] < 1))
        return kiln_error(KILN_ERR_VALUE, "%s: betas must be in [0, 1), got %g and %g", op, a->f[1], a->f[2]);
    if (!(a->f[3] >= 0) || !(a->f[4] >= 0))
        return kiln_error(KILN_ERR_VALUE, "%s: eps and weight_decay must be >= 0, got %g and %g", op, a->f[3], a->f[4]);
    out[0] = in[0]->meta;
    return KILN_OK;
}

KILN_INFER(adam_update) { return adam_infer("adam_update", in, nin, a, 2, out); }
KILN_INFER(adam_amsgrad_update) { return adam_infer("adam_amsgrad_update", in, nin, a, 3, out); }

/* vmax is NULL for plain Adam. */
#define ADAM_LOOP(T, SQRT)                                                                    \
    do {                                                                                      \
        T *restrict p = in[0]->data, *restrict m = in[2]->data, *restrict v = in[3]->data;    \
        T *restrict vmax = amsgrad ? in[4]->data : NULL;                                      \
        const T *restrict g = grad->data;                                                     \
        const T b1 = (T)beta1, b2 = (T)beta2, eps = (T)a->f[3], wd = (T)a->f[4];              \
        const T c1 = (T)(1 - beta1), c2 = (T)(1 - beta2); /* 1 - b2 in T is 1e-5 off */      \
        const T step_size = (T)(lr_value / bc1), inv_bc2_sqrt = (T)(1 / sqrt(bc2));           \
        _Pragma("omp parallel for schedule(static) if (n >= KILN_PARALLEL_MIN)")              \
        for (int64_t i = 0; i < n; i++) {                                                     \
            T gi = g[i] + wd * p[i];                                                          \
            T mi = b1 * m[i] + c1 * gi;                                                       \
            T vi = b2 * v[i] + c2 * gi * gi;                                                  \
            m[i] = mi;                                                                        \
            v[i] = vi;                                                                        \
            if (vmax) {                                                                       \
                vi = vmax[i] > vi ? vmax[i] : vi;                                             \
                vmax[i] = vi;                                                                 \
            }                                                                                 \
            p[i] -= step_size * mi / (SQRT(vi) * inv_bc2_sqrt + eps);                         \
        }                                                                                     \
    } while (0)

static kiln_status adam_kernel(const char *op, kiln_tensor *const *in, int nin, const kiln_attrs *a, int nstate,
                               kiln_tensor **out) {
    const bool amsgrad = nstate == 3;
    double lr_value;
    KILN_TRY(learning_rate(op, in, nin, 3 + nstate, a, &lr_value));
    KILN_TRY(check_writable(op, in, 2 + nstate, 2 + nstate));
    int64_t t = 0;
    KILN_TRY(next_step(op, in[2 + nstate], &t));
    double beta1 = a->f[1], beta2 = a->f[2], step = (double)t;
    double bc1 = 1 - pow(beta1, step), bc2 = 1 - pow(beta2, step);
    kiln_tensor *grad;
    KILN_TRY(kiln_to_contiguous(in[1], in[0]->meta.dtype, &grad));
    int64_t n = in[0]->numel;
    if (in[0]->meta.dtype == KILN_DTYPE_FLOAT64)
        ADAM_LOOP(double, sqrt);
    else
        ADAM_LOOP(float, sqrtf);
    kiln_tensor_release(grad);
    for (int k = 0; k < 2 + nstate; k++)
        if (k != 1) kiln_tensor_bump_version(in[k]);
    kiln_tensor_retain(in[0]);
    out[0] = in[0];
    return KILN_OK;
}

KILN_KERNEL(adam_update) { return adam_kernel("adam_update", in, nin, a, 2, out); }
KILN_KERNEL(adam_amsgrad_update) { return adam_kernel("adam_amsgrad_update", in, nin, a, 3, out); }
