/* The profiling recorder from C (what a C runtime such as kiln-run uses): nothing is recorded with
 * no session open; a session sees one kernel event per node per run on the kbk and sink backends,
 * with shapes and FLOPs; a while loop's body kernels nest in its node (depth 1); the Chrome Trace
 * JSON writer (kiln_profile_write_chrome) writes every event; the last session to close empties the
 * list. */
#define _POSIX_C_SOURCE 200809L

#include <unistd.h>

#include "check.h"
#include "sample_graphs.h"
#include "core/profile.h"

static kiln_executable *compile_text(const char *text, const char *backend) {
    kiln_graph *g = NULL;
    kiln_executable *e = NULL;
    CHECK_OK(kiln_graph_parse(text, &g));
    kiln_compile_options opt = {.backend = backend};
    CHECK_OK(kiln_compile(g, &opt, &e));
    kiln_graph_free(g);
    return e;
}

static size_t count_kernels(size_t mark, const char *name, int32_t source, int32_t depth) {
    kiln_profile_event *ev = NULL;
    size_t n = 0, found = 0;
    CHECK_OK(kiln_profile_events(mark, &ev, &n));
    for (size_t i = 0; i < n; i++)
        found += ev[i].kind == KILN_PROFILE_KERNEL && strcmp(ev[i].name, name) == 0 && ev[i].source == source &&
                 ev[i].depth == depth;
    kiln_profile_events_free(ev, n);
    return found;
}

static void test_backends(void) {
    int64_t shape[2] = {2, 3};
    float v[6] = {1, 2, 3, 4, 5, 6};
    kiln_tensor *in[3] = {tensor_f32(2, shape, v), tensor_f32(2, shape, v), tensor_f32(2, shape, v)};
    for (int b = 0; b < 2; b++) {
        kiln_executable *e = compile_text(SAMPLE_ABC, b ? "sink" : "kbk");
        int32_t source = b ? KILN_PROFILE_SINK : KILN_PROFILE_KBK;
        kiln_tensor *out = NULL;
        CHECK_OK(kiln_executable_run(e, 3, in, 1, &out)); /* no session: nothing recorded */
        kiln_tensor_release(out);
        size_t mark = kiln_profile_start();
        CHECK(mark == 0);
        for (int r = 0; r < 4; r++) {
            CHECK_OK(kiln_executable_run(e, 3, in, 1, &out));
            CHECK(((float *)out->data)[5] == 6 * 6 + 6);
            kiln_tensor_release(out);
        }
        CHECK(count_kernels(mark, "mul", source, 0) == 4 && count_kernels(mark, "add", source, 0) == 4);
        kiln_profile_event *ev = NULL;
        size_t n = 0;
        CHECK_OK(kiln_profile_events(mark, &ev, &n));
        for (size_t i = 0; i < n; i++) {
            if (ev[i].kind != KILN_PROFILE_KERNEL) continue;
            CHECK(strcmp(ev[i].inputs, "float32[2,3];float32[2,3]") == 0 && strcmp(ev[i].outputs, "float32[2,3]") == 0);
            CHECK(ev[i].flops == 6 && ev[i].bytes_read == 48 && ev[i].bytes_written == 24);
            CHECK(ev[i].end_ns >= ev[i].start_ns && ev[i].tid > 0);
        }
        kiln_profile_events_free(ev, n);
        kiln_profile_stop();
        CHECK_OK(kiln_profile_events(0, &ev, &n)); /* emptied */
        CHECK(n == 0);
        kiln_profile_events_free(ev, n);
        kiln_executable_free(e);
    }
    for (int k = 0; k < 3; k++) kiln_tensor_release(in[k]);
}

static void test_loop_nesting_and_json(void) {
    kiln_executable *e = compile_text(SAMPLE_COUNTING_LOOP, "kbk");
    float zero = 0, five = 5;
    kiln_tensor *in[2] = {tensor_f32(0, NULL, &zero), tensor_f32(0, NULL, &five)}, *out = NULL;
    size_t outer = kiln_profile_start(), mark = kiln_profile_start(); /* two sessions at once */
    CHECK(outer == mark);
    CHECK_OK(kiln_executable_run(e, 2, in, 1, &out));
    CHECK(out && *(float *)out->data == 5);
    kiln_tensor_release(out);
    CHECK(count_kernels(mark, "while", KILN_PROFILE_KBK, 0) == 1);
    CHECK(count_kernels(mark, "add", KILN_PROFILE_KBK, 1) == 5); /* the body ran 5 times inside the node */
    char path[64];
    snprintf(path, sizeof path, "/tmp/kiln-test-profile-%d.json", (int)getpid());
    CHECK_OK(kiln_profile_write_chrome(path, mark, KILN_PROFILE_WRITE_ALL));
    kiln_profile_stop();
    kiln_profile_event *ev = NULL;
    size_t n = 0, complete = 0;
    CHECK_OK(kiln_profile_events(mark, &ev, &n)); /* the outer session keeps the list */
    for (size_t i = 0; i < n; i++) complete += ev[i].kind != KILN_PROFILE_ALLOC;
    CHECK(n > 0);
    kiln_profile_events_free(ev, n);
    kiln_profile_stop();
    FILE *f = fopen(path, "r");
    CHECK(f != NULL);
    char buf[1 << 16];
    size_t len = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    buf[len] = '\0';
    if (f) fclose(f);
    unlink(path);
    size_t found = 0;
    for (const char *p = buf; (p = strstr(p, "\"ph\":\"X\"")); p++) found++;
    CHECK(strncmp(buf, "{\"displayTimeUnit\":\"ns\",\"traceEvents\":[", 38) == 0 && found == complete);
    CHECK(strstr(buf, "\"name\":\"while\"") && strstr(buf, "\"thread_name\""));
    CHECK_STATUS(kiln_profile_write_chrome("/nonexistent-dir/x.json", 0, KILN_PROFILE_WRITE_ALL), KILN_ERR_RUNTIME);
    kiln_tensor_release(in[0]), kiln_tensor_release(in[1]);
    kiln_executable_free(e);
}

int main(void) {
    test_backends();
    test_loop_nesting_and_json();
    return check_failures ? 1 : 0;
}
