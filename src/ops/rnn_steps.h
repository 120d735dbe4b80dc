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

/* One batch row of one step; the loops are branch-free so they vectorize. LSTM: a the gates'
 * pre-activations (4H), w the workspace row (gates after their activations, then h and c), h and
 * c the state, updated where valid. */
static void RS_NAME(rs_lstm_row)(int64_t H, bool valid, const RS_T *restrict a, RS_T *restrict w, RS_T *restrict h,
                                 RS_T *restrict c) {
    for (int64_t j = 0; j < 2 * H; j++) w[j] = RS_NAME(rs_sigmoid)(a[j]);
    for (int64_t j = 2 * H; j < 3 * H; j++) w[j] = RS_TANH(a[j]);
    for (int64_t j = 3 * H; j < 4 * H; j++) w[j] = RS_NAME(rs_sigmoid)(a[j]);
    if (valid) {
        const RS_T *restrict i = w, *restrict f = w + H, *restrict g = w + 2 * H, *restrict o = w + 3 * H;
        for (int64_t j = 0; j < H; j++) {
            c[j] = f[j] * c[j] + i[j] * g[j];
            h[j] = o[j] * RS_TANH(c[j]);
        }
    }
    memcpy(w + 4 * H, h, sizeof(RS_T) * (size_t)H);
    memcpy(w + 5 * H, c, sizeof(RS_T) * (size_t)H);
}

/* GRU: a the input projection (3H, with b_ih), gh the recurrent one (3H, with b_hh); w gets r, z,
 * n and gh's n part. */
static void RS_NAME(rs_gru_row)(int64_t H, bool valid, const RS_T *restrict a, const RS_T *restrict gh,
                                RS_T *restrict w, RS_T *restrict h) {
    for (int64_t j = 0; j < 2 * H; j++) w[j] = RS_NAME(rs_sigmoid)(a[j] + gh[j]);
    for (int64_t j = 0; j < H; j++) {
        w[3 * H + j] = gh[2 * H + j];
        w[2 * H + j] = RS_TANH(a[2 * H + j] + w[j] * gh[2 * H + j]);
    }
    if (valid) {
        const RS_T *restrict z = w + H, *restrict n = w + 2 * H;
        for (int64_t j = 0; j < H; j++) h[j] = ((RS_T)1 - z[j]) * n[j] + z[j] * h[j];
    }
}

/* Elman RNN: h = tanh(a) or relu(a) */
static void RS_NAME(rs_rnn_row)(int64_t H, bool tanh_, const RS_T *restrict a, RS_T *restrict h) {
    if (tanh_)
        for (int64_t j = 0; j < H; j++) h[j] = RS_TANH(a[j]);
    else
        for (int64_t j = 0; j < H; j++) h[j] = a[j] > 0 ? a[j] : (RS_T)0;
}

/* The layer's forward. y, hn, cn, ws: outputs (contiguous, compute type); c0, cn NULL but for
 * the LSTM; b_ih, b_hh, len may be NULL. pre: T * B * GH scratch. */
static void RS_NAME(rs_forward)(const rnn_shape *p, const RS_T *x, const RS_T *h0, const RS_T *c0, const RS_T *w_ih,
                                const RS_T *w_hh, const RS_T *b_ih, const RS_T *b_hh, const int64_t *len, RS_T *y,
                                RS_T *hn, RS_T *cn, RS_T *ws, RS_T *pre, RS_T *gh) {
    const int64_t T = p->T, B = p->B, H = p->H, GH = p->G * H, W = p->W;
    /* every step's input projection at once: pre = x @ w_ihᵀ + b_ih (+ b_hh but for the GRU, whose
     * n gate needs W_hn h + b_hn apart) */
    RS_GEMM(false, true, T * B, GH, p->In, x, p->In, w_ih, p->In, false, pre, GH);
    if (b_ih || (b_hh && p->mode != RNN_GRU)) {
        RS_T *bias = gh; /* (scratch until the steps) */
        for (int64_t g = 0; g < GH; g++) bias[g] = (b_ih ? b_ih[g] : 0) + (b_hh && p->mode != RNN_GRU ? b_hh[g] : 0);
        for (int64_t r = 0; r < T * B; r++)
            for (int64_t g = 0; g < GH; g++) pre[r * GH + g] += bias[g];
    }
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
                RS_NAME(rs_lstm_row)(H, valid, ab, wb, h, cn + b * H);
            } else if (p->mode == RNN_GRU) {
                RS_NAME(rs_gru_row)(H, valid, ab, gh + b * GH, wb, h);
            } else if (valid) {
                RS_NAME(rs_rnn_row)(H, p->mode == RNN_TANH, ab, h);
            }
            if (p->mode != RNN_LSTM) memcpy(wb + (p->mode == RNN_GRU ? 4 * H : 0), h, sizeof(RS_T) * (size_t)H);
            if (valid) memcpy(yb, h, sizeof(RS_T) * (size_t)H);
            else memset(yb, 0, sizeof(RS_T) * (size_t)H);
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

/* One batch row of one step undone: from the workspace row w and the gradients of the step's
 * output (gy) and new state (d, and e for the LSTM's c), the gates' pre-activation gradients
 * (gi; gh for the GRU's recurrent side) and the state gradients' direct parts (the recurrent
 * product's part is added by the caller). cp: the LSTM's c before the step. */
static void RS_NAME(rs_lstm_row_grad)(int64_t H, const RS_T *restrict w, const RS_T *restrict cp,
                                      const RS_T *restrict gy, RS_T *restrict d, RS_T *restrict e,
                                      RS_T *restrict gi) {
    const RS_T *restrict i = w, *restrict f = w + H, *restrict g = w + 2 * H, *restrict o = w + 3 * H;
    const RS_T *restrict c = w + 5 * H;
    for (int64_t j = 0; j < H; j++) {
        RS_T tc = RS_TANH(c[j]), dh = d[j] + gy[j];
        RS_T dc = e[j] + dh * o[j] * ((RS_T)1 - tc * tc);
        gi[j] = dc * g[j] * i[j] * ((RS_T)1 - i[j]);
        gi[H + j] = dc * cp[j] * f[j] * ((RS_T)1 - f[j]);
        gi[2 * H + j] = dc * i[j] * ((RS_T)1 - g[j] * g[j]);
        gi[3 * H + j] = dh * tc * o[j] * ((RS_T)1 - o[j]);
        e[j] = dc * f[j];
        d[j] = 0;
    }
}

static void RS_NAME(rs_gru_row_grad)(int64_t H, const RS_T *restrict w, const RS_T *restrict hp,
                                     const RS_T *restrict gy, RS_T *restrict d, RS_T *restrict gi,
                                     RS_T *restrict gh) {
    const RS_T *restrict r = w, *restrict z = w + H, *restrict n = w + 2 * H, *restrict hn = w + 3 * H;
    for (int64_t j = 0; j < H; j++) {
        RS_T dh = d[j] + gy[j];
        RS_T dan = dh * ((RS_T)1 - z[j]) * ((RS_T)1 - n[j] * n[j]);
        RS_T daz = dh * (hp[j] - n[j]) * z[j] * ((RS_T)1 - z[j]);
        RS_T dar = dan * hn[j] * r[j] * ((RS_T)1 - r[j]);
        gi[j] = dar, gi[H + j] = daz, gi[2 * H + j] = dan;
        gh[j] = dar, gh[H + j] = daz, gh[2 * H + j] = dan * r[j];
        d[j] = dh * z[j];
    }
}

static void RS_NAME(rs_rnn_row_grad)(int64_t H, bool tanh_, const RS_T *restrict h, const RS_T *restrict gy,
                                     RS_T *restrict d, RS_T *restrict gi) {
    for (int64_t j = 0; j < H; j++) {
        RS_T dh = d[j] + gy[j];
        gi[j] = tanh_ ? dh * ((RS_T)1 - h[j] * h[j]) : (h[j] > 0 ? dh : (RS_T)0);
        d[j] = 0;
    }
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
            if (p->mode == RNN_LSTM)
                RS_NAME(rs_lstm_row_grad)(H, wb, RS_NAME(rs_h_before)(p, ws, c0, t, b, 5 * H), gyb, d, dc + b * H, gib);
            else if (p->mode == RNN_GRU)
                RS_NAME(rs_gru_row_grad)(H, wb, hp, gyb, d, gib, ggb);
            else
                RS_NAME(rs_rnn_row_grad)(H, p->mode == RNN_TANH, wb, gyb, d, gib);
        }
        /* the gradient through the recurrent product: dh += dgates_h @ w_hh */
        RS_GEMM(false, false, B, H, GH, gg, GH, w_hh, H, true, dh, H);
    }
    RS_GEMM(false, false, T * B, p->In, GH, dgi, GH, w_ih, p->In, false, gx, p->In);
    RS_GEMM(true, false, GH, p->In, T * B, dgi, GH, x, p->In, false, gw_ih, p->In);
    RS_GEMM(true, false, GH, H, T * B, dgh, GH, hprev, H, false, gw_hh, H);
    /* the biases': column sums, accumulated in double row by row (column by column without the
     * accumulators' memory) */
    double *acc = kiln_malloc(sizeof(double) * (size_t)(2 * GH + 1));
    if (acc) {
        memset(acc, 0, sizeof(double) * (size_t)(2 * GH));
        for (int64_t r = 0; r < T * B; r++)
            for (int64_t g = 0; g < GH; g++) acc[g] += dgi[r * GH + g], acc[GH + g] += dgh[r * GH + g];
    }
    for (int64_t g = 0; g < GH; g++) {
        double si = 0, sh = 0;
        for (int64_t r = 0; r < T * B && !acc; r++) si += dgi[r * GH + g], sh += dgh[r * GH + g];
        gb_ih[g] = (RS_T)(acc ? acc[g] : si), gb_hh[g] = (RS_T)(acc ? acc[GH + g] : sh);
    }
    free(acc);
}
