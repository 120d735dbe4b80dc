/* kiln_graph_split cuts a forward-and-backward graph at the values the backward reads, and
 * kiln_autograd_record_custom records a node whose gradient the caller computes: together they are
 * how a compiled piece of a bytecode-captured function sits on the eager tape. */
#include "check.h"
#include "core/internal.h"

/* forward y = exp(x) * w (returned), backward (gradient g of y): dx = g * y, dw = g * exp(x) */
static const char *whole =
    "graph(%0: float32[3], %1: float32[3], %2: float32[3]) {\n"
    "  %3: float32[3] = exp(%0)\n"
    "  %4: float32[3] = mul(%3, %1)\n"
    "  %5: float32[3] = mul(%2, %4)\n"
    "  %6: float32[3] = mul(%2, %3)\n"
    "  return (%4, %5, %6)\n"
    "}\n";

static void test_split_keeps_the_residuals(void) {
    kiln_graph *g = NULL, *f = NULL, *b = NULL;
    CHECK_OK(kiln_graph_parse(whole, &g));
    int32_t nres = -1;
    CHECK_OK(kiln_graph_split(g, 2, 1, &f, &b, &nres));
    CHECK(nres == 2); /* y and exp(x) */
    CHECK(f && f->ninputs == 2 && f->noutputs == 3 && f->nnodes == 2);
    CHECK(b && b->ninputs == 3 && b->noutputs == 2 && b->nnodes == 2);
    if (f) CHECK_OK(kiln_graph_verify(f));
    if (b) CHECK_OK(kiln_graph_verify(b));
    kiln_executable *fe = NULL, *be = NULL;
    if (f && b) CHECK_OK(kiln_compile(f, NULL, &fe));
    if (f && b) CHECK_OK(kiln_compile(b, NULL, &be));
    int64_t n = 3;
    float xv[3] = {0.0f, 0.5f, -1.0f}, wv[3] = {2.0f, -1.0f, 3.0f}, gv[3] = {1.0f, 2.0f, 0.5f};
    kiln_tensor *in[2] = {tensor_f32(1, &n, xv), tensor_f32(1, &n, wv)}, *out[3] = {0}, *grads[2] = {0};
    if (fe) CHECK_OK(kiln_executable_run(fe, 2, in, 3, out));
    kiln_tensor *bin[3] = {out[1], out[2], tensor_f32(1, &n, gv)};
    if (be && out[1]) CHECK_OK(kiln_executable_run(be, 3, bin, 2, grads));
    float y[3], dx[3], dw[3];
    for (int i = 0; i < 3; i++) y[i] = expf(xv[i]) * wv[i], dx[i] = gv[i] * y[i], dw[i] = gv[i] * expf(xv[i]);
    CHECK(out[0] && close_f32(out[0]->data, y, 3, 1e-6f));
    CHECK(grads[0] && close_f32(grads[0]->data, dx, 3, 1e-6f) && grads[1] && close_f32(grads[1]->data, dw, 3, 1e-6f));
    kiln_release_all(in, 2), kiln_release_all(out, 3), kiln_release_all(grads, 2), kiln_tensor_release(bin[2]);
    kiln_executable_free(fe), kiln_executable_free(be);
    kiln_graph_free(f), kiln_graph_free(b);
    /* a forward output that reads the backward's input is refused */
    CHECK_STATUS(kiln_graph_split(g, 2, 2, &f, &b, &nres), KILN_ERR_VALUE);
    CHECK(strstr(kiln_last_error(), "split: forward output 1") && !f && !b);
    kiln_graph_free(g);
}

typedef struct {
    int calls, released;
} custom_state;

/* d out / d in = 3 */
static kiln_status triple(void *ctx, int nout, kiln_tensor *const *grads, int nin, const bool *needs,
                          bool create_graph, kiln_tensor **gin) {
    (void)nout, (void)nin, (void)create_graph;
    ((custom_state *)ctx)->calls++;
    kiln_tensor *three;
    KILN_TRY(kiln_emit_full(&grads[0]->meta, 3.0, &three));
    kiln_status s = needs[0] ? kiln_emit_binary(KILN_OP_MUL, grads[0], three, &gin[0]) : KILN_OK;
    kiln_tensor_release(three);
    return s;
}

static void count_release(void *ctx) { ((custom_state *)ctx)->released++; }

static void test_custom_node_runs_the_callers_rule(void) {
    custom_state st = {0, 0};
    int64_t n = 2;
    float xv[2] = {1.0f, 2.0f}, ov[2] = {3.0f, 6.0f};
    kiln_tensor *x = tensor_f32(1, &n, xv), *o = tensor_f32(1, &n, ov), *sum = NULL, *gx = NULL;
    CHECK_OK(kiln_tensor_set_requires_grad(x, true));
    kiln_custom_grad rule = {triple, count_release, &st, "triple"};
    CHECK_OK(kiln_autograd_record_custom(1, &x, 1, &o, &rule));
    CHECK(o->requires_grad && o->grad_fn);
    CHECK_OK(kiln_apply2(KILN_OP_MUL, o, o, NULL, &sum)); /* d(o*o)/dx = 2 o * 3 */
    if (sum) CHECK_OK(kiln_autograd_grad(1, &sum, NULL, 1, &x, false, &gx));
    float want[2] = {18.0f, 36.0f};
    CHECK(st.calls == 1 && gx && close_f32(gx->data, want, 2, 1e-6f));
    kiln_tensor_release(gx), kiln_tensor_release(sum), kiln_tensor_release(o);
    CHECK(st.released == 1); /* the node went with its last output */
    /* nothing requires grad: nothing recorded, the context released at once */
    kiln_tensor *plain = tensor_f32(1, &n, xv), *o2 = tensor_f32(1, &n, ov);
    CHECK_OK(kiln_autograd_record_custom(1, &plain, 1, &o2, &rule));
    CHECK(!o2->grad_fn && st.released == 2);
    kiln_tensor_release(plain), kiln_tensor_release(o2), kiln_tensor_release(x);
}

int main(void) {
    test_split_keeps_the_residuals();
    test_custom_node_runs_the_callers_rule();
    CHECK_DONE();
}
