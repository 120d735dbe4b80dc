/* The recurrent layer's forward and backward through time, written once for a compute type and
 * included by rnn.c twice: RS_T float with sgemm (the fast kernels), RS_T double with plain loops
 * (the reference kernels). Before including, rnn.c defines:
 *   RS_T            the compute type
 *   RS_NAME(x)      x with the variant's suffix
 *   RS_GEMM         C (M x N, row stride ldc) = op(A) @ op(B) + (beta ? C : 0), row-major
 *   RS_EXP, RS_TANH exp and tanh of RS_T
 * Layouts (rnn_shape in rnn.c): x (T, B, I); h0, c0, states (B, H); w_ih (GH, I); w_hh (GH, H);
 * workspace (T, B, W) indexed by time, each row: LSTM gates i, f, g, o after their activations,
 * then the state h and c after the step; GRU r, z, n, then W_hn h + b_hn, then h; RNN h. */

static inline RS_T RS_NAME(rs_sigmoid)(RS_T a) { return (RS_T)1 / ((RS_T)1 + RS_EXP(-a)); }

/* The layer's forward. y, hn, cn, ws: outputs (contiguous, compute type); c0, cn NULL but for
 * the LSTM; b_ih, b_hh, len may be NULL. pre: T * B * GH scratch. */
static void RS_NAME(rs_forward)(const rnn_shape *p, const RS_T *x, const RS_T *h0, const RS_T *c0, const RS_T *w_ih,
                                const RS_T *w_hh, const RS_T *b_ih, const RS_T *b_hh, const int64_t *len, RS_T *y,
                                RS_T *hn, RS_T *cn, RS_T *ws, RS_T *pre, RS_T *gh) {
    const int64_t T = p->T, B = p->B, H = p->H, GH = p->G * H, W = p->W;
    /* every step's input projection at once: pre = x @ w_ihᵀ + b_ih (+ b_hh but for the GRU, whose
     * n gate needs W_hn h + b_hn apart) */
    RS_GEMM(false, true, T * B, GH, p->In, x, p->In, w_ih, p->In, false, pre, GH);
    for (int64_t r = 0; r < T * B; r++)
        for (int64_t g = 0; g < GH; g++)
            pre[r * GH + g] += (b_ih ? b_ih[g] : 0) + (b_hh && p->mode != RNN_GRU ? b_hh[g] : 0);
    memcpy(hn, h0, sizeof(RS_T) * (size_t)(B * H));
    if (cn) memcpy(cn, c0, sizeof(RS_T) * (size_t)(B * H));
    for (int64_t s = 0; s < T; s++) {
        int64_t t = p->reverse ? T - 1 - s : s;
        RS_T *a = pre + t * B * GH, *wt = ws + t * B * W, *yt = y + t * B * H;
        if (p->mode == RNN_GRU) { /* gh = h @ w_hhᵀ + b_hh */
            RS_GEMM(false, true, B, GH, H, hn, H, w_hh, H, false, gh, GH);
            if (b_hh)
                for (int64_t r = 0; r < B; r++)
                    for (int64_t g = 0; g < GH; g++) gh[r * GH + g] += b_hh[g];
        } else { /* a += h @ w_hhᵀ */
            RS_GEMM(false, true, B, GH, H, hn, H, w_hh, H, true, a, GH);
        }
        for (int64_t b = 0; b < B; b++) {
            bool valid = !len || t < len[b];
            RS_T *ab = a + b * GH, *wb = wt + b * W, *h = hn + b * H, *yb = yt + b * H;
            if (p->mode == RNN_LSTM) {
                RS_T *c = cn + b * H;
                for (int64_t j = 0; j < H; j++) {
                    RS_T i = RS_NAME(rs_sigmoid)(ab[j]), f = RS_NAME(rs_sigmoid)(ab[H + j]);
                    RS_T g = RS_TANH(ab[2 * H + j]), o = RS_NAME(rs_sigmoid)(ab[3 * H + j]);
                    wb[j] = i, wb[H + j] = f, wb[2 * H + j] = g, wb[3 * H + j] = o;
                    if (valid) {
                        c[j] = f * c[j] + i * g;
                        h[j] = o * RS_TANH(c[j]);
                    }
                    wb[4 * H + j] = h[j], wb[5 * H + j] = c[j];
                }
            } else if (p->mode == RNN_GRU) {
                const RS_T *gb = gh + b * GH;
                for (int64_t j = 0; j < H; j++) {
                    RS_T r = RS_NAME(rs_sigmoid)(ab[j] + gb[j]), z = RS_NAME(rs_sigmoid)(ab[H + j] + gb[H + j]);
                    RS_T n = RS_TANH(ab[2 * H + j] + r * gb[2 * H + j]);
                    wb[j] = r, wb[H + j] = z, wb[2 * H + j] = n, wb[3 * H + j] = gb[2 * H + j];
                    if (valid) h[j] = ((RS_T)1 - z) * n + z * h[j];
                    wb[4 * H + j] = h[j];
                }
            } else {
                for (int64_t j = 0; j < H; j++) {
                    if (valid) h[j] = p->mode == RNN_TANH ? RS_TANH(ab[j]) : (ab[j] > 0 ? ab[j] : (RS_T)0);
                    wb[j] = h[j];
                }
            }
            for (int64_t j = 0; j < H; j++) yb[j] = valid ? h[j] : (RS_T)0;
        }
    }
}

/* The state h before the step at time t: the state after the previous step, or h0. */
static const RS_T *RS_NAME(rs_h_before)(const rnn_shape *p, const RS_T *ws, const RS_T *h0, int64_t t, int64_t b,
                                        int64_t off) {
    int64_t prev = p->reverse ? t + 1 : t - 1;
    if (prev < 0 || prev >= p->T) return h0 + b * p->H;
    return ws + (prev * p->B + b) * p->W + off;
}

/* The layer's backward through time. gy (T, B, H), ghn, gcn (B, H) (gcn NULL but for the LSTM);
 * outputs gx, gh0, gc0 (NULL but for the LSTM), gw_ih, gw_hh, gb_ih, gb_hh (contiguous, compute
 * type). dgi, dgh: T * B * GH scratch (dgh may be dgi but for the GRU); hprev: T * B * H. */
static void RS_NAME(rs_backward)(const rnn_shape *p, const RS_T *x, const RS_T *h0, const RS_T *c0, const RS_T *w_ih,
                                 const RS_T *w_hh, const int64_t *len, const RS_T *ws, const RS_T *gy,
                                 const RS_T *ghn, const RS_T *gcn, RS_T *gx, RS_T *gh0, RS_T *gc0, RS_T *gw_ih,
                                 RS_T *gw_hh, RS_T *gb_ih, RS_T *gb_hh, RS_T *dgi, RS_T *dgh, RS_T *hprev) {
    const int64_t T = p->T, B = p->B, H = p->H, GH = p->G * H, W = p->W;
    const int64_t hoff = p->mode == RNN_LSTM || p->mode == RNN_GRU ? 4 * H : 0; /* h in a workspace row */
    RS_T *dh = gh0, *dc = gc0; /* the gradient of the state after the step being undone */
    memcpy(dh, ghn, sizeof(RS_T) * (size_t)(B * H));
    if (dc) memcpy(dc, gcn, sizeof(RS_T) * (size_t)(B * H));
    for (int64_t s = T - 1; s >= 0; s--) {
        int64_t t = p->reverse ? T - 1 - s : s;
        RS_T *gi = dgi + t * B * GH, *gg = dgh + t * B * GH;
        for (int64_t b = 0; b < B; b++) {
            bool valid = !len || t < len[b];
            const RS_T *wb = ws + (t * B + b) * W, *gyb = gy + (t * B + b) * H;
            const RS_T *hp = RS_NAME(rs_h_before)(p, ws, h0, t, b, hoff);
            RS_T *gib = gi + b * GH, *ggb = gg + b * GH, *d = dh + b * H;
            memcpy(hprev + (t * B + b) * H, hp, sizeof(RS_T) * (size_t)H);
            if (!valid) { /* the step kept the state: its gradient passes through */
                for (int64_t g = 0; g < GH; g++) gib[g] = 0, ggb[g] = 0;
                continue;
            }
            if (p->mode == RNN_LSTM) {
                const RS_T *cp = RS_NAME(rs_h_before)(p, ws, c0, t, b, 5 * H);
                RS_T *e = dc + b * H;
                for (int64_t j = 0; j < H; j++) {
                    RS_T i = wb[j], f = wb[H + j], g = wb[2 * H + j], o = wb[3 * H + j], tc = RS_TANH(wb[5 * H + j]);
                    RS_T dhj = d[j] + gyb[j];
                    RS_T dcj = e[j] + dhj * o * ((RS_T)1 - tc * tc);
                    gib[j] = dcj * g * i * ((RS_T)1 - i);
                    gib[H + j] = dcj * cp[j] * f * ((RS_T)1 - f);
                    gib[2 * H + j] = dcj * i * ((RS_T)1 - g * g);
                    gib[3 * H + j] = dhj * tc * o * ((RS_T)1 - o);
                    e[j] = dcj * f;
                    d[j] = 0;
                }
            } else if (p->mode == RNN_GRU) {
                for (int64_t j = 0; j < H; j++) {
                    RS_T r = wb[j], z = wb[H + j], n = wb[2 * H + j], hn = wb[3 * H + j];
                    RS_T dhj = d[j] + gyb[j];
                    RS_T dan = dhj * ((RS_T)1 - z) * ((RS_T)1 - n * n);
                    RS_T daz = dhj * (hp[j] - n) * z * ((RS_T)1 - z);
                    RS_T dar = dan * hn * r * ((RS_T)1 - r);
                    gib[j] = dar, gib[H + j] = daz, gib[2 * H + j] = dan;
                    ggb[j] = dar, ggb[H + j] = daz, ggb[2 * H + j] = dan * r;
                    d[j] = dhj * z;
                }
            } else {
                for (int64_t j = 0; j < H; j++) {
                    RS_T h = wb[j], dhj = d[j] + gyb[j];
                    gib[j] = p->mode == RNN_TANH ? dhj * ((RS_T)1 - h * h) : (h > 0 ? dhj : (RS_T)0);
                    d[j] = 0;
                }
            }
        }
        /* the gradient through the recurrent product: dh += dgates_h @ w_hh */
        RS_GEMM(false, false, B, H, GH, gg, GH, w_hh, H, true, dh, H);
    }
    RS_GEMM(false, false, T * B, p->In, GH, dgi, GH, w_ih, p->In, false, gx, p->In);
    RS_GEMM(true, false, GH, p->In, T * B, dgi, GH, x, p->In, false, gw_ih, p->In);
    RS_GEMM(true, false, GH, H, T * B, dgh, GH, hprev, H, false, gw_hh, H);
    for (int64_t g = 0; g < GH; g++) {
        double si = 0, sh = 0;
        for (int64_t r = 0; r < T * B; r++) si += dgi[r * GH + g], sh += dgh[r * GH + g];
        gb_ih[g] = (RS_T)si, gb_hh[g] = (RS_T)sh;
    }
}
