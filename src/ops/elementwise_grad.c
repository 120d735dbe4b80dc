/* Gradient rules of the elementwise ops, written with ops (principle 2: gradients are ops). */
#include "../core/internal.h"
#include "grad_scope.h"

#define X (ctx->in[0])
#define Y (ctx->out[0])
#define G (gout[0])
#define UNARY_RULE(name, expr)                                                               \
    KILN_GRAD(name) {                                                                        \
        grad_scope sc = {0};                                                                 \
        kiln_tensor *v[1] = {(expr)};                                                        \
        return finish(&sc, ctx, gin, v);                                                     \
    }

UNARY_RULE(neg, un(&sc, KILN_OP_NEG, G))
UNARY_RULE(abs, bin(&sc, KILN_OP_MUL, G, un(&sc, KILN_OP_SIGN, X)))
UNARY_RULE(exp, bin(&sc, KILN_OP_MUL, G, Y))
UNARY_RULE(log, bin(&sc, KILN_OP_DIV, G, X))
UNARY_RULE(sqrt, bin(&sc, KILN_OP_DIV, bin(&sc, KILN_OP_MUL, G, scalar(&sc, 0.5, G)), Y))
/* d/dx x^-1/2 = -1/2 y^3 */
UNARY_RULE(rsqrt, bin(&sc, KILN_OP_MUL, bin(&sc, KILN_OP_MUL, G, scalar(&sc, -0.5, G)),
                      bin(&sc, KILN_OP_MUL, Y, bin(&sc, KILN_OP_MUL, Y, Y))))
UNARY_RULE(sin, bin(&sc, KILN_OP_MUL, G, un(&sc, KILN_OP_COS, X)))
UNARY_RULE(cos, un(&sc, KILN_OP_NEG, bin(&sc, KILN_OP_MUL, G, un(&sc, KILN_OP_SIN, X))))
UNARY_RULE(tanh, bin(&sc, KILN_OP_TANH_BACKWARD, G, Y))
UNARY_RULE(sigmoid, bin(&sc, KILN_OP_SIGMOID_BACKWARD, G, Y))
UNARY_RULE(relu, bin(&sc, KILN_OP_RELU_BACKWARD, G, X))
UNARY_RULE(gelu, bin(&sc, KILN_OP_GELU_BACKWARD, G, X))
UNARY_RULE(silu, bin(&sc, KILN_OP_SILU_BACKWARD, G, X))
/* d/dx erf(x) = 2/sqrt(pi) exp(-x^2) */
UNARY_RULE(erf, bin(&sc, KILN_OP_MUL, bin(&sc, KILN_OP_MUL, G, scalar(&sc, 1.1283791670955126, G)),
                    un(&sc, KILN_OP_EXP, un(&sc, KILN_OP_NEG, bin(&sc, KILN_OP_MUL, X, X)))))

/* d/dx log(1 + x) = 1 / (1 + x); d/dx (exp(x) - 1) = exp(x) = y + 1 */
UNARY_RULE(log1p, bin(&sc, KILN_OP_DIV, G, bin(&sc, KILN_OP_ADD, X, scalar(&sc, 1.0, X))))
UNARY_RULE(expm1, bin(&sc, KILN_OP_MUL, G, bin(&sc, KILN_OP_ADD, Y, scalar(&sc, 1.0, Y))))
/* d/dx tan x = 1 + tan^2 x; asin: 1 / sqrt(1 - x^2); acos: its negation; atan: 1 / (1 + x^2) */
UNARY_RULE(tan, bin(&sc, KILN_OP_MUL, G, bin(&sc, KILN_OP_ADD, bin(&sc, KILN_OP_MUL, Y, Y), scalar(&sc, 1.0, Y))))
#define ONE_MINUS_X2 bin(&sc, KILN_OP_SUB, scalar(&sc, 1.0, X), bin(&sc, KILN_OP_MUL, X, X))
UNARY_RULE(asin, bin(&sc, KILN_OP_DIV, G, un(&sc, KILN_OP_SQRT, ONE_MINUS_X2)))
UNARY_RULE(acos, un(&sc, KILN_OP_NEG, bin(&sc, KILN_OP_DIV, G, un(&sc, KILN_OP_SQRT, ONE_MINUS_X2))))
UNARY_RULE(atan, bin(&sc, KILN_OP_DIV, G, bin(&sc, KILN_OP_ADD, bin(&sc, KILN_OP_MUL, X, X), scalar(&sc, 1.0, X))))
/* sinh' = cosh, cosh' = sinh; asinh: 1 / sqrt(x^2 + 1); acosh: 1 / sqrt(x^2 - 1); atanh: 1 / (1 - x^2) */
UNARY_RULE(sinh, bin(&sc, KILN_OP_MUL, G, un(&sc, KILN_OP_COSH, X)))
UNARY_RULE(cosh, bin(&sc, KILN_OP_MUL, G, un(&sc, KILN_OP_SINH, X)))
UNARY_RULE(asinh, bin(&sc, KILN_OP_DIV, G,
                      un(&sc, KILN_OP_SQRT, bin(&sc, KILN_OP_ADD, bin(&sc, KILN_OP_MUL, X, X), scalar(&sc, 1.0, X)))))
UNARY_RULE(acosh, bin(&sc, KILN_OP_DIV, G,
                      un(&sc, KILN_OP_SQRT, bin(&sc, KILN_OP_SUB, bin(&sc, KILN_OP_MUL, X, X), scalar(&sc, 1.0, X)))))
UNARY_RULE(atanh, bin(&sc, KILN_OP_DIV, G, ONE_MINUS_X2))
#undef ONE_MINUS_X2
/* log2: 1 / (x ln 2); log10: 1 / (x ln 10); exp2: 2^x ln 2 */
UNARY_RULE(log2, bin(&sc, KILN_OP_DIV, G, bin(&sc, KILN_OP_MUL, X, scalar(&sc, 0.69314718055994531, X))))
UNARY_RULE(log10, bin(&sc, KILN_OP_DIV, G, bin(&sc, KILN_OP_MUL, X, scalar(&sc, 2.3025850929940457, X))))
UNARY_RULE(exp2, bin(&sc, KILN_OP_MUL, G, bin(&sc, KILN_OP_MUL, Y, scalar(&sc, 0.69314718055994531, Y))))
/* piecewise constant (floor, ceil, round, trunc): 0 everywhere, as PyTorch's */
UNARY_RULE(zero, zeros_like(&sc, G))

KILN_GRAD(clamp) {
    grad_scope sc = {0};
    kiln_tensor *lo = scalar(&sc, ctx->attrs->f[0], X), *hi = scalar(&sc, ctx->attrs->f[1], X);
    kiln_tensor *inside = bin(&sc, KILN_OP_LOGICAL_AND, bin(&sc, KILN_OP_GE, X, lo), bin(&sc, KILN_OP_LE, X, hi));
    kiln_tensor *v[1] = {where3(&sc, inside, G, scalar(&sc, 0.0, G))};
    return finish(&sc, ctx, gin, v);
}

KILN_GRAD(cast) {
    if (!kiln_dtype_is_float(ctx->in_meta[0].dtype)) return KILN_OK;
    return kiln_emit_cast(G, ctx->in_meta[0].dtype, &gin[0]);
}

/* ---- binary ----------------------------------------------------------------------------- */

#define A (ctx->in[0])
#define B (ctx->in[1])

KILN_GRAD(add) {
    kiln_tensor *v[2] = {G, G};
    grad_scope sc = {0};
    return finish(&sc, ctx, gin, v);
}

KILN_GRAD(sub) {
    grad_scope sc = {0};
    kiln_tensor *v[2] = {G, ctx->needs_grad[1] ? un(&sc, KILN_OP_NEG, G) : NULL};
    return finish(&sc, ctx, gin, v);
}

KILN_GRAD(mul) {
    grad_scope sc = {0};
    kiln_tensor *v[2] = {ctx->needs_grad[0] ? bin(&sc, KILN_OP_MUL, G, B) : NULL,
                         ctx->needs_grad[1] ? bin(&sc, KILN_OP_MUL, G, A) : NULL};
    return finish(&sc, ctx, gin, v);
}

KILN_GRAD(div) {
    grad_scope sc = {0};
    kiln_tensor *v[2] = {ctx->needs_grad[0] ? bin(&sc, KILN_OP_DIV, G, B) : NULL,
                         ctx->needs_grad[1] ? un(&sc, KILN_OP_NEG, bin(&sc, KILN_OP_DIV, bin(&sc, KILN_OP_MUL, G, Y), B)) : NULL};
    return finish(&sc, ctx, gin, v);
}

/* a % b = a - b * floor(a / b): d/da = 1, d/db = -floor(a / b) */
KILN_GRAD(remainder) {
    grad_scope sc = {0};
    kiln_tensor *v[2] = {ctx->needs_grad[0] ? G : NULL,
                         ctx->needs_grad[1] ? un(&sc, KILN_OP_NEG, bin(&sc, KILN_OP_MUL, G, bin(&sc, KILN_OP_FLOOR_DIVIDE, A, B)))
                                            : NULL};
    return finish(&sc, ctx, gin, v);
}

/* fmod(a, b) = a - b * trunc(a / b): d/da = 1, d/db = -trunc(a / b) */
KILN_GRAD(fmod) {
    grad_scope sc = {0};
    kiln_tensor *v[2] = {ctx->needs_grad[0] ? G : NULL,
                         ctx->needs_grad[1] ? un(&sc, KILN_OP_NEG, bin(&sc, KILN_OP_MUL, G, un(&sc, KILN_OP_TRUNC, bin(&sc, KILN_OP_DIV, A, B))))
                                            : NULL};
    return finish(&sc, ctx, gin, v);
}

/* atan2(a, b): d/da = b / (a^2 + b^2), d/db = -a / (a^2 + b^2) */
KILN_GRAD(atan2) {
    grad_scope sc = {0};
    kiln_tensor *r2 = bin(&sc, KILN_OP_ADD, bin(&sc, KILN_OP_MUL, A, A), bin(&sc, KILN_OP_MUL, B, B));
    kiln_tensor *gr = bin(&sc, KILN_OP_DIV, G, r2);
    kiln_tensor *v[2] = {ctx->needs_grad[0] ? bin(&sc, KILN_OP_MUL, gr, B) : NULL,
                         ctx->needs_grad[1] ? un(&sc, KILN_OP_NEG, bin(&sc, KILN_OP_MUL, gr, A)) : NULL};
    return finish(&sc, ctx, gin, v);
}

/* hypot(a, b) = y: d/da = a / y, d/db = b / y */
KILN_GRAD(hypot) {
    grad_scope sc = {0};
    kiln_tensor *gy = bin(&sc, KILN_OP_DIV, G, Y);
    kiln_tensor *v[2] = {ctx->needs_grad[0] ? bin(&sc, KILN_OP_MUL, gy, A) : NULL,
                         ctx->needs_grad[1] ? bin(&sc, KILN_OP_MUL, gy, B) : NULL};
    return finish(&sc, ctx, gin, v);
}

/* logaddexp(a, b) = y: d/da = exp(a - y), d/db = exp(b - y) (softmax weights of a and b) */
KILN_GRAD(logaddexp) {
    grad_scope sc = {0};
    kiln_tensor *v[2] = {ctx->needs_grad[0] ? bin(&sc, KILN_OP_MUL, G, un(&sc, KILN_OP_EXP, bin(&sc, KILN_OP_SUB, A, Y))) : NULL,
                         ctx->needs_grad[1] ? bin(&sc, KILN_OP_MUL, G, un(&sc, KILN_OP_EXP, bin(&sc, KILN_OP_SUB, B, Y))) : NULL};
    return finish(&sc, ctx, gin, v);
}

/* d/da a^b = b a^(b-1); d/db a^b = a^b log a, taken as 0 where a <= 0 */
KILN_GRAD(pow) {
    grad_scope sc = {0};
    kiln_tensor *ga = NULL, *gb = NULL;
    if (ctx->needs_grad[0]) {
        kiln_tensor *bm1 = bin(&sc, KILN_OP_SUB, B, scalar(&sc, 1.0, B));
        ga = bin(&sc, KILN_OP_MUL, G, bin(&sc, KILN_OP_MUL, B, bin(&sc, KILN_OP_POW, A, bm1)));
    }
    if (ctx->needs_grad[1]) {
        kiln_tensor *zero = scalar(&sc, 0.0, G);
        kiln_tensor *positive = bin(&sc, KILN_OP_GT, A, zero);
        kiln_tensor *safe_a = where3(&sc, positive, A, scalar(&sc, 1.0, A));
        gb = where3(&sc, positive, bin(&sc, KILN_OP_MUL, bin(&sc, KILN_OP_MUL, G, Y), un(&sc, KILN_OP_LOG, safe_a)), zero);
    }
    kiln_tensor *v[2] = {ga, gb};
    return finish(&sc, ctx, gin, v);
}

/* maximum/minimum: the loser gets no gradient, ties split it evenly, and otherwise (the winner,
 * or either input where one is NaN) it passes, as PyTorch. */
static kiln_status select_grad(const kiln_grad_ctx *ctx, kiln_tensor *const *gout, kiln_tensor **gin, kiln_op wins) {
    grad_scope sc = {0};
    kiln_tensor *zero = scalar(&sc, 0.0, G), *half = bin(&sc, KILN_OP_MUL, G, scalar(&sc, 0.5, G));
    kiln_tensor *tie = bin(&sc, KILN_OP_EQ, A, B);
    kiln_tensor *v[2] = {NULL, NULL};
    if (ctx->needs_grad[0]) v[0] = where3(&sc, bin(&sc, wins, B, A), zero, where3(&sc, tie, half, G));
    if (ctx->needs_grad[1]) v[1] = where3(&sc, bin(&sc, wins, A, B), zero, where3(&sc, tie, half, G));
    return finish(&sc, ctx, gin, v);
}

KILN_GRAD(maximum) { return select_grad(ctx, gout, gin, KILN_OP_GT); }
KILN_GRAD(minimum) { return select_grad(ctx, gout, gin, KILN_OP_LT); }

KILN_GRAD(where) {
    grad_scope sc = {0};
    kiln_tensor *zero = scalar(&sc, 0.0, G), *c = ctx->in[0];
    kiln_tensor *v[3] = {NULL, ctx->needs_grad[1] ? where3(&sc, c, G, zero) : NULL,
                         ctx->needs_grad[2] ? where3(&sc, c, zero, G) : NULL};
    return finish(&sc, ctx, gin, v);
}

/* ---- piecewise constant and the first-order backward ops (second derivatives) ------------- */

/* no gradient flows (sign, floor_divide: piecewise constant, 0 almost everywhere, as PyTorch's) */
KILN_GRAD(constant) {
    (void)gout;
    for (int k = 0; k < ctx->nin; k++)
        if (ctx->needs_grad[k]) KILN_TRY(kiln_emit_full(&ctx->in_meta[k], 0.0, &gin[k]));
    return KILN_OK;
}

/* tanh_backward(a, y) = a (1 - y²): d/da = 1 - y², d/dy = -2 a y */
KILN_GRAD(tanh_backward) {
    grad_scope sc = {0};
    kiln_tensor *one = scalar(&sc, 1.0, B);
    kiln_tensor *v[2] = {ctx->needs_grad[0] ? bin(&sc, KILN_OP_MUL, G, bin(&sc, KILN_OP_SUB, one, bin(&sc, KILN_OP_MUL, B, B)))
                                            : NULL,
                         ctx->needs_grad[1] ? bin(&sc, KILN_OP_MUL, bin(&sc, KILN_OP_MUL, G, scalar(&sc, -2.0, G)),
                                                  bin(&sc, KILN_OP_MUL, A, B))
                                            : NULL};
    return finish(&sc, ctx, gin, v);
}

/* sigmoid_backward(a, y) = a y (1 - y): d/da = y (1 - y), d/dy = a (1 - 2 y) */
KILN_GRAD(sigmoid_backward) {
    grad_scope sc = {0};
    kiln_tensor *one = scalar(&sc, 1.0, B);
    kiln_tensor *v[2] = {ctx->needs_grad[0] ? bin(&sc, KILN_OP_MUL, G, bin(&sc, KILN_OP_MUL, B, bin(&sc, KILN_OP_SUB, one, B)))
                                            : NULL,
                         ctx->needs_grad[1] ? bin(&sc, KILN_OP_MUL, G,
                                                  bin(&sc, KILN_OP_MUL, A,
                                                      bin(&sc, KILN_OP_SUB, one, bin(&sc, KILN_OP_MUL, scalar(&sc, 2.0, B), B))))
                                            : NULL};
    return finish(&sc, ctx, gin, v);
}

/* gelu_backward(a, x) = a gelu'(x): d/da = gelu_backward(g, x), d/dx = g a gelu''(x), with
 * gelu''(x) = phi(x) (2 - x^2), phi the standard normal density */
KILN_GRAD(gelu_backward) {
    grad_scope sc = {0};
    kiln_tensor *v[2] = {ctx->needs_grad[0] ? bin(&sc, KILN_OP_GELU_BACKWARD, G, B) : NULL, NULL};
    if (ctx->needs_grad[1]) {
        kiln_tensor *x2 = bin(&sc, KILN_OP_MUL, B, B);
        kiln_tensor *phi = bin(&sc, KILN_OP_MUL, un(&sc, KILN_OP_EXP, bin(&sc, KILN_OP_MUL, x2, scalar(&sc, -0.5, B))),
                               scalar(&sc, 0.39894228040143268, B));
        v[1] = bin(&sc, KILN_OP_MUL, bin(&sc, KILN_OP_MUL, G, A),
                   bin(&sc, KILN_OP_MUL, phi, bin(&sc, KILN_OP_SUB, scalar(&sc, 2.0, B), x2)));
    }
    return finish(&sc, ctx, gin, v);
}

/* silu_backward(a, x) = a silu'(x): d/da = silu_backward(g, x), d/dx = g a silu''(x), with
 * silu''(x) = s (1 - s) (2 + x (1 - 2 s)), s = sigmoid(x) */
KILN_GRAD(silu_backward) {
    grad_scope sc = {0};
    kiln_tensor *v[2] = {ctx->needs_grad[0] ? bin(&sc, KILN_OP_SILU_BACKWARD, G, B) : NULL, NULL};
    if (ctx->needs_grad[1]) {
        kiln_tensor *s = un(&sc, KILN_OP_SIGMOID, B), *one = scalar(&sc, 1.0, B);
        kiln_tensor *ds = bin(&sc, KILN_OP_MUL, s, bin(&sc, KILN_OP_SUB, one, s));
        kiln_tensor *inner = bin(&sc, KILN_OP_ADD, scalar(&sc, 2.0, B),
                                 bin(&sc, KILN_OP_MUL, B, bin(&sc, KILN_OP_SUB, one, bin(&sc, KILN_OP_MUL, scalar(&sc, 2.0, B), s))));
        v[1] = bin(&sc, KILN_OP_MUL, bin(&sc, KILN_OP_MUL, G, A), bin(&sc, KILN_OP_MUL, ds, inner));
    }
    return finish(&sc, ctx, gin, v);
}

/* relu_backward(a, x) = a where x > 0: d/da = the same mask, d/dx = 0 */
KILN_GRAD(relu_backward) {
    grad_scope sc = {0};
    kiln_tensor *v[2] = {ctx->needs_grad[0] ? bin(&sc, KILN_OP_RELU_BACKWARD, G, B) : NULL,
                         ctx->needs_grad[1] ? zeros_like(&sc, B) : NULL};
    return finish(&sc, ctx, gin, v);
}
