/* The fast Winograd kernel's loops (conv_winograd.c), written once and compiled once per
 * instruction set: conv_winograd.c includes this file for each variant with WINO_V(name) naming
 * that variant's functions (isa_dispatch.h). No include guard on purpose. */

/* The input tile of image n at (ih0, iw0) for channels c0 .. c0 + nl - 1 (nl <= WINO_LANES;
 * the rest zero; zero outside the image). */
static void WINO_V(wino_load)(const kiln_conv_params *p, const wino_layout *l, const float *x, int64_t n, int64_t c0, int nl,
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
static inline void WINO_V(wino_bt)(const float *in, int is, float *out, int os) {
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
static inline void WINO_V(wino_at)(const float *in, int is, float *out, int os) {
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
static void WINO_V(wino_input)(const float d[WINO_A][WINO_A][WINO_LANES], float out[WINO_XI][WINO_LANES]) {
    float t[WINO_A][WINO_A][WINO_LANES]; /* t = B^T d, column by column */
    for (int j = 0; j < WINO_A; j++) WINO_V(wino_bt)(d[0][j], WINO_A * WINO_LANES, t[0][j], WINO_A * WINO_LANES);
    for (int k = 0; k < WINO_A; k++) WINO_V(wino_bt)(t[k][0], WINO_LANES, out[k * WINO_A], WINO_LANES);
}

/* y = A^T m A for each lane v. */
static void WINO_V(wino_output)(const float m[WINO_XI][WINO_LANES], float y[WINO_M][WINO_M][WINO_LANES]) {
    float t[WINO_M][WINO_A][WINO_LANES]; /* t = A^T m */
    for (int j = 0; j < WINO_A; j++) WINO_V(wino_at)(m[j], WINO_A * WINO_LANES, t[0][j], WINO_A * WINO_LANES);
    for (int i = 0; i < WINO_M; i++) WINO_V(wino_at)(t[i][0], WINO_LANES, y[i][0], WINO_LANES);
}

/* Adds bias and residual to the tile y of output channels o0 .. o0 + nl - 1 at (oh0, ow0) of
 * image n, applies the activation and stores the pixels inside the output. */
static void WINO_V(wino_store)(const kiln_conv_params *p, const kiln_conv_epilogue *ep, const wino_layout *l, wino_act_fn act,
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

/* m (WINO_ROWS x WINO_COLS, row stride ldm) = v (WINO_ROWS x C, row stride C) @ u (one panel:
 * C x WINO_COLS). The 12 accumulators are vectors so that they stay in registers (the plain
 * loop was vectorized across the 6 rows into 128-bit pieces, spilling, and ran at a third
 * of OpenBLAS's speed). a * u + acc is one FMA: GCC contracts nothing in ISO C mode unless
 * asked (Clang contracts within an expression by default). */
#if defined(__GNUC__) && !defined(__clang__)
__attribute__((optimize("fp-contract=fast")))
#endif
static void WINO_V(wino_gemm_step)(int64_t C, const float *restrict v, const float *restrict u,
                                   float *restrict m, int64_t ldm) {
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
static void WINO_V(wino_gemm)(int64_t rows, int64_t C, int64_t O, const float *V, const float *U, float *M) {
    int64_t panels = wino_panels(O), ldm = panels * WINO_COLS;
    for (int64_t pn = 0; pn < panels; pn++)
        for (int64_t r = 0; r < rows; r += WINO_ROWS)
            WINO_V(wino_gemm_step)(C, V + r * C, U + pn * C * WINO_COLS, M + r * ldm + pn * WINO_COLS, ldm);
}

/* One block of tiles t0 .. t0 + nt - 1: V (WINO_XI x WINO_TILES x C) and M (WINO_XI x
 * WINO_TILES x O) are the calling thread's. */
static void WINO_V(wino_block)(const kiln_conv_params *p, const kiln_conv_epilogue *ep, const wino_layout *lx,
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
            WINO_V(wino_load)(p, lx, x, n, c0, nl, ty * WINO_M - p->pt, tx * WINO_M - p->pl, d);
            WINO_V(wino_input)(d, v);
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
        WINO_V(wino_gemm)(rows, C, O, V + xi * ldv, U + xi * C * wino_panels(O) * WINO_COLS, M + xi * ldm);
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
            WINO_V(wino_output)(m, out);
            WINO_V(wino_store)(p, ep, ly, act, bias, residual, y, n, o0, nl, ty * WINO_M, tx * WINO_M, out);
        }
    }
}
