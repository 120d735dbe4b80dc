/* The sink backend against the kernel-by-kernel executor on the same graphs, as generated code and
 * interpreted (KILN_DISABLE_CODEGEN=1): values, fresh outputs, views and reshapes that copy, results
 * aliasing inputs, in-place writes to an input (and the fallback when it arrives strided), fused
 * groups, wrong inputs. Run under ASan/UBSan in CI: every tensor the sink makes is released. */
#define _POSIX_C_SOURCE 200809L /* setenv */

#include <stdlib.h>

#include "check.h"
#include "sample_graphs.h"
#include "core/internal.h"

static kiln_graph *parse(const char *text) {
    kiln_graph *g = NULL;
    if (kiln_graph_parse(text, &g) != KILN_OK) {
        fprintf(stderr, "parse: %s\n", kiln_last_error());
        exit(2);
    }
    return g;
}

static kiln_tensor *ramp(int ndim, const int64_t *shape, float base) {
    kiln_tensor *t = tensor_f32(ndim, shape, NULL);
    for (int64_t i = 0; i < t->numel; i++) ((float *)t->data)[i] = base + 0.25f * (float)(i % 13) - 0.01f * (float)i;
    return t;
}

static bool equal_values(kiln_tensor *a, kiln_tensor *b) {
    if (a->meta.ndim != b->meta.ndim || a->numel != b->numel || a->meta.dtype != b->meta.dtype) return false;
    kiln_tensor *ca = NULL, *cb = NULL;
    if (kiln_to_contiguous(a, a->meta.dtype, &ca) != KILN_OK || kiln_to_contiguous(b, b->meta.dtype, &cb) != KILN_OK)
        return false;
    bool same = memcmp(ca->data, cb->data, (size_t)a->numel * kiln_dtype_size(a->meta.dtype)) == 0;
    kiln_tensor_release(ca), kiln_tensor_release(cb);
    return same;
}

/* Runs g sunk (native or interpreted) and kernel by kernel on inputs made by make(k, call), three
 * calls; every output must be bitwise equal, and a sink output must never be a kbk output's buffer. */
typedef kiln_tensor *(*make_input)(int k, int call);

static void compare_backends(const char *text, int nin, make_input make, bool interpreted, bool expect_native) {
    kiln_graph *g = parse(text);
    if (interpreted) setenv("KILN_DISABLE_CODEGEN", "1", 1);
    kiln_executable *s = NULL;
    kiln_executable *e = NULL;
    kiln_compile_options opt = {KILN_ORDER_BFS, false, "kbk"};
    kiln_compile_options sunk = {KILN_ORDER_BFS, false, "sink"};
    CHECK_OK(kiln_compile(g, &sunk, &s));
    CHECK_OK(kiln_compile(g, &opt, &e));
    unsetenv("KILN_DISABLE_CODEGEN");
    if (!s || !e) goto done;
    CHECK(kiln_executable_is_native(s) == expect_native);
    kiln_tensor *previous = NULL;
    for (int call = 0; call < 3; call++) {
        kiln_tensor *in_s[8], *in_k[8], *out_s[8] = {0}, *out_k[8] = {0};
        for (int k = 0; k < nin; k++) in_s[k] = make(k, call), in_k[k] = make(k, call);
        int nout = g->noutputs;
        CHECK_OK(kiln_executable_run(s, nin, in_s, nout, out_s));
        CHECK_OK(kiln_executable_run(e, nin, in_k, nout, out_k));
        for (int k = 0; k < nout; k++) {
            CHECK(out_s[k] && out_k[k] && equal_values(out_s[k], out_k[k]));
            for (int j = 0; j < nin; j++) /* sharing with inputs as kbk's results share */
                CHECK(kiln_tensor_same_storage(out_s[k], in_s[j]) == kiln_tensor_same_storage(out_k[k], in_k[j]));
        }
        for (int k = 0; k < nin; k++) CHECK(equal_values(in_s[k], in_k[k])); /* in-place writes alike */
        if (previous && out_s[0]) CHECK(previous->data != out_s[0]->data || kiln_tensor_same_storage(out_s[0], in_s[0]));
        kiln_tensor_release(previous);
        previous = out_s[0];
        out_s[0] = NULL;
        kiln_release_all(out_s, nout), kiln_release_all(out_k, nout);
        kiln_release_all(in_s, nin), kiln_release_all(in_k, nin);
    }
    kiln_tensor_release(previous);
done:
    kiln_executable_free(s);
    kiln_executable_free(e);
    kiln_graph_free(g);
}

static kiln_tensor *abc_input(int k, int call) {
    int64_t shape[2] = {2, 3};
    return ramp(2, shape, (float)(k + 2 * call) - 1.5f);
}

static kiln_tensor *cube_input(int k, int call) {
    int64_t shape[3] = {2, 3, 4};
    return ramp(3, shape, 0.5f * (float)(k - call));
}

/* permute of an input, then a reshape that must copy; a slice view out; the input itself out;
 * a view of an intermediate out next to its base */
static const char *views =
    "graph(%0: float32[2, 3, 4], %1: float32[2, 3, 4]) {\n"
    "  %2: float32[2, 4, 3] = permute(%0) {0, 2, 1}\n"
    "  %3: float32[2, 12] = reshape(%2) {2, 12}\n"
    "  %4: float32[2, 3, 4] = mul(%0, %1)\n"
    "  %5: float32[2, 4, 3] = permute(%4) {0, 2, 1}\n"
    "  %6: float32[2, 12] = reshape(%5) {2, 12}\n"
    "  %7: float32[2, 12] = add(%3, %6)\n"
    "  %8: float32[24] = reshape(%7) {24}\n"
    "  %9: float32[2, 3, 4] = exp(%1)\n"
    "  %10: float32[6, 4] = reshape(%9) {6, 4}\n"
    "  return (%8, %10, %9, %0, %2)\n"
    "}\n";

static void test_abc_and_views(void) {
    for (int interp = 0; interp < 2; interp++) {
        compare_backends(SAMPLE_ABC, 3, abc_input, interp, !interp);
        compare_backends(views, 2, cube_input, interp, !interp);
    }
}

/* x[1:3, :] = v in place on input 0 (slice_assign), then y = x * 2: the input is written */
static void test_in_place_write_of_an_input(void) {
    kiln_graph *g = NULL;
    CHECK_OK(kiln_graph_new(&g));
    kiln_meta mx = {.dtype = KILN_DTYPE_FLOAT32, .ndim = 2, .shape = {4, 3}};
    kiln_meta mv = {.dtype = KILN_DTYPE_FLOAT32, .ndim = 1, .shape = {3}};
    int32_t x, v, w, two, y;
    CHECK_OK(kiln_graph_add_input(g, &mx, &x));
    CHECK_OK(kiln_graph_add_input(g, &mv, &v));
    kiln_attrs a = {0};
    for (int d = 0; d < 2; d++) a.i[d] = d == 0 ? 1 : 0, a.i[8 + d] = 1, a.i[16 + d] = d == 0 ? 2 : 3;
    a.ni = 24;
    int32_t ins[2] = {x, v};
    CHECK_OK(kiln_graph_add_node(g, KILN_OP_SLICE_ASSIGN, 2, ins, &a, -1, &w));
    kiln_attrs full = {0};
    full.i[0] = KILN_DTYPE_FLOAT32, full.i[1] = 0, full.ni = 2, full.f[0] = 2.0, full.nf = 1;
    CHECK_OK(kiln_graph_add_node(g, KILN_OP_FULL, 0, NULL, &full, -1, &two));
    int32_t pair[2] = {w, two};
    CHECK_OK(kiln_graph_add_node(g, KILN_OP_MUL, 2, pair, NULL, -1, &y));
    CHECK_OK(kiln_graph_set_outputs(g, 1, &y));
    kiln_executable *s = NULL;
    CHECK_OK(kiln_compile(g, &(kiln_compile_options){.backend = "sink"}, &s));
    int64_t sx[2] = {4, 3}, st[2] = {3, 4}, sv[1] = {3};
    for (int strided = 0; strided < 2 && s; strided++) {
        kiln_tensor *xin, *base = NULL;
        if (strided) { /* the transpose of a (3, 4) tensor: same values, another layout */
            base = ramp(2, st, 0.0f);
            int64_t strides[2] = {1, 4};
            CHECK_OK(kiln_tensor_view(base, 2, sx, strides, 0, &xin));
        } else {
            xin = ramp(2, sx, 0.0f);
        }
        kiln_tensor *vin = ramp(1, sv, 9.0f), *out = NULL, *expect = NULL;
        CHECK_OK(kiln_tensor_empty(KILN_DTYPE_FLOAT32, 2, sx, &expect));
        for (int i = 0; i < 4; i++)
            for (int j = 0; j < 3; j++) {
                float xv = (float)kiln_tensor_get_double(xin, i * 3 + j);
                ((float *)expect->data)[i * 3 + j] = 2.0f * ((i == 1 || i == 2) ? ((float *)vin->data)[j] : xv);
            }
        int64_t version = kiln_tensor_version(xin);
        CHECK_OK(kiln_executable_run(s, 2, (kiln_tensor *[]){xin, vin}, 1, &out));
        CHECK(out && close_f32(out->data, expect->data, 12, 0.0f));
        CHECK(kiln_tensor_get_double(xin, 1 * 3 + 2) == (double)((float *)vin->data)[2]); /* written in place */
        CHECK(kiln_tensor_version(xin) > version);
        CHECK(kiln_executable_fallback_calls(s) == strided);
        kiln_tensor_release(expect);
        kiln_tensor_release(out), kiln_tensor_release(vin), kiln_tensor_release(xin), kiln_tensor_release(base);
    }
    kiln_executable_free(s);
    kiln_graph_free(g);
}

/* the O1 pipeline's fused group, run from the generated function */
static void test_fused_group(void) {
    kiln_graph *g = parse(
        "graph(%0: float32[64, 33], %1: float32[33], %2: float32[64, 1]) {\n"
        "  %3: float32[64, 33] = mul(%0, %1)\n"
        "  %4: float32[64, 33] = add(%3, %2)\n"
        "  %5: float32[64, 33] = gelu(%4)\n"
        "  %6: float32[64] = sum(%5) {2, 0}\n"
        "  %7: float32[64] = tanh(%6)\n"
        "  return (%7, %5)\n"
        "}\n");
    kiln_pass_options popt = {KILN_LEVEL_O1, false, false, KILN_CONV_FUSE_ALL, false};
    CHECK_OK(kiln_optimize(&g, &popt));
    char *text = kiln_graph_to_string(g);
    CHECK(text && strstr(text, "= fused("));
    free(text);
    kiln_executable *s = NULL;
    kiln_executable *e = NULL;
    CHECK_OK(kiln_compile(g, &(kiln_compile_options){.backend = "sink"}, &s));
    CHECK_OK(kiln_compile(g, NULL, &e));
    CHECK(s && kiln_executable_is_native(s));
    int64_t s0[2] = {64, 33}, s1[1] = {33}, s2[2] = {64, 1};
    kiln_tensor *in[3] = {ramp(2, s0, -1.0f), ramp(1, s1, 0.5f), ramp(2, s2, 0.1f)};
    kiln_tensor *os[2] = {0}, *ok[2] = {0};
    CHECK_OK(kiln_executable_run(s, 3, in, 2, os));
    CHECK_OK(kiln_executable_run(e, 3, in, 2, ok));
    /* the same generated group code either way (from the graph's function or kiln_fused_run) */
    CHECK(os[0] && ok[0] && equal_values(os[0], ok[0]) && equal_values(os[1], ok[1]));
    kiln_release_all(os, 2), kiln_release_all(ok, 2), kiln_release_all(in, 3);
    kiln_executable_free(s);
    kiln_executable_free(e);
    kiln_graph_free(g);
}

static void test_wrong_inputs(void) {
    kiln_graph *g = parse(SAMPLE_ABC);
    kiln_executable *s = NULL;
    CHECK_OK(kiln_compile(g, &(kiln_compile_options){.backend = "sink"}, &s));
    int64_t shape[2] = {3, 2};
    kiln_tensor *in[3] = {abc_input(0, 0), abc_input(1, 0), tensor_f32(2, shape, NULL)}, *out = NULL;
    CHECK_STATUS(kiln_executable_run(s, 3, in, 1, &out), KILN_ERR_VALUE);
    CHECK(strstr(kiln_last_error(), "input 2 is float32 (3, 2)"));
    CHECK_STATUS(kiln_executable_run(s, 2, in, 1, &out), KILN_ERR_VALUE);
    kiln_release_all(in, 3);
    kiln_executable_free(s);
    kiln_graph_free(g);
}

int main(void) {
    test_abc_and_views();
    test_in_place_write_of_an_input();
    test_fused_group();
    test_wrong_inputs();
    if (check_failures) {
        fprintf(stderr, "%d check(s) failed\n", check_failures);
        return 1;
    }
    printf("test_sink: ok\n");
    return 0;
}
