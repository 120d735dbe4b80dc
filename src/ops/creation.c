/* Creation ops (no tensor inputs): full, arange, linspace, eye, rand, randn. Random values
 * come from counter-based streams (core/random.h): element i always gets draw base + i, so
 * results are the same for any number of threads. */
#include <math.h>

#include "../core/internal.h"
#include "../core/random.h"

/* ---- helpers ---------------------------------------------------------------------------- */

static kiln_status check_dtype(const char *op, int64_t dtype) {
    if (dtype < 0 || dtype >= KILN_DTYPE_COUNT)
        return kiln_error(KILN_ERR_TYPE, "%s: invalid dtype %lld", op, (long long)dtype);
    return KILN_OK;
}

/* float -> integer that is defined for every input: NaN -> 0, saturating (as kiln_copy_into). */
static inline int64_t saturate_int(double v, double lo, double hi) {
    if (v != v) return 0;
    if (v <= lo) return (int64_t)lo;
    if (v >= hi) return (int64_t)hi;
    return (int64_t)v;
}

/* Stores v, converted to d, at element i of p. */
static inline void store_value(void *p, kiln_dtype d, int64_t i, double v) {
    switch (d) {
    case KILN_DTYPE_BOOL: ((uint8_t *)p)[i] = v != 0; break;
    case KILN_DTYPE_INT8: ((int8_t *)p)[i] = (int8_t)saturate_int(v, -128, 127); break;
    case KILN_DTYPE_INT32: ((int32_t *)p)[i] = (int32_t)saturate_int(v, -2147483648.0, 2147483647.0); break;
    case KILN_DTYPE_INT64: ((int64_t *)p)[i] = saturate_int(v, -9223372036854775808.0, 9223372036854774784.0); break;
    case KILN_DTYPE_FLOAT16: ((uint16_t *)p)[i] = kiln_f32_to_f16((float)v); break;
    case KILN_DTYPE_BFLOAT16: ((uint16_t *)p)[i] = kiln_f32_to_bf16((float)v); break;
    case KILN_DTYPE_FLOAT32: ((float *)p)[i] = (float)v; break;
    case KILN_DTYPE_FLOAT64: ((double *)p)[i] = v; break;
    default: break;
    }
}

static inline void store_int(void *p, kiln_dtype d, int64_t i, int64_t v) {
    switch (d) {
    case KILN_DTYPE_BOOL: ((uint8_t *)p)[i] = v != 0; break;
    case KILN_DTYPE_INT8: ((int8_t *)p)[i] = (int8_t)(v < -128 ? -128 : v > 127 ? 127 : v); break;
    case KILN_DTYPE_INT32: ((int32_t *)p)[i] = (int32_t)(v < INT32_MIN ? INT32_MIN : v > INT32_MAX ? INT32_MAX : v); break;
    case KILN_DTYPE_INT64: ((int64_t *)p)[i] = v; break;
    default: store_value(p, d, i, (double)v); break;
    }
}

/* Fills n elements of `size` bytes with the bit pattern at `value`. */
static void fill_pattern(void *dst, int64_t n, const void *value, size_t size) {
    if (size == 1) {
        memset(dst, *(const uint8_t *)value, (size_t)n);
        return;
    }
#define FILL_CASE(T)                                                                          \
    {                                                                                         \
        T v, *o = dst;                                                                        \
        memcpy(&v, value, sizeof v);                                                          \
        if (n < KILN_PARALLEL_MIN) {                                                          \
            for (int64_t i = 0; i < n; i++) o[i] = v;                                         \
        } else {                                                                              \
            _Pragma("omp parallel for schedule(static)") for (int64_t i = 0; i < n; i++) o[i] = v; \
        }                                                                                     \
        break;                                                                                \
    }
    switch (size) {
    case 2: FILL_CASE(uint16_t)
    case 4: FILL_CASE(uint32_t)
    default: FILL_CASE(uint64_t)
    }
#undef FILL_CASE
}

/* ---- full, rand, randn: i[0] = dtype, i[1] = ndim, i[2..] = shape ---------------------- */

KILN_INFER(full) {
    (void)nin;
    const char *op = "full/rand/randn";
    KILN_TRY(kiln_attrs_expect(op, a, 2, 1));
    KILN_TRY(check_dtype(op, a->i[0]));
    int64_t nd = a->i[1];
    if (nd < 0 || nd > KILN_MAX_DIMS)
        return kiln_error(KILN_ERR_VALUE, "%s: ndim must be in [0, %d], got %lld", op, KILN_MAX_DIMS, (long long)nd);
    if (a->ni < 2 + nd)
        return kiln_error(KILN_ERR_VALUE, "%s: expected %lld shape attributes, got %d", op, (long long)nd, a->ni - 2);
    int64_t n;
    kiln_status s = kiln_shape_numel_checked((int)nd, a->i + 2, &n);
    if (s != KILN_OK) return kiln_error_context(s, "%s", op);
    kiln_meta_set(out, (kiln_dtype)a->i[0], (int)nd, a->i + 2);
    return KILN_OK;
}

KILN_KERNEL(full) {
    kiln_tensor *o = out[0];
    uint64_t value = 0;
    store_value(&value, o->meta.dtype, 0, a->f[0]);
    if (o->numel == 1)
        memcpy(o->data, &value, kiln_dtype_size(o->meta.dtype));
    else
        fill_pattern(o->data, o->numel, &value, kiln_dtype_size(o->meta.dtype));
    return KILN_OK;
}

/* Bits of uniform precision per float dtype: every value is then exact in the dtype and, on
 * [0, 1), strictly below 1. */
static int uniform_bits(kiln_dtype d) {
    switch (d) {
    case KILN_DTYPE_FLOAT16: return 11;
    case KILN_DTYPE_BFLOAT16: return 8;
    case KILN_DTYPE_FLOAT32: return 24;
    default: return 53;
    }
}

__extension__ typedef unsigned __int128 u128;

KILN_KERNEL(rand) {
    kiln_tensor *o = out[0];
    if (a->nf < 2) return kiln_error(KILN_ERR_VALUE, "rand: expected 2 float attributes (low, high), got %d", a->nf);
    double low = a->f[0], high = a->f[1];
    if (!(low <= high) || !isfinite(low) || !isfinite(high))
        return kiln_error(KILN_ERR_VALUE, "rand: expected finite low <= high, got [%g, %g)", low, high);
    kiln_dtype dt = o->meta.dtype;
    int64_t n = o->numel;
    kiln_random_stream s = kiln_random_reserve((uint64_t)n);
    if (!kiln_dtype_is_float(dt)) { /* integers: uniform on [low, high) as randint */
        if (low != floor(low) || high != floor(high) || fabs(low) > 0x1.0p62 || fabs(high) > 0x1.0p62)
            return kiln_error(KILN_ERR_VALUE, "rand: %s needs integer bounds within +-2^62, got [%g, %g)",
                              kiln_dtype_name(dt), low, high);
        int64_t lo = (int64_t)low;
        uint64_t range = (uint64_t)(high - low);
#pragma omp parallel for schedule(static) if (n >= KILN_PARALLEL_MIN)
        for (int64_t i = 0; i < n; i++) {
            int64_t v = range ? lo + (int64_t)(((u128)kiln_random_bits(&s, (uint64_t)i) * range) >> 64) : lo;
            store_int(o->data, dt, i, v);
        }
        return KILN_OK;
    }
    int bits = uniform_bits(dt);
    double scale = ldexp(1.0, -bits), width = high - low;
    if (dt == KILN_DTYPE_FLOAT32) {
        float *p = o->data, flow = (float)low, fwidth = (float)width, below = nextafterf((float)high, -INFINITY);
#pragma omp parallel for schedule(static) if (n >= KILN_PARALLEL_MIN)
        for (int64_t i = 0; i < n; i++) {
            float u = (float)(kiln_random_bits(&s, (uint64_t)i) >> 40) * 0x1.0p-24f;
            float v = flow + u * fwidth;
            p[i] = v < (float)high || width == 0 ? v : below;
        }
        return KILN_OK;
    }
    double below = nextafter(high, -INFINITY);
#pragma omp parallel for schedule(static) if (n >= KILN_PARALLEL_MIN)
    for (int64_t i = 0; i < n; i++) {
        double u = (double)(kiln_random_bits(&s, (uint64_t)i) >> (64 - bits)) * scale;
        double v = low + u * width;
        store_value(o->data, dt, i, v < high || width == 0 ? v : below);
    }
    return KILN_OK;
}

/* Box-Muller: pair j fills elements 2j and 2j + 1. float32 and the half types use one 64-bit
 * draw per pair (32 bits for the radius, 24 for the angle), float64 two draws. */
KILN_KERNEL(randn) {
    kiln_tensor *o = out[0];
    kiln_dtype dt = o->meta.dtype;
    if (!kiln_dtype_is_float(dt))
        return kiln_error(KILN_ERR_TYPE, "randn: dtype %s is not a floating-point type", kiln_dtype_name(dt));
    if (a->nf < 2) return kiln_error(KILN_ERR_VALUE, "randn: expected 2 float attributes (mean, std), got %d", a->nf);
    double mean = a->f[0], std = a->f[1];
    if (!(std >= 0)) return kiln_error(KILN_ERR_VALUE, "randn: std must be >= 0, got %g", std);
    int64_t n = o->numel, pairs = (n + 1) / 2;
    if (dt == KILN_DTYPE_FLOAT64) {
        kiln_random_stream s = kiln_random_reserve(2 * (uint64_t)pairs);
        double *p = o->data;
#pragma omp parallel for schedule(static) if (n >= KILN_PARALLEL_MIN / 4)
        for (int64_t j = 0; j < pairs; j++) {
            double u1 = 1.0 - kiln_random_to_unit(kiln_random_bits(&s, 2 * (uint64_t)j));
            double u2 = kiln_random_to_unit(kiln_random_bits(&s, 2 * (uint64_t)j + 1));
            double r = std * sqrt(-2.0 * log(u1)), t = 6.283185307179586 * u2;
            p[2 * j] = mean + r * cos(t);
            if (2 * j + 1 < n) p[2 * j + 1] = mean + r * sin(t);
        }
        return KILN_OK;
    }
    kiln_random_stream s = kiln_random_reserve((uint64_t)pairs);
    float fmean = (float)mean, fstd = (float)std;
#pragma omp parallel for schedule(static) if (n >= KILN_PARALLEL_MIN / 4)
    for (int64_t j = 0; j < pairs; j++) {
        uint64_t b = kiln_random_bits(&s, (uint64_t)j);
        float u1 = (float)((b >> 32) + 1) * 0x1.0p-32f; /* (0, 1] */
        float u2 = (float)((uint32_t)b >> 8) * 0x1.0p-24f;
        float r = fstd * sqrtf(-2.0f * logf(u1)), t = 6.2831853f * u2;
        float z0 = fmean + r * cosf(t), z1 = fmean + r * sinf(t);
        if (dt == KILN_DTYPE_FLOAT32) {
            float *p = o->data;
            p[2 * j] = z0;
            if (2 * j + 1 < n) p[2 * j + 1] = z1;
        } else {
            store_value(o->data, dt, 2 * j, z0);
            if (2 * j + 1 < n) store_value(o->data, dt, 2 * j + 1, z1);
        }
    }
    return KILN_OK;
}

/* ---- arange, linspace: i[0] = dtype, i[1] = count, f[0] = start, f[1] = step / stop ------ */

KILN_INFER(arange) {
    (void)nin;
    const char *op = "arange/linspace";
    KILN_TRY(kiln_attrs_expect(op, a, 2, 2));
    KILN_TRY(check_dtype(op, a->i[0]));
    if (a->i[1] < 0) return kiln_error(KILN_ERR_VALUE, "%s: count must be >= 0, got %lld", op, (long long)a->i[1]);
    if (!isfinite(a->f[0]) || !isfinite(a->f[1]))
        return kiln_error(KILN_ERR_VALUE, "%s: start and step/stop must be finite, got %g and %g", op, a->f[0], a->f[1]);
    out->dtype = (kiln_dtype)a->i[0];
    out->ndim = 1;
    out->shape[0] = a->i[1];
    int64_t n;
    kiln_status s = kiln_shape_numel_checked(1, out->shape, &n);
    return s == KILN_OK ? KILN_OK : kiln_error_context(s, "%s", op);
}

KILN_KERNEL(arange) {
    kiln_tensor *o = out[0];
    kiln_dtype dt = o->meta.dtype;
    int64_t n = o->numel;
    double start = a->f[0], step = a->f[1];
    bool exact_ints = !kiln_dtype_is_float(dt) && start == floor(start) && step == floor(step) &&
                      fabs(start) < 0x1.0p62 && fabs(step) < 0x1.0p62 && fabs(start + step * (double)n) < 0x1.0p62;
    if (exact_ints) { /* integer arithmetic: exact past 2^53 */
        int64_t s0 = (int64_t)start, st = (int64_t)step;
#pragma omp parallel for schedule(static) if (n >= KILN_PARALLEL_MIN)
        for (int64_t i = 0; i < n; i++) store_int(o->data, dt, i, s0 + i * st);
    } else if (dt == KILN_DTYPE_FLOAT32) {
        float *p = o->data;
#pragma omp parallel for schedule(static) if (n >= KILN_PARALLEL_MIN)
        for (int64_t i = 0; i < n; i++) p[i] = (float)(start + (double)i * step);
    } else {
#pragma omp parallel for schedule(static) if (n >= KILN_PARALLEL_MIN)
        for (int64_t i = 0; i < n; i++) store_value(o->data, dt, i, start + (double)i * step);
    }
    return KILN_OK;
}

/* Symmetric formula (as PyTorch): the first half counts up from start, the second down from
 * stop, so both ends are exact. */
KILN_KERNEL(linspace) {
    kiln_tensor *o = out[0];
    kiln_dtype dt = o->meta.dtype;
    int64_t n = o->numel, half = n == 1 ? 1 : n / 2; /* count 1: start */
    double start = a->f[0], stop = a->f[1];
    double step = n > 1 ? (stop - start) / (double)(n - 1) : 0.0;
#pragma omp parallel for schedule(static) if (n >= KILN_PARALLEL_MIN)
    for (int64_t i = 0; i < n; i++) {
        double v = i < half ? start + step * (double)i : stop - step * (double)(n - 1 - i);
        store_value(o->data, dt, i, v);
    }
    return KILN_OK;
}

/* ---- eye: i[0] = dtype, i[1] = rows, i[2] = columns --------------------------------------- */

KILN_INFER(eye) {
    (void)nin;
    KILN_TRY(kiln_attrs_expect("eye", a, 3, 0));
    KILN_TRY(check_dtype("eye", a->i[0]));
    if (a->i[1] < 0 || a->i[2] < 0)
        return kiln_error(KILN_ERR_VALUE, "eye: rows and columns must be >= 0, got %lld and %lld", (long long)a->i[1],
                          (long long)a->i[2]);
    out->dtype = (kiln_dtype)a->i[0];
    out->ndim = 2;
    out->shape[0] = a->i[1];
    out->shape[1] = a->i[2];
    int64_t n;
    kiln_status s = kiln_shape_numel_checked(2, out->shape, &n);
    return s == KILN_OK ? KILN_OK : kiln_error_context(s, "eye");
}

KILN_KERNEL(eye) {
    kiln_tensor *o = out[0];
    int64_t rows = o->meta.shape[0], cols = o->meta.shape[1], diag = rows < cols ? rows : cols;
    memset(o->data, 0, (size_t)o->numel * kiln_dtype_size(o->meta.dtype));
    for (int64_t k = 0; k < diag; k++) store_value(o->data, o->meta.dtype, k * cols + k, 1.0);
    return KILN_OK;
}
