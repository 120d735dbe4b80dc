/* kiln's Winograd convolution F(m x m, 3 x 3) (Lavin & Gray, "Fast Algorithms for
 * Convolutional Neural Networks", 2016), float32, for conv2d_fused in inference graphs on CPUs
 * where oneDNN has no Winograd (it has one for AVX-512 only).
 *
 * Each output tile of m x m pixels is computed from an input tile of a x a (a = m + 2):
 *   Y = A^T [ sum_c (G g_oc G^T) .* (B^T d_c B) ] A
 * so the a*a products of each (tile, input channel, output channel) replace 9*m*m
 * multiply-adds: the sum over c is, for each of the a*a positions xi, one GEMM
 *   M[xi] (tiles x O) = V[xi] (tiles x C) @ U[xi] (C x O).
 * F(4x4, 3x3) is used: 36 products for 144 multiply-adds (4x fewer) against F(2x2, 3x3)'s 16
 * for 36 (2.25x). On this file's first machine (2-core AMD EPYC 7003, AVX2, under load) one
 * 128-channel 64x64 convolution took 8.4-11 ms of CPU time with F(4x4) and 13.4-16 ms with
 * F(2x2) (same code, transforms from the tables, OpenBLAS GEMMs; oneDNN's direct kernel:
 * 13.3 ms): F(2x2) barely beats the direct kernel. F(4x4)'s error is larger (its transforms
 * hold 4, 5, 8 and 1/24): measured up to 1.7e-6 of the sum of the magnitudes of the terms
 * of an output, about 10x a direct convolution's; the tests bound it by 1e-5.
 *
 * The fast kernel: U is computed once per weight values and kept, keyed by the bytes of the
 * weights (like the oneDNN path's Winograd weights: the folded batch-norm weights of an
 * inference graph are recomputed by the graph on every call, with the same values; a memcmp
 * of the weights costs far less than their transform), packed in panels of WINO_COLS output
 * channels. Each kept entry holds 5x the bytes of its weights (the copy, and U: 36 values per
 * 9 weights) for the life of the process, up to WINO_CACHE entries, least recently used
 * replaced. The tiles are processed in blocks of WINO_TILES, one block per thread at a time
 * (OpenMP): input transform into V (WINO_LANES channels at a time: one AVX2 vector, kept
 * contiguous by the blocked and NHWC layouts), the 36 GEMMs by a register-blocked kernel over
 * the packed U, output transform with the epilogue applied as each tile is written. Inputs
 * or weights holding NaN, infinities or huge values are declined (wino_tame). */
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <pthread.h>

#include "conv_winograd.h"
#include "conv_winograd_cost.h"
#include "isa_dispatch.h"

#define WINO_M 4                      /* output tile */
#define WINO_A (WINO_M + 2)           /* input tile */
#define WINO_XI (WINO_A * WINO_A)     /* products per tile: one GEMM each */
#define WINO_LANES 8                  /* channels transformed together */
#define WINO_ROWS 6                   /* tiles per step of the GEMM kernel */
#define WINO_COLS 16                  /* output channels per step of the GEMM kernel (a panel of U) */
#define WINO_TILES (6 * WINO_ROWS)    /* tiles per block (V and M of a block: 36 * 36 * 128 floats each) */
#define WINO_CACHE 32                 /* transformed weights kept (a ResNet-50 has 16 3x3 convolutions) */

/* Lavin's matrices for F(4x4, 3x3), points 0, 1, -1, 2, -2 and infinity. */
static const float wino_BT[WINO_A][WINO_A] = {
    {4, 0, -5, 0, 1, 0}, {0, -4, -4, 1, 1, 0}, {0, 4, -4, -1, 1, 0},
    {0, -2, -1, 2, 1, 0}, {0, 2, -1, -2, 1, 0}, {0, 4, 0, -5, 0, 1},
};
static const float wino_G[WINO_A][3] = {
    {1.0f / 4, 0, 0},
    {-1.0f / 6, -1.0f / 6, -1.0f / 6},
    {-1.0f / 6, 1.0f / 6, -1.0f / 6},
    {1.0f / 24, 1.0f / 12, 1.0f / 6},
    {1.0f / 24, -1.0f / 12, 1.0f / 6},
    {0, 0, 1},
};
static const float wino_AT[WINO_M][WINO_A] = {
    {1, 1, 1, 1, 1, 0}, {0, 1, -1, 2, -2, 0}, {0, 1, 1, 4, 4, 0}, {0, 1, -1, 8, -8, 1},
};

/* ---- the epilogue's activations: the expressions of ops.def, over a float array ---------- */

typedef void (*wino_act_fn)(float *v, int64_t n, double f0, double f1);

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wbool-operation"
#pragma GCC diagnostic ignored "-Wfloat-conversion"
#pragma GCC diagnostic ignored "-Wint-in-bool-context"
#pragma GCC diagnostic ignored "-Wabsolute-value"
#define WINO_IF_KILN_FUSE_ELEMENTWISE(...) __VA_ARGS__
#define WINO_IF_KILN_FUSE_REDUCTION(...)
#define WINO_IF_KILN_FUSE_VIEW(...)
#define WINO_IF_KILN_FUSE_OPAQUE(...)
#define WINO_UNARY_1(...) __VA_ARGS__
#define WINO_UNARY_2(...)
#define WINO_UNARY_3(...)
#define KILN_OP(ENUM, name_, nin, nout, fusion, flags, infer, kernel, grad, cexpr)          \
    WINO_IF_##fusion(WINO_UNARY_##nin(                                                    \
        static void wino_act_##kernel(float *v, int64_t n, double f0, double f1) {           \
            typedef float T;                                                              \
            (void)f0, (void)f1;                                                           \
            for (int64_t i = 0; i < n; i++) {                                             \
                T a = v[i];                                                               \
                v[i] = (T)(cexpr);                                                        \
            }                                                                             \
        }))
#include "ops.def"
#undef KILN_OP
#pragma GCC diagnostic pop

/* The array form of every unary elementwise op, by op (NULL for the others). */
static const wino_act_fn wino_acts[KILN_OP_COUNT] = {
#define KILN_OP(ENUM, name_, nin, nout, fusion, flags, infer, kernel, grad, cexpr)          \
    WINO_IF_##fusion(WINO_UNARY_##nin([KILN_OP_##ENUM] = wino_act_##kernel, ))
#include "ops.def"
#undef KILN_OP
};

/* The activation of ep as an array function, or NULL for none. */
static wino_act_fn wino_activation(const kiln_conv_epilogue *ep) {
    return ep->activation == KILN_CONV_ACT_NONE ? NULL : wino_acts[kiln_conv_activation_ops[ep->activation]];
}

/* ---- geometry ------------------------------------------------------------------------------ */

/* Element offsets in an activation tensor of C channels, H x W, in one kiln_conv_layout:
 * (n, c, h, w) is at n*n_ + (c / blk)*cb + (c % blk)*c_ + h*h_ + w*w_. */
typedef struct {
    int64_t n, cb, c, h, w, blk;
} wino_layout;

static wino_layout wino_layout_of(int64_t layout, int64_t C, int64_t H, int64_t W) {
    int64_t b = kiln_conv_layout_block((kiln_conv_layout)layout);
    if (b) return (wino_layout){C * H * W, H * W * b, 1, W * b, b, b};
    if (layout == KILN_CONV_NHWC) return (wino_layout){H * W * C, 0, 1, W * C, C, C};
    return (wino_layout){C * H * W, 0, H * W, W, 1, C};
}

static inline int64_t wino_coff(const wino_layout *l, int64_t c) { return c / l->blk * l->cb + c % l->blk * l->c; }

bool kiln_conv_winograd_fits(const kiln_conv_params *p, const kiln_conv_epilogue *ep) {
    return ep && p->KH == 3 && p->KW == 3 && p->sh == 1 && p->sw == 1 && p->dh == 1 && p->dw == 1 && p->groups == 1 &&
           p->N > 0 && p->C > 0 && p->O > 0 && p->OH > 0 && p->OW > 0;
}

/* Where Winograd beats oneDNN's direct AVX2 kernel, measured on this file's first machine
 * (CPU time of one thread, C = O channels, S x S images, blocked layout; ratios direct /
 * Winograd): it wins from 16 channels (C 16: 1.5-2.1 at 8x8 and 16x16; C 8: 0.77 at 32x32)
 * and 64 output pixels (one 4x4 tile of 64 channels: 0.88), and while the transformed
 * weights, read once per block of tiles, are not many times the work on the tiles:
 * 36 * C * O floats for few tiles run at the speed of memory (7x7 with C 256: 0.55, with C
 * 128: 1.85; 14x14 with C 256: 1.45). Hence: at most WINO_MAX_U_PER_TILE bytes of U per tile. */
#define WINO_MIN_CHANNELS 16
#define WINO_MIN_PIXELS 64
#define WINO_MAX_U_PER_TILE (1 << 20)

bool kiln_conv_winograd_chosen(const kiln_conv_params *p, const kiln_conv_epilogue *ep) {
    if (!kiln_conv_winograd_fits(p, ep) || !ep->winograd || kiln_conv_block_size() == 16) return false;
    int64_t tiles = p->N * ((p->OH + WINO_M - 1) / WINO_M) * ((p->OW + WINO_M - 1) / WINO_M);
    double u_bytes = (double)sizeof(float) * WINO_XI * (double)p->C * (double)p->O;
    return p->C >= WINO_MIN_CHANNELS && p->O >= WINO_MIN_CHANNELS && p->N * p->OH * p->OW >= WINO_MIN_PIXELS &&
           u_bytes <= (double)WINO_MAX_U_PER_TILE * (double)tiles;
}

/* ---- transforms -------------------------------------------------------------------------- */

/* u = G g G^T for one 3x3 filter g. */
static void wino_filter(const float *g, float u[WINO_A][WINO_A]) {
    float t[WINO_A][3];
    for (int i = 0; i < WINO_A; i++)
        for (int l = 0; l < 3; l++) {
            float s = 0;
            for (int k = 0; k < 3; k++) s += wino_G[i][k] * g[k * 3 + l];
            t[i][l] = s;
        }
    for (int i = 0; i < WINO_A; i++)
        for (int j = 0; j < WINO_A; j++) {
            float s = 0;
            for (int l = 0; l < 3; l++) s += t[i][l] * wino_G[j][l];
            u[i][j] = s;
        }
}


/* ---- transformed weights, kept per weight values ------------------------------------------ */

/* Output-channel panels of U: O / WINO_COLS rounded up (the last one padded with zeros). */
static int64_t wino_panels(int64_t O) { return (O + WINO_COLS - 1) / WINO_COLS; }

/* Where U[xi][c][o] is kept: for each xi, panels of WINO_COLS output channels, each C rows of
 * WINO_COLS contiguous values (the order the GEMM kernel reads them in). */
static inline int64_t wino_u_at(int64_t C, int64_t O, int xi, int64_t c, int64_t o) {
    return ((xi * wino_panels(O) + o / WINO_COLS) * C + c) * WINO_COLS + o % WINO_COLS;
}

typedef struct {
    int64_t O, C;
    float *w;  /* the weights transformed (a copy), O x C x 3 x 3 */
    float *u;  /* U[xi][c][o], packed (wino_u_at) */
    bool tame; /* every weight wino_tame */
    uint64_t last_use;
} wino_weights;

static pthread_mutex_t wino_lock = PTHREAD_MUTEX_INITIALIZER;
static int64_t wino_count; /* convolutions run (kiln_conv_winograd_count) */
static wino_weights wino_cache[WINO_CACHE];
static uint64_t wino_clock;
static float *wino_scratch;
static size_t wino_scratch_size;

/* Whether every value of v[0..n) is a number of magnitude below 2^64. Winograd mixes the
 * values of a whole input tile in its transforms, so a NaN or infinity would reach outputs
 * that do not depend on it (inf - inf), and huge values could overflow where the direct
 * convolution does not; such operands go to the direct kernel, which keeps NaN where the
 * rules of the other kernels put it. */
static bool wino_tame(const float *v, int64_t n) {
    int wild = 0;
#pragma omp parallel for reduction(| : wild) schedule(static) if (n >= KILN_PARALLEL_MIN)
    for (int64_t i = 0; i < n; i++) wild |= !(fabsf(v[i]) < 0x1p64f);
    return !wild;
}

/* U for the weights w of p: the kept one when w holds the same values, else made (under
 * wino_lock); *tame tells whether every weight is wino_tame. */
static kiln_status wino_weights_get(const kiln_conv_params *p, const float *w, const float **u, bool *tame) {
    size_t wbytes = sizeof(float) * (size_t)(p->O * p->C * 9);
    int slot = 0;
    for (int i = 0; i < WINO_CACHE; i++) {
        wino_weights *e = &wino_cache[i];
        if (e->u && e->O == p->O && e->C == p->C && !memcmp(e->w, w, wbytes)) {
            e->last_use = ++wino_clock;
            *u = e->u, *tame = e->tame;
            return KILN_OK;
        }
        if (!e->u || (wino_cache[slot].u && e->last_use < wino_cache[slot].last_use)) slot = i;
    }
    wino_weights *e = &wino_cache[slot];
    kiln_free(e->w), kiln_free(e->u);
    *e = (wino_weights){.O = p->O, .C = p->C};
    e->w = kiln_alloc(wbytes);
    e->u = kiln_alloc(sizeof(float) * WINO_XI * (size_t)(p->C * wino_panels(p->O) * WINO_COLS));
    if (!e->w || !e->u) {
        kiln_free(e->w), kiln_free(e->u);
        *e = (wino_weights){0};
        return kiln_error(KILN_ERR_MEMORY, "conv2d_fused: out of memory for the Winograd weights (%lld x %lld)",
                          (long long)p->O, (long long)p->C);
    }
    memcpy(e->w, w, wbytes);
    int64_t O = p->O, C = p->C;
    float *U = e->u;
    memset(U, 0, sizeof(float) * WINO_XI * (size_t)(C * wino_panels(O) * WINO_COLS)); /* the last panel's padding */
#pragma omp parallel for schedule(static) if (O * C >= 1024)
    for (int64_t o = 0; o < O; o++)
        for (int64_t c = 0; c < C; c++) {
            float t[WINO_A][WINO_A];
            wino_filter(w + (o * C + c) * 9, t);
            for (int xi = 0; xi < WINO_XI; xi++) U[wino_u_at(C, O, xi, c, o)] = t[xi / WINO_A][xi % WINO_A];
        }
    e->tame = wino_tame(w, p->O * p->C * 9);
    e->last_use = ++wino_clock;
    *u = e->u, *tame = e->tame;
    return KILN_OK;
}

/* ---- the fast kernel ----------------------------------------------------------------------- */

/* Eight floats (GCC/Clang vector extension: one AVX2 register, two SSE ones). */
typedef float wino_v8 __attribute__((vector_size(32)));


/* The variants of the block kernel (conv_winograd_block.h): the build's, AVX2's and AVX-512's. */
typedef void (*wino_block_fn)(const kiln_conv_params *p, const kiln_conv_epilogue *ep, const wino_layout *lx,
                              const wino_layout *ly, wino_act_fn act, const float *x, const float *U,
                              const float *bias, const float *residual, float *y, int64_t t0, int64_t nt, float *V,
                              float *M);
typedef struct {
    wino_block_fn block;
} wino_kernels;

#define WINO_V(name) name##_baseline
#include "conv_winograd_block.h"
#undef WINO_V
static const wino_kernels winograd_baseline = {wino_block_baseline};
#if KILN_ISA_VARIANTS
KILN_ISA_BEGIN_AVX2
#define WINO_V(name) name##_avx2
#include "conv_winograd_block.h"
#undef WINO_V
KILN_ISA_END
static const wino_kernels winograd_avx2 = {wino_block_avx2};
KILN_ISA_BEGIN_AVX512
#define WINO_V(name) name##_avx512
#include "conv_winograd_block.h"
#undef WINO_V
KILN_ISA_END
static const wino_kernels winograd_avx512 = {wino_block_avx512};
#endif

KILN_ISA_FAMILY(winograd)

static kiln_status wino_run(const kiln_conv_params *p, const kiln_conv_epilogue *ep, const float *x, const float *w,
                            const float *bias, const float *residual, float *y, bool *ran) {
    const float *U;
    bool tame = false;
    KILN_TRY(wino_weights_get(p, w, &U, &tame));
    if (!(*ran = tame && wino_tame(x, p->N * p->C * p->H * p->W))) return KILN_OK;
    int64_t th = (p->OH + WINO_M - 1) / WINO_M, tw = (p->OW + WINO_M - 1) / WINO_M;
    /* each thread takes an equal share of the steps of WINO_ROWS tiles (blocks dealt out in
     * turn left one thread a whole block more: 4 blocks against 3 + a few tiles at 64x64) */
    int64_t tiles = p->N * th * tw, steps = (tiles + WINO_ROWS - 1) / WINO_ROWS;
    int threads = omp_get_max_threads();
    if (threads > steps) threads = (int)steps;
    size_t per_thread = (size_t)WINO_XI * WINO_TILES * (size_t)(p->C + wino_panels(p->O) * WINO_COLS);
    size_t need = sizeof(float) * per_thread * (size_t)threads;
    if (need > wino_scratch_size) {
        kiln_free(wino_scratch);
        wino_scratch_size = 0;
        if (!(wino_scratch = kiln_alloc(need)))
            return kiln_error(KILN_ERR_MEMORY, "conv2d_fused: out of memory for the Winograd buffers");
        wino_scratch_size = need;
    }
    wino_layout lx = wino_layout_of(ep->layout, p->C, p->H, p->W), ly = wino_layout_of(ep->layout, p->O, p->OH, p->OW);
    wino_act_fn act = wino_activation(ep);
    float *scratch = wino_scratch;
    wino_block_fn block = ((const wino_kernels *)winograd_chosen)->block;
#pragma omp parallel num_threads(threads)
    {
        int tid = omp_get_thread_num(), nth = omp_get_num_threads();
        float *V = scratch + per_thread * (size_t)tid, *M = V + (size_t)WINO_XI * WINO_TILES * (size_t)p->C;
        int64_t s0 = steps * tid / nth, s1 = steps * (tid + 1) / nth, per_block = WINO_TILES / WINO_ROWS;
        for (int64_t s = s0; s < s1; s += per_block) {
            int64_t t0 = s * WINO_ROWS, t1 = (s + per_block < s1 ? s + per_block : s1) * WINO_ROWS;
            block(p, ep, &lx, &ly, act, x, U, bias, residual, y, t0, (t1 < tiles ? t1 : tiles) - t0, V, M);
        }
    }
    return KILN_OK;
}

kiln_status kiln_conv_winograd_run(const kiln_conv_params *p, const kiln_conv_epilogue *ep, const float *x,
                                   const float *w, const float *bias, const float *residual, float *y, bool *ran) {
    KILN_ASSERT(kiln_conv_winograd_fits(p, ep));
    pthread_mutex_lock(&wino_lock);
    kiln_status s = wino_run(p, ep, x, w, bias, residual, y, ran);
    if (s == KILN_OK && *ran) wino_count++;
    pthread_mutex_unlock(&wino_lock);
    return s;
}

int64_t kiln_conv_winograd_count(void) {
    pthread_mutex_lock(&wino_lock);
    int64_t n = wino_count;
    pthread_mutex_unlock(&wino_lock);
    return n;
}

/* ---- the reference kernel ------------------------------------------------------------------ */

kiln_status kiln_conv_winograd_reference(const kiln_conv_params *p, const kiln_conv_epilogue *ep, const float *x,
                                         const float *w, const float *bias, const float *residual, float *y) {
    KILN_ASSERT(kiln_conv_winograd_fits(p, ep));
    wino_layout lx = wino_layout_of(ep->layout, p->C, p->H, p->W), ly = wino_layout_of(ep->layout, p->O, p->OH, p->OW);
    wino_act_fn act = wino_activation(ep);
    for (int64_t n = 0; n < p->N; n++)
        for (int64_t o = 0; o < p->O; o++)
            for (int64_t oh0 = 0; oh0 < p->OH; oh0 += WINO_M)
                for (int64_t ow0 = 0; ow0 < p->OW; ow0 += WINO_M) {
                    /* acc = sum over input channels of (G g G^T) .* (B^T d B) */
                    float acc[WINO_A][WINO_A] = {{0}};
                    for (int64_t c = 0; c < p->C; c++) {
                        float u[WINO_A][WINO_A], d[WINO_A][WINO_A], t[WINO_A][WINO_A];
                        wino_filter(w + (o * p->C + c) * 9, u);
                        for (int i = 0; i < WINO_A; i++)
                            for (int j = 0; j < WINO_A; j++) {
                                int64_t ih = oh0 - p->pt + i, iw = ow0 - p->pl + j;
                                bool inside = ih >= 0 && ih < p->H && iw >= 0 && iw < p->W;
                                d[i][j] = inside ? x[n * lx.n + wino_coff(&lx, c) + ih * lx.h + iw * lx.w] : 0;
                            }
                        for (int i = 0; i < WINO_A; i++) /* t = B^T d */
                            for (int j = 0; j < WINO_A; j++) {
                                t[i][j] = 0;
                                for (int k = 0; k < WINO_A; k++) t[i][j] += wino_BT[i][k] * d[k][j];
                            }
                        for (int i = 0; i < WINO_A; i++) /* acc += u .* (t B) */
                            for (int j = 0; j < WINO_A; j++) {
                                float v = 0;
                                for (int k = 0; k < WINO_A; k++) v += t[i][k] * wino_BT[j][k];
                                acc[i][j] += u[i][j] * v;
                            }
                    }
                    for (int i = 0; i < WINO_M; i++) /* Y = A^T acc A, then the epilogue */
                        for (int j = 0; j < WINO_M; j++) {
                            int64_t oh = oh0 + i, ow = ow0 + j;
                            if (oh >= p->OH || ow >= p->OW) continue;
                            float v = 0;
                            for (int k = 0; k < WINO_A; k++)
                                for (int l = 0; l < WINO_A; l++) v += wino_AT[i][k] * acc[k][l] * wino_AT[j][l];
                            int64_t at = n * ly.n + wino_coff(&ly, o) + oh * ly.h + ow * ly.w;
                            if (bias) v += bias[o];
                            if (residual) v += residual[at];
                            if (act) act(&v, 1, ep->alpha, ep->beta);
                            y[at] = v;
                        }
                }
    return KILN_OK;
}

/* ---- training: the backward ops ------------------------------------------------------------ */

/* The backward-input problem of p as a forward one: gx = conv(gy, w') with w'[c][o] the
 * filter w[o][c] turned by 180 degrees and padding 2 - p (a 3x3 stride-1 convolution's
 * transpose). Fits when every padding is at most 2. */
static bool wino_transposed(const kiln_conv_params *p, kiln_conv_params *q) {
    if (p->pt > 2 || p->pb > 2 || p->pl > 2 || p->pr > 2) return false;
    *q = (kiln_conv_params){.N = p->N, .C = p->O, .H = p->OH, .W = p->OW, .O = p->C, .KH = 3, .KW = 3,
                            .OH = p->H, .OW = p->W, .sh = 1, .sw = 1, .pt = 2 - p->pt, .pb = 2 - p->pb,
                            .pl = 2 - p->pl, .pr = 2 - p->pr, .dh = 1, .dw = 1, .groups = 1};
    return true;
}

static const kiln_conv_epilogue wino_plain = {.layout = KILN_CONV_NCHW, .winograd = 1, .activation = KILN_CONV_ACT_NONE};

bool kiln_conv_winograd_chosen_for(kiln_conv_kind kind, const kiln_conv_params *p, const kiln_conv_epilogue *ep) {
    if (!ep || !ep->winograd || !kiln_conv_winograd_fits(p, ep)) return false;
    if (kind == KILN_CONV_FORWARD) return kiln_conv_winograd_chosen(p, ep);
    if (ep->layout != KILN_CONV_NCHW) return false;
    kiln_conv_params q;
    if (kind == KILN_CONV_BACKWARD_INPUT) return wino_transposed(p, &q) && kiln_conv_winograd_chosen(&q, &wino_plain);
    return kiln_conv_winograd_chosen(p, ep); /* the same GEMMs, by tiles of the output gradient */
}

/* Training graphs. Fitted on this rule's first machine (2-core Xeon, AVX-512, oneDNN 2.6, under
 * a load of 7-12 from other work: ratios direct / Winograd of the best of 15 eager calls, 3x3
 * padding 1, C = O channels, S x S images, batch 1; noisy, so only the clear wins count):
 *  - AVX-512 (oneDNN's Winograd): forward 1.2-1.9 from 16 channels and 8x8 (C 256 at 8x8: 0.17,
 *    the U-per-tile bound of kiln_conv_winograd_chosen excludes it); backward-input and
 *    backward-weight lose at 16x16 and below whatever the channels (0.6-0.98) and win from
 *    32x32 with 64 channels (C 64: 1.33, 1.58; C 128 at 32x32: 1.30, 1.36, at 64x64: 1.53,
 *    1.93), and lose at C 256 14x14 (0.59, 0.90): backward from 64 channels and 1024 pixels.
 *  - elsewhere (kiln's own, KILN_MAX_CPU_ISA=avx2 on that machine): forward as
 *    kiln_conv_winograd_chosen; backward-input, the forward kernel on the transposed problem,
 *    1.5-1.8 at C 64-128, 16x16-32x32, under 1 at C 256 14x14 (the U-per-tile bound again):
 *    the same thresholds; backward-weight (scalar transforms, OpenBLAS GEMMs) measured 0.36-1.03
 *    at every shape tried: never chosen. */
#define WINO_GRAD_MIN_CHANNELS 64
#define WINO_GRAD_MIN_PIXELS 1024

bool kiln_conv_winograd_pays(kiln_conv_kind kind, const kiln_conv_params *p) {
    kiln_conv_params q = *p;
    if (!kiln_conv_winograd_fits(p, &wino_plain)) return false;
    if (kind == KILN_CONV_BACKWARD_INPUT && !wino_transposed(p, &q)) return false;
    bool onednn = kiln_conv_block_size() == 16;
    if (!onednn && kind == KILN_CONV_BACKWARD_WEIGHT) return false;
    int64_t tiles = q.N * ((q.OH + WINO_M - 1) / WINO_M) * ((q.OW + WINO_M - 1) / WINO_M);
    double u_bytes = (double)sizeof(float) * WINO_XI * (double)q.C * (double)q.O;
    int64_t channels = onednn && kind != KILN_CONV_FORWARD ? WINO_GRAD_MIN_CHANNELS : WINO_MIN_CHANNELS;
    int64_t pixels = onednn && kind != KILN_CONV_FORWARD ? WINO_GRAD_MIN_PIXELS : WINO_MIN_PIXELS;
    return q.C >= channels && q.O >= channels && q.N * q.OH * q.OW >= pixels &&
           u_bytes <= (double)WINO_MAX_U_PER_TILE * (double)tiles;
}

/* w' of wino_transposed: (C, O, 3, 3) from w (O, C, 3, 3). */
static float *wino_turned(const kiln_conv_params *p, const float *w) {
    float *t = kiln_alloc(sizeof(float) * (size_t)(p->O * p->C * 9));
    if (!t) return NULL;
    for (int64_t o = 0; o < p->O; o++)
        for (int64_t c = 0; c < p->C; c++)
            for (int k = 0; k < 9; k++) t[(c * p->O + o) * 9 + 8 - k] = w[(o * p->C + c) * 9 + k];
    return t;
}

kiln_status kiln_conv_winograd_backward_input(const kiln_conv_params *p, const float *gy, const float *w, float *gx,
                                              bool *ran) {
    kiln_conv_params q;
    *ran = false;
    if (!wino_transposed(p, &q)) return KILN_OK;
    float *t = wino_turned(p, w);
    if (!t) return kiln_error(KILN_ERR_MEMORY, "conv2d_backward_input: out of memory for the turned weights");
    kiln_status s = kiln_conv_winograd_run(&q, &wino_plain, gy, t, NULL, NULL, gx, ran);
    kiln_free(t);
    return s;
}

kiln_status kiln_conv_winograd_backward_input_reference(const kiln_conv_params *p, const float *gy, const float *w,
                                                        float *gx) {
    kiln_conv_params q;
    if (!wino_transposed(p, &q))
        return kiln_error(KILN_ERR_VALUE, "conv2d_backward_input: Winograd needs paddings of at most 2");
    float *t = wino_turned(p, w);
    if (!t) return kiln_error(KILN_ERR_MEMORY, "conv2d_backward_input: out of memory for the turned weights");
    kiln_status s = kiln_conv_winograd_reference(&q, &wino_plain, gy, t, NULL, NULL, gx);
    kiln_free(t);
    return s;
}

/* The weight gradient by the same algorithm, transposed: with y = A^T [(G g G^T) .* (B^T d B)] A
 * per tile, <gy, y> = sum_xi (A gy A^T)[xi] (G g G^T)[xi] (B^T d B)[xi], so
 *   gw = G^T [ sum over tiles (A gy_tile A^T) .* (B^T x_tile B) ] G,
 * gy_tile the 4x4 output-gradient tile (zero past the output), x_tile the 6x6 input tile it
 * reads. The sum over tiles is, per position xi, one GEMM: M[xi] (O x C) = Y[xi]^T (O x tiles)
 * @ X[xi] (tiles x C), accumulated over blocks of WINO_GRAD_TILES tiles (OpenBLAS). */
#define WINO_GRAD_TILES 512

/* out[xi] = (B^T d B)[xi] of the input tile of channel plane x (H x W) at (ih0, iw0). */
static void wino_grad_input_tile(const kiln_conv_params *p, const float *x, int64_t ih0, int64_t iw0, float *out,
                                 int64_t stride) {
    float d[WINO_A][WINO_A], t[WINO_A][WINO_A];
    for (int i = 0; i < WINO_A; i++)
        for (int j = 0; j < WINO_A; j++) {
            int64_t ih = ih0 + i, iw = iw0 + j;
            d[i][j] = ih >= 0 && ih < p->H && iw >= 0 && iw < p->W ? x[ih * p->W + iw] : 0;
        }
    for (int i = 0; i < WINO_A; i++)
        for (int j = 0; j < WINO_A; j++) {
            float s = 0;
            for (int k = 0; k < WINO_A; k++) s += wino_BT[i][k] * d[k][j];
            t[i][j] = s;
        }
    for (int i = 0; i < WINO_A; i++)
        for (int j = 0; j < WINO_A; j++) {
            float s = 0;
            for (int k = 0; k < WINO_A; k++) s += t[i][k] * wino_BT[j][k];
            out[(i * WINO_A + j) * stride] = s;
        }
}

/* out[xi] = (A g A^T)[xi] of the output-gradient tile of plane gy (OH x OW) at (oh0, ow0). */
static void wino_grad_output_tile(const kiln_conv_params *p, const float *gy, int64_t oh0, int64_t ow0, float *out,
                                  int64_t stride) {
    float g[WINO_M][WINO_M], t[WINO_A][WINO_M];
    for (int i = 0; i < WINO_M; i++)
        for (int j = 0; j < WINO_M; j++) {
            int64_t oh = oh0 + i, ow = ow0 + j;
            g[i][j] = oh < p->OH && ow < p->OW ? gy[oh * p->OW + ow] : 0;
        }
    for (int i = 0; i < WINO_A; i++)
        for (int j = 0; j < WINO_M; j++) {
            float s = 0;
            for (int k = 0; k < WINO_M; k++) s += wino_AT[k][i] * g[k][j];
            t[i][j] = s;
        }
    for (int i = 0; i < WINO_A; i++)
        for (int j = 0; j < WINO_A; j++) {
            float s = 0;
            for (int k = 0; k < WINO_M; k++) s += t[i][k] * wino_AT[k][j];
            out[(i * WINO_A + j) * stride] = s;
        }
}

/* gw[o][c] = G^T m G, m[xi] at M[xi * stride]. */
static void wino_grad_filter(const float *M, int64_t stride, float *gw) {
    float t[3][WINO_A];
    for (int k = 0; k < 3; k++)
        for (int j = 0; j < WINO_A; j++) {
            float s = 0;
            for (int i = 0; i < WINO_A; i++) s += wino_G[i][k] * M[(i * WINO_A + j) * stride];
            t[k][j] = s;
        }
    for (int k = 0; k < 3; k++)
        for (int l = 0; l < 3; l++) {
            float s = 0;
            for (int j = 0; j < WINO_A; j++) s += t[k][j] * wino_G[j][l];
            gw[k * 3 + l] = s;
        }
}

kiln_status kiln_conv_winograd_backward_weight(const kiln_conv_params *p, const float *x, const float *gy, float *gw,
                                               bool *ran) {
    KILN_ASSERT(kiln_conv_winograd_fits(p, &wino_plain));
    *ran = false;
    if (!wino_tame(x, p->N * p->C * p->H * p->W) || !wino_tame(gy, p->N * p->O * p->OH * p->OW)) return KILN_OK;
    int64_t C = p->C, O = p->O, th = (p->OH + WINO_M - 1) / WINO_M, tw = (p->OW + WINO_M - 1) / WINO_M;
    int64_t tiles = p->N * th * tw, nb = tiles < WINO_GRAD_TILES ? tiles : WINO_GRAD_TILES;
    float *X = kiln_alloc(sizeof(float) * WINO_XI * (size_t)(nb * C));
    float *Y = kiln_alloc(sizeof(float) * WINO_XI * (size_t)(nb * O));
    float *M = kiln_alloc(sizeof(float) * WINO_XI * (size_t)(O * C));
    if (!X || !Y || !M) {
        kiln_free(X), kiln_free(Y), kiln_free(M);
        return kiln_error(KILN_ERR_MEMORY, "conv2d_backward_weight: out of memory for the Winograd buffers");
    }
    if (openblas_get_num_threads() != omp_get_max_threads()) openblas_set_num_threads(omp_get_max_threads());
    for (int64_t t0 = 0; t0 < tiles; t0 += nb) {
        int64_t n_t = tiles - t0 < nb ? tiles - t0 : nb;
        /* X[xi][t][c] and Y[xi][t][o] */
#pragma omp parallel for schedule(static) if (n_t * (C + O) >= 64)
        for (int64_t k = 0; k < n_t * (C + O); k++) {
            int64_t t = k / (C + O), ch = k % (C + O), g = t0 + t, n = g / (th * tw);
            int64_t oh0 = g / tw % th * WINO_M, ow0 = g % tw * WINO_M;
            if (ch < C)
                wino_grad_input_tile(p, x + (n * C + ch) * p->H * p->W, oh0 - p->pt, ow0 - p->pl, X + t * C + ch, nb * C);
            else
                wino_grad_output_tile(p, gy + (n * O + ch - C) * p->OH * p->OW, oh0, ow0, Y + t * O + ch - C, nb * O);
        }
        for (int xi = 0; xi < WINO_XI; xi++)
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)O, (int)C, (int)n_t, 1.0f, Y + xi * nb * O,
                        (int)O, X + xi * nb * C, (int)C, t0 ? 1.0f : 0.0f, M + xi * O * C, (int)C);
    }
#pragma omp parallel for schedule(static) if (O * C >= 256)
    for (int64_t k = 0; k < O * C; k++) wino_grad_filter(M + k, O * C, gw + k * 9);
    kiln_free(X), kiln_free(Y), kiln_free(M);
    *ran = true;
    pthread_mutex_lock(&wino_lock);
    wino_count++;
    pthread_mutex_unlock(&wino_lock);
    return KILN_OK;
}

/* The same in plain loops, one (output channel, input channel) pair and tile at a time. */
kiln_status kiln_conv_winograd_backward_weight_reference(const kiln_conv_params *p, const float *x, const float *gy,
                                                         float *gw) {
    KILN_ASSERT(kiln_conv_winograd_fits(p, &wino_plain));
    int64_t th = (p->OH + WINO_M - 1) / WINO_M, tw = (p->OW + WINO_M - 1) / WINO_M;
    for (int64_t o = 0; o < p->O; o++)
        for (int64_t c = 0; c < p->C; c++) {
            float m[WINO_XI] = {0};
            for (int64_t n = 0; n < p->N; n++)
                for (int64_t ty = 0; ty < th; ty++)
                    for (int64_t tx = 0; tx < tw; tx++) {
                        float u[WINO_XI], v[WINO_XI];
                        wino_grad_input_tile(p, x + (n * p->C + c) * p->H * p->W, ty * WINO_M - p->pt,
                                             tx * WINO_M - p->pl, u, 1);
                        wino_grad_output_tile(p, gy + (n * p->O + o) * p->OH * p->OW, ty * WINO_M, tx * WINO_M, v, 1);
                        for (int xi = 0; xi < WINO_XI; xi++) m[xi] += u[xi] * v[xi];
                    }
            wino_grad_filter(m, 1, gw + (o * p->C + c) * 9);
        }
    return KILN_OK;
}
