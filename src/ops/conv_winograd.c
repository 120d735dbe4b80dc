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
#include <math.h>
#include <omp.h>
#include <pthread.h>

#include "conv_winograd.h"

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

/* The input tile of image n at (ih0, iw0) for channels c0 .. c0 + nl - 1 (nl <= WINO_LANES;
 * the rest zero; zero outside the image). */
static void wino_load(const kiln_conv_params *p, const wino_layout *l, const float *x, int64_t n, int64_t c0, int nl,
                      int64_t ih0, int64_t iw0, float d[WINO_A][WINO_A][WINO_LANES]) {
    const float *base = x + n * l->n + wino_coff(l, c0);
    bool full = nl == WINO_LANES && l->c == 1;
    for (int i = 0; i < WINO_A; i++) {
        int64_t ih = ih0 + i;
        for (int j = 0; j < WINO_A; j++) {
            int64_t iw = iw0 + j;
            if (ih < 0 || ih >= p->H || iw < 0 || iw >= p->W) {
                for (int v = 0; v < WINO_LANES; v++) d[i][j][v] = 0;
                continue;
            }
            const float *px = base + ih * l->h + iw * l->w;
            if (full)
                memcpy(d[i][j], px, sizeof d[i][j]);
            else
                for (int v = 0; v < WINO_LANES; v++) d[i][j][v] = v < nl ? px[v * l->c] : 0;
        }
    }
}

/* out[k * os + v] = (B^T in)[k] for lanes v, in[i * is + v] the 6 values of one column:
 * F(4x4, 3x3)'s B^T, factored (the weights transform and the reference use the table). */
static inline void wino_bt(const float *in, int is, float *out, int os) {
    for (int v = 0; v < WINO_LANES; v++) {
        float d0 = in[v], d1 = in[is + v], d2 = in[2 * is + v], d3 = in[3 * is + v], d4 = in[4 * is + v],
              d5 = in[5 * is + v];
        float a = d4 - 4 * d2, b = d3 - 4 * d1, c = d4 - d2, e = 2 * (d3 - d1);
        out[v] = 4 * d0 - 5 * d2 + d4;
        out[os + v] = a + b;
        out[2 * os + v] = a - b;
        out[3 * os + v] = c + e;
        out[4 * os + v] = c - e;
        out[5 * os + v] = 4 * d1 - 5 * d3 + d5;
    }
}

/* out[k * os + v] = (A^T in)[k], k < 4, in as for wino_bt. */
static inline void wino_at(const float *in, int is, float *out, int os) {
    for (int v = 0; v < WINO_LANES; v++) {
        float m0 = in[v], m1 = in[is + v], m2 = in[2 * is + v], m3 = in[3 * is + v], m4 = in[4 * is + v],
              m5 = in[5 * is + v];
        float p = m1 + m2, q = m1 - m2, r = m3 + m4, s = m3 - m4;
        out[v] = m0 + p + r;
        out[os + v] = q + 2 * s;
        out[2 * os + v] = p + 4 * r;
        out[3 * os + v] = q + 8 * s + m5;
    }
}

/* out[xi][v] = (B^T d B)[xi] for each lane v. */
static void wino_input(const float d[WINO_A][WINO_A][WINO_LANES], float out[WINO_XI][WINO_LANES]) {
    float t[WINO_A][WINO_A][WINO_LANES]; /* t = B^T d, column by column */
    for (int j = 0; j < WINO_A; j++) wino_bt(d[0][j], WINO_A * WINO_LANES, t[0][j], WINO_A * WINO_LANES);
    for (int k = 0; k < WINO_A; k++) wino_bt(t[k][0], WINO_LANES, out[k * WINO_A], WINO_LANES);
}

/* y = A^T m A for each lane v. */
static void wino_output(const float m[WINO_XI][WINO_LANES], float y[WINO_M][WINO_M][WINO_LANES]) {
    float t[WINO_M][WINO_A][WINO_LANES]; /* t = A^T m */
    for (int j = 0; j < WINO_A; j++) wino_at(m[j], WINO_A * WINO_LANES, t[0][j], WINO_A * WINO_LANES);
    for (int i = 0; i < WINO_M; i++) wino_at(t[i][0], WINO_LANES, y[i][0], WINO_LANES);
}

/* Adds bias and residual to the tile y of output channels o0 .. o0 + nl - 1 at (oh0, ow0) of
 * image n, applies the activation and stores the pixels inside the output. */
static void wino_store(const kiln_conv_params *p, const kiln_conv_epilogue *ep, const wino_layout *l, wino_act_fn act,
                       const float *bias, const float *residual, float *out, int64_t n, int64_t o0, int nl,
                       int64_t oh0, int64_t ow0, float y[WINO_M][WINO_M][WINO_LANES]) {
    int64_t base = n * l->n + wino_coff(l, o0);
    int rows = (int)(p->OH - oh0 < WINO_M ? p->OH - oh0 : WINO_M), cols = (int)(p->OW - ow0 < WINO_M ? p->OW - ow0 : WINO_M);
    bool full = nl == WINO_LANES && l->c == 1;
    if (bias)
        for (int i = 0; i < WINO_M; i++)
            for (int j = 0; j < WINO_M; j++)
                for (int v = 0; v < nl; v++) y[i][j][v] += bias[o0 + v];
    if (residual)
        for (int i = 0; i < rows; i++)
            for (int j = 0; j < cols; j++) {
                const float *r = residual + base + (oh0 + i) * l->h + (ow0 + j) * l->w;
                if (full)
                    for (int v = 0; v < WINO_LANES; v++) y[i][j][v] += r[v];
                else
                    for (int v = 0; v < nl; v++) y[i][j][v] += r[v * l->c];
            }
    if (act) act(&y[0][0][0], WINO_M * WINO_M * WINO_LANES, ep->alpha, ep->beta);
    for (int i = 0; i < rows; i++)
        for (int j = 0; j < cols; j++) {
            float *o = out + base + (oh0 + i) * l->h + (ow0 + j) * l->w;
            if (full)
                memcpy(o, y[i][j], sizeof y[i][j]);
            else
                for (int v = 0; v < nl; v++) o[v * l->c] = y[i][j][v];
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

/* m (WINO_ROWS x WINO_COLS, row stride ldm) = v (WINO_ROWS x C, row stride C) @ u (one panel:
 * C x WINO_COLS). The 12 accumulators are vectors so that they stay in registers (the plain
 * loop was vectorized across the 6 rows into 128-bit pieces, spilling, and ran at a third
 * of OpenBLAS's speed). a * u + acc is one FMA: GCC contracts nothing in ISO C mode unless
 * asked (Clang contracts within an expression by default). */
#if defined(__GNUC__) && !defined(__clang__)
__attribute__((optimize("fp-contract=fast")))
#endif
static void wino_gemm_step(int64_t C, const float *restrict v, const float *restrict u, float *restrict m,
                           int64_t ldm) {
    wino_v8 acc[WINO_ROWS][2] = {{{0}}};
    for (int64_t c = 0; c < C; c++) {
        wino_v8 u0, u1;
        memcpy(&u0, u + c * WINO_COLS, sizeof u0);
        memcpy(&u1, u + c * WINO_COLS + 8, sizeof u1);
#pragma GCC unroll 6
        for (int r = 0; r < WINO_ROWS; r++) {
            float a = v[r * C + c];
            acc[r][0] += a * u0;
            acc[r][1] += a * u1;
        }
    }
    for (int r = 0; r < WINO_ROWS; r++) memcpy(m + r * ldm, acc[r], sizeof acc[r]);
}

/* M[xi] (rows x panels * WINO_COLS) = V[xi] (rows x C) @ U[xi], rows a multiple of WINO_ROWS. */
static void wino_gemm(int64_t rows, int64_t C, int64_t O, const float *V, const float *U, float *M) {
    int64_t panels = wino_panels(O), ldm = panels * WINO_COLS;
    for (int64_t pn = 0; pn < panels; pn++)
        for (int64_t r = 0; r < rows; r += WINO_ROWS)
            wino_gemm_step(C, V + r * C, U + pn * C * WINO_COLS, M + r * ldm + pn * WINO_COLS, ldm);
}

/* One block of tiles t0 .. t0 + nt - 1: V (WINO_XI x WINO_TILES x C) and M (WINO_XI x
 * WINO_TILES x O) are the calling thread's. */
static void wino_block(const kiln_conv_params *p, const kiln_conv_epilogue *ep, const wino_layout *lx,
                       const wino_layout *ly, wino_act_fn act, const float *x, const float *U, const float *bias,
                       const float *residual, float *y, int64_t t0, int64_t nt, float *V, float *M) {
    int64_t th = (p->OH + WINO_M - 1) / WINO_M, tw = (p->OW + WINO_M - 1) / WINO_M, C = p->C, O = p->O;
    int64_t ldv = WINO_TILES * C, ldm = WINO_TILES * wino_panels(O) * WINO_COLS;
    int64_t rows = (nt + WINO_ROWS - 1) / WINO_ROWS * WINO_ROWS;
    for (int64_t t = 0; t < nt; t++) {
        int64_t g = t0 + t, n = g / (th * tw), ty = g / tw % th, tx = g % tw;
        for (int64_t c0 = 0; c0 < C; c0 += WINO_LANES) {
            int nl = (int)(C - c0 < WINO_LANES ? C - c0 : WINO_LANES);
            float d[WINO_A][WINO_A][WINO_LANES], v[WINO_XI][WINO_LANES];
            wino_load(p, lx, x, n, c0, nl, ty * WINO_M - p->pt, tx * WINO_M - p->pl, d);
            wino_input(d, v);
            for (int xi = 0; xi < WINO_XI; xi++) {
                float *dst = V + xi * ldv + t * C + c0;
                if (nl == WINO_LANES)
                    memcpy(dst, v[xi], sizeof v[xi]);
                else
                    for (int k = 0; k < nl; k++) dst[k] = v[xi][k];
            }
        }
    }
    for (int xi = 0; xi < WINO_XI; xi++) {
        memset(V + xi * ldv + nt * C, 0, sizeof(float) * (size_t)((rows - nt) * C)); /* the last step's spare rows */
        wino_gemm(rows, C, O, V + xi * ldv, U + xi * C * wino_panels(O) * WINO_COLS, M + xi * ldm);
    }
    for (int64_t t = 0; t < nt; t++) {
        int64_t g = t0 + t, n = g / (th * tw), ty = g / tw % th, tx = g % tw;
        for (int64_t o0 = 0; o0 < O; o0 += WINO_LANES) {
            int nl = (int)(O - o0 < WINO_LANES ? O - o0 : WINO_LANES);
            float m[WINO_XI][WINO_LANES], out[WINO_M][WINO_M][WINO_LANES];
            for (int xi = 0; xi < WINO_XI; xi++) {
                const float *src = M + xi * ldm + t * (ldm / WINO_TILES) + o0;
                if (nl == WINO_LANES)
                    memcpy(m[xi], src, sizeof m[xi]);
                else
                    for (int k = 0; k < WINO_LANES; k++) m[xi][k] = k < nl ? src[k] : 0;
            }
            wino_output(m, out);
            wino_store(p, ep, ly, act, bias, residual, y, n, o0, nl, ty * WINO_M, tx * WINO_M, out);
        }
    }
}

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
#pragma omp parallel num_threads(threads)
    {
        int tid = omp_get_thread_num(), nth = omp_get_num_threads();
        float *V = scratch + per_thread * (size_t)tid, *M = V + (size_t)WINO_XI * WINO_TILES * (size_t)p->C;
        int64_t s0 = steps * tid / nth, s1 = steps * (tid + 1) / nth, per_block = WINO_TILES / WINO_ROWS;
        for (int64_t s = s0; s < s1; s += per_block) {
            int64_t t0 = s * WINO_ROWS, t1 = (s + per_block < s1 ? s + per_block : s1) * WINO_ROWS;
            wino_block(p, ep, &lx, &ly, act, x, U, bias, residual, y, t0, (t1 < tiles ? t1 : tiles) - t0, V, M);
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
