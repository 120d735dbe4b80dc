/* Gradient hooks in the backward engine (kiln_autograd_add_hook): a leaf's run once on its summed
 * gradient before .grad, in order, each on what the one before returned; another tensor's on its
 * complete gradient, replacing it for the ops before it; removal, release, and the errors. */
#include "check.h"
#include "core/internal.h"

typedef struct {
    int calls;      /* how many times the hook ran */
    int released;   /* how many times its release ran */
    double scale;   /* 0: return nothing (keep the gradient); else multiply by it */
    float seen[4];  /* the first elements of the gradient it last saw */
    int bad_shape;  /* return a gradient of another shape */
} hook_state;

static kiln_status scale_hook(void *ctx, kiln_tensor *g, kiln_tensor **out) {
    hook_state *h = ctx;
    h->calls++;
    for (int64_t i = 0; i < g->numel && i < 4; i++) h->seen[i] = (float)kiln_tensor_get_double(g, i);
    if (h->bad_shape) {
        int64_t shape[1] = {g->numel + 1};
        return kiln_tensor_zeros(KILN_DTYPE_FLOAT32, 1, shape, out);
    }
    if (h->scale == 0) return KILN_OK;
    kiln_tensor *r = NULL;
    KILN_TRY(kiln_tensor_empty(g->meta.dtype, g->meta.ndim, g->meta.shape, &r));
    for (int64_t i = 0; i < g->numel; i++) ((float *)r->data)[i] = (float)(kiln_tensor_get_double(g, i) * h->scale);
    *out = r;
    return KILN_OK;
}

static void count_release(void *ctx) { ((hook_state *)ctx)->released++; }

static int64_t add_hook(kiln_tensor *t, hook_state *h) {
    kiln_grad_hook hook = {scale_hook, count_release, h, 0, 0, NULL};
    int64_t id = -1;
    CHECK_OK(kiln_autograd_add_hook(t, &hook, &id));
    return id;
}

static const int64_t N3[1] = {3};

static kiln_tensor *leaf(void) {
    static const float v[3] = {1, 2, 3};
    kiln_tensor *x = tensor_f32(1, N3, v);
    CHECK_OK(kiln_tensor_set_requires_grad(x, true));
    return x;
}

/* y = x * x + x (two uses of x): dy/dx = 2x + 1 */
static kiln_tensor *square_plus(kiln_tensor *x, kiln_tensor **sq) {
    kiln_tensor *s = NULL, *y = NULL;
    CHECK_OK(kiln_emit_binary(KILN_OP_MUL, x, x, &s));
    CHECK_OK(kiln_emit_binary(KILN_OP_ADD, s, x, &y));
    if (sq) *sq = s;
    else kiln_tensor_release(s);
    return y;
}

static void backward(kiln_tensor *y) {
    kiln_tensor *ones = tensor_f32(1, N3, (const float[]){1, 1, 1});
    CHECK_OK(kiln_autograd_backward(1, &y, &ones));
    kiln_tensor_release(ones);
}

static void test_leaf_hooks_in_order_on_the_sum(void) {
    kiln_tensor *x = leaf();
    hook_state a = {.scale = 0}, b = {.scale = 2}, c = {.scale = 0};
    add_hook(x, &a);
    add_hook(x, &b);
    add_hook(x, &c);
    CHECK(kiln_autograd_has_hooks(x));
    kiln_tensor *y = square_plus(x, NULL);
    backward(y);
    CHECK(a.calls == 1 && b.calls == 1 && c.calls == 1); /* once, on the sum of both uses */
    CHECK(close_f32(a.seen, (const float[]){3, 5, 7}, 3, 1e-6f));
    CHECK(close_f32(c.seen, (const float[]){6, 10, 14}, 3, 1e-6f)); /* what b returned */
    CHECK(x->grad && close_f32(x->grad->data, (const float[]){6, 10, 14}, 3, 1e-6f));
    backward(y); /* accumulates; the hooks see this pass's gradient only */
    CHECK(close_f32(a.seen, (const float[]){3, 5, 7}, 3, 1e-6f));
    CHECK(close_f32(x->grad->data, (const float[]){12, 20, 28}, 3, 1e-6f));
    /* the gradient asked of a grad call goes through the hooks too */
    kiln_tensor *g = NULL;
    CHECK_OK(kiln_autograd_grad(1, &y, NULL, 1, &x, false, &g));
    CHECK(g && close_f32(g->data, (const float[]){6, 10, 14}, 3, 1e-6f));
    kiln_tensor_release(g);
    kiln_tensor_release(y);
    kiln_tensor_release(x); /* frees the hooks: each released once */
    CHECK(a.released == 1 && b.released == 1 && c.released == 1);
}

static void test_intermediate_hook_replaces_the_gradient(void) {
    kiln_tensor *x = leaf(), *sq = NULL;
    kiln_tensor *y = square_plus(x, &sq);
    hook_state h = {.scale = 10};
    int64_t id = add_hook(sq, &h); /* added after sq was used */
    CHECK(kiln_autograd_has_hooks(sq) && !kiln_autograd_has_hooks(x));
    backward(y);
    CHECK(h.calls == 1 && close_f32(h.seen, (const float[]){1, 1, 1}, 3, 1e-6f));
    CHECK(close_f32(x->grad->data, (const float[]){21, 41, 61}, 3, 1e-6f)); /* 10 * 2x + 1 */
    CHECK(kiln_autograd_remove_hook(sq, id) && h.released == 1);
    CHECK(!kiln_autograd_remove_hook(sq, id) && !kiln_autograd_has_hooks(sq));
    kiln_tensor_release(x->grad);
    x->grad = NULL;
    backward(y);
    CHECK(h.calls == 1 && close_f32(x->grad->data, (const float[]){3, 5, 7}, 3, 1e-6f));
    kiln_tensor_release(y);
    kiln_tensor_release(sq);
    kiln_tensor_release(x);
}

static void test_no_gradient_no_call_and_errors(void) {
    kiln_tensor *x = leaf(), *unused = leaf();
    hook_state h = {.scale = 1}, u = {.scale = 1};
    add_hook(x, &h);
    add_hook(unused, &u);
    kiln_tensor *y = square_plus(x, NULL);
    backward(y);
    CHECK(h.calls == 1 && u.calls == 0); /* no gradient reaches `unused` */
    h.bad_shape = 1;
    CHECK_STATUS(kiln_autograd_backward(1, &y, NULL), KILN_ERR_VALUE);
    CHECK(strstr(kiln_last_error(), "a gradient hook returned a gradient of shape (4,) for a gradient of shape (3,)"));
    kiln_tensor *plain = tensor_f32(1, N3, NULL);
    hook_state p = {.scale = 1};
    kiln_grad_hook hook = {scale_hook, count_release, &p, 0, 0, NULL};
    int64_t id;
    CHECK_STATUS(kiln_autograd_add_hook(plain, &hook, &id), KILN_ERR_RUNTIME);
    CHECK(p.released == 1 && strstr(kiln_last_error(), "does not require grad"));
    kiln_tensor_release(plain);
    kiln_tensor_release(y);
    kiln_tensor_release(x);
    kiln_tensor_release(unused);
    CHECK(h.released == 1 && u.released == 1);
}

int main(void) {
    test_leaf_hooks_in_order_on_the_sum();
    test_intermediate_hook_replaces_the_gradient();
    test_no_gradient_no_call_and_errors();
    if (check_failures) {
        fprintf(stderr, "%d check(s) failed\n", check_failures);
        return 1;
    }
    printf("test_grad_hooks: ok\n");
    return 0;
}
