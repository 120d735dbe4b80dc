/* Model files (include/kiln/model.h) from C: a graph with a constant, a control-flow body and a
 * test case round-trips (same bytes written twice, same results, its value and node names and
 * priorities kept), every hostile variant of the file (each prefix, each byte flipped with and
 * without a repaired checksum, lying sizes, a corrupt names section) is refused with
 * KILN_ERR_VALUE or loads, never crashes, and a file of two graphs loads each by index and by
 * name. A model loaded from a path keeps computing what it loaded when the file is then rewritten,
 * scribbled over, truncated or deleted. Strings that are not UTF-8 are refused by the writer and
 * the reader. Runs under ASan/UBSan in CI too. */
#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>
#include <unistd.h>

#include "check.h"

#include "ir/model_format.h"

/* out = (x * c + y), c a captured [3] constant; plus x.sum() as a second output */
static kiln_graph *make_graph(void) {
    kiln_graph *g;
    CHECK_OK(kiln_graph_new(&g));
    kiln_meta m = {KILN_DTYPE_FLOAT32, 1, {3}};
    int32_t x, y, c, xc, out[2];
    CHECK_OK(kiln_graph_add_input(g, &m, &x));
    CHECK_OK(kiln_graph_add_input(g, &m, &y));
    kiln_tensor *t;
    int64_t shape[1] = {3};
    CHECK_OK(kiln_tensor_empty(KILN_DTYPE_FLOAT32, 1, shape, &t));
    for (int k = 0; k < 3; k++) ((float *)t->data)[k] = 0.5f * (float)(k + 1);
    CHECK_OK(kiln_graph_add_capture(g, t, true, &c));
    kiln_tensor_release(t);
    int32_t ins[2] = {x, c};
    CHECK_OK(kiln_graph_add_node(g, KILN_OP_MUL, 2, ins, NULL, -1, &xc));
    ins[0] = xc, ins[1] = y;
    CHECK_OK(kiln_graph_add_node(g, KILN_OP_ADD, 2, ins, NULL, -1, &out[0]));
    kiln_attrs a = {0};
    a.ni = 2, a.i[0] = 1, a.i[1] = 0; /* sum over axis 0 (bitmask), keepdims 0 */
    CHECK_OK(kiln_graph_add_node(g, KILN_OP_SUM, 1, &x, &a, -1, &out[1]));
    CHECK_OK(kiln_graph_set_outputs(g, 2, out));
    /* names as trace.dump keeps them: a parameter, user-set values, nodes and priorities */
    CHECK_OK(kiln_graph_set_value_name(g, c, "scale.weight"));
    CHECK_OK(kiln_graph_set_value_name(g, x, "x"));
    CHECK_OK(kiln_graph_set_value_name(g, out[0], "out"));
    CHECK_OK(kiln_graph_generate_names(g, true, true, true));
    return g;
}

static kiln_tensor *vec(float a, float b, float c) {
    kiln_tensor *t;
    int64_t shape[1] = {3};
    CHECK_OK(kiln_tensor_empty(KILN_DTYPE_FLOAT32, 1, shape, &t));
    float *d = t->data;
    d[0] = a, d[1] = b, d[2] = c;
    return t;
}

static void *write_named(const kiln_graph *g, const char *name, size_t *size) {
    kiln_tensor *x = vec(1, 2, 3), *y = vec(10, 20, 30), *o0 = vec(10.5f, 22, 34.5f), *o1;
    CHECK_OK(kiln_tensor_empty(KILN_DTYPE_FLOAT32, 0, NULL, &o1));
    *(float *)o1->data = 6;
    kiln_tensor *cases[4] = {x, y, o0, o1};
    const char *in_names[2] = {"x", "y"}, *out_names[2] = {"out", "total"};
    kiln_model_desc d = {g, in_names, out_names, "{\"k\": 1}", NULL, 1, cases, name};
    void *bytes = NULL;
    CHECK_OK(kiln_model_write(&d, &bytes, size));
    for (int k = 0; k < 4; k++) kiln_tensor_release(cases[k]);
    return bytes;
}

static void *write_file(const kiln_graph *g, size_t *size) { return write_named(g, NULL, size); }

static void check_names(const kiln_graph *g) {
    CHECK(strcmp(kiln_graph_value_name(g, 2), "scale.weight") == 0); /* file ids: x, y, the capture, ... */
    CHECK(strcmp(kiln_graph_value_name(g, 0), "x") == 0 && kiln_graph_value_name(g, 1) == NULL);
    CHECK(strcmp(kiln_graph_value_name(g, 3), "mul0") == 0 && strcmp(kiln_graph_value_name(g, 4), "out") == 0);
    CHECK(strcmp(kiln_graph_node_name(g, 0), "mul(x)[0]") == 0 && strcmp(kiln_graph_node_name(g, 1), "add(mul0)[1]") == 0);
    for (int32_t i = 0; i < g->nnodes; i++) CHECK(kiln_graph_node_priority(g, i) == i + 1);
}

static void test_round_trip(const uint8_t *file, size_t size, const kiln_graph *g) {
    size_t size2;
    void *again = write_file(g, &size2);
    CHECK(size2 == size && memcmp(again, file, size) == 0); /* deterministic */
    free(again);
    kiln_model *m = NULL;
    CHECK_OK(kiln_model_load_memory(file, size, &m));
    if (!m) return;
    CHECK(kiln_model_num_inputs(m) == 2 && kiln_model_num_outputs(m) == 2);
    CHECK(strcmp(kiln_model_input_name(m, 1), "y") == 0 && strcmp(kiln_model_output_name(m, 1), "total") == 0);
    CHECK(kiln_model_input_index(m, "x") == 0 && kiln_model_input_index(m, "z") == -1);
    CHECK(strcmp(kiln_model_metadata(m), "{\"k\": 1}") == 0 && strcmp(kiln_model_user_info(m), "") == 0);
    CHECK(kiln_model_param_bytes(m) == 12);
    CHECK(kiln_model_num_cases(m) == 1);
    CHECK(kiln_model_version(m) == KILN_MODEL_VERSION && strcmp(kiln_model_name(m), "graph") == 0);
    CHECK(kiln_model_num_graphs(m) == 1 && kiln_model_index(m) == 0);
    check_names(kiln_model_graph(m));
    kiln_executable *e = NULL;
    CHECK_OK(kiln_compile(kiln_model_graph(m), NULL, &e));
    kiln_tensor *in[2] = {kiln_model_case_input(m, 0, 0), kiln_model_case_input(m, 0, 1)}, *out[2] = {0};
    CHECK_OK(kiln_executable_run(e, 2, in, 2, out));
    for (int k = 0; k < 2 && out[k]; k++) {
        double abs_err, rel_err;
        CHECK_OK(kiln_tensor_max_error(out[k], kiln_model_case_output(m, 0, k), &abs_err, &rel_err));
        CHECK(abs_err == 0 && rel_err == 0);
        kiln_tensor_release(out[k]);
    }
    /* parameters and cases view the file read-only */
    CHECK(kiln_tensor_is_read_only(kiln_model_case_input(m, 0, 0)));
    kiln_executable_free(e);
    kiln_model_free(m);
}

static void expect_refused(const uint8_t *bytes, size_t size, bool check_sum, const char *want) {
    kiln_model *m = NULL;
    kiln_status s = kiln_model_load_bytes(bytes, size, check_sum, 0, &m);
    if (s == KILN_OK) {
        CHECK(want == NULL); /* a mutation that still describes a valid model */
        kiln_model_free(m);
        return;
    }
    CHECK(s == KILN_ERR_VALUE && m == NULL);
    if (want && !strstr(kiln_last_error(), want)) {
        fprintf(stderr, "  message: %s\n  expected: %s\n", kiln_last_error(), want);
        CHECK(0);
    }
}

static void set_u64(uint8_t *b, size_t at, uint64_t v, size_t size) {
    kiln_put_u64(b + at, v);
    kiln_put_u64(b + KILN_MODEL_AT_CHECKSUM, kiln_model_checksum(b, size));
}

static void test_hostile(const uint8_t *file, size_t size) {
    uint8_t *b = malloc(size);
    if (!b) exit(2);
    for (size_t n = 0; n < size; n++) expect_refused(file, n, true, n < 64 ? "truncated" : "kiln file");
    for (size_t k = 0; k < size; k++) {
        if (k >= KILN_MODEL_AT_CHECKSUM && k < KILN_MODEL_AT_CHECKSUM + 8) continue;
        memcpy(b, file, size);
        b[k] ^= 0x5a;
        expect_refused(b, size, true, "kiln file");
        kiln_put_u64(b + KILN_MODEL_AT_CHECKSUM, kiln_model_checksum(b, size));
        expect_refused(b, size, true, NULL); /* past the checksum: an error, or a file that still loads */
    }
    memcpy(b, file, size);
    memcpy(b, "KILNXXX", 7);
    expect_refused(b, size, true, "wrong magic");
    memcpy(b, file, size);
    kiln_put_u32(b + KILN_MODEL_AT_VERSION, 3);
    expect_refused(b, size, true, "format version 3; this kiln reads versions 1 and 2");
    memcpy(b, file, size);
    b[100] ^= 1;
    expect_refused(b, size, true, "checksum mismatch");
    memcpy(b, file, size);
    set_u64(b, KILN_MODEL_AT_META_SIZE, UINT64_MAX - 10, size);
    expect_refused(b, size, true, "runs past the end of the file");
    memcpy(b, file, size);
    set_u64(b, KILN_MODEL_AT_DATA_SIZE, 1u << 30, size);
    expect_refused(b, size, true, "data section");
    /* mul's second input rewired from the captured constant (value 2) to x: the capture is unread */
    static const uint8_t mul_reads_c[] = {'m', 'u', 'l', 2, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0};
    size_t at = 0;
    while (at + sizeof mul_reads_c <= size && memcmp(file + at, mul_reads_c, sizeof mul_reads_c) != 0) at++;
    CHECK(at + sizeof mul_reads_c <= size);
    if (at + sizeof mul_reads_c <= size) {
        memcpy(b, file, size);
        kiln_put_u32(b + at + 11, 0);
        kiln_put_u64(b + KILN_MODEL_AT_CHECKSUM, kiln_model_checksum(b, size));
        expect_refused(b, size, true, "capture 0 is never read");
    }
    memcpy(b, file, size);
    kiln_put_u32(b + 64, 0x7fffffff); /* the producer string's length */
    kiln_put_u64(b + KILN_MODEL_AT_CHECKSUM, kiln_model_checksum(b, size));
    expect_refused(b, size, true, "the producer at offset 64 is 2147483647, at most");
    /* the names section (its value name "out", the last "out" of the metadata): a NUL in the name, and
     * its value id out of range */
    static const uint8_t out_name[] = {3, 0, 0, 0, 'o', 'u', 't'};
    at = size;
    for (size_t k = size - sizeof out_name; k-- > 64;) /* the last "out": the names section's */
        if (memcmp(file + k, out_name, sizeof out_name) == 0) {
            at = k;
            break;
        }
    CHECK(at < size);
    if (at < size) {
        memcpy(b, file, size);
        memcpy(b + at + 4, "x\0\0", 3); /* a NUL in a name */
        kiln_put_u64(b + KILN_MODEL_AT_CHECKSUM, kiln_model_checksum(b, size));
        expect_refused(b, size, true, "holds a NUL byte");
        memcpy(b, file, size);
        kiln_put_u32(b + at - 4, 0x40000); /* the value id: past the graph's values */
        kiln_put_u64(b + KILN_MODEL_AT_CHECKSUM, kiln_model_checksum(b, size));
        expect_refused(b, size, true, "value name");
    }
    free(b);
}

/* Two graphs in one file (trace.dump's append=True): each by index and by name; duplicate names,
 * missing graphs and a version 1 record after the first are refused. */
static void test_two_graphs(const kiln_graph *g) {
    size_t n1, n2;
    uint8_t *a = write_named(g, "first", &n1), *b = write_named(g, "second", &n2);
    CHECK(n1 % 64 == 0 && n2 % 64 == 0);
    uint8_t *both = malloc(n1 + n2);
    if (!both) exit(2);
    memcpy(both, a, n1), memcpy(both + n1, b, n2);
    kiln_model *m = NULL;
    CHECK_OK(kiln_model_load_memory_graph(both, n1 + n2, 1, NULL, &m));
    if (m) {
        CHECK(kiln_model_num_graphs(m) == 2 && kiln_model_index(m) == 1 && strcmp(kiln_model_name(m), "second") == 0);
        CHECK(strcmp(kiln_model_graph_name(m, 0), "first") == 0);
        check_names(kiln_model_graph(m));
        kiln_model_free(m);
    }
    CHECK_OK(kiln_model_load_memory_graph(both, n1 + n2, 7, "first", &m));
    if (m) CHECK(kiln_model_index(m) == 0 && strcmp(kiln_model_name(m), "first") == 0);
    kiln_model_free(m);
    m = NULL;
    CHECK_STATUS(kiln_model_load_memory_graph(both, n1 + n2, 2, NULL, &m), KILN_ERR_VALUE);
    CHECK(strstr(kiln_last_error(), "no graph 2 (the file holds 2)") != NULL);
    CHECK_STATUS(kiln_model_load_memory_graph(both, n1 + n2, 0, "third", &m), KILN_ERR_VALUE);
    CHECK(strstr(kiln_last_error(), "no graph named 'third'") != NULL);
    expect_refused(both, n1 + n2 - 64, true, "truncated"); /* the second record cut short */
    memcpy(both + n1, a, n1); /* "first" twice (n1 == n2: the same graph) */
    CHECK(n1 == n2);
    expect_refused(both, n1 + n2, true, "two graphs are named 'first'");
    free(a), free(b), free(both);
}

/* The case's outputs of m, run now, equal its expected ones bit for bit. */
static void check_runs_as_loaded(const kiln_model *m) {
    kiln_executable *e = NULL;
    CHECK_OK(kiln_compile(kiln_model_graph(m), NULL, &e));
    if (!e) return;
    kiln_tensor *in[2] = {kiln_model_case_input(m, 0, 0), kiln_model_case_input(m, 0, 1)}, *out[2] = {0};
    CHECK_OK(kiln_executable_run(e, 2, in, 2, out));
    float want[3] = {10.5f, 22, 34.5f};
    CHECK(out[0] && memcmp(out[0]->data, want, sizeof want) == 0);
    CHECK(out[1] && *(float *)out[1]->data == 6);
    for (int k = 0; k < 2; k++) kiln_tensor_release(out[k]);
    kiln_executable_free(e);
}

/* Loaded from a path, then the file rewritten in place (every byte changed), truncated and
 * deleted: the model still computes what it loaded, and never faults on its parameters. */
static void test_file_changes_after_load(const uint8_t *file, size_t size) {
    char path[] = "/tmp/kiln-model-XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    if (fd < 0) return;
    CHECK(write(fd, file, size) == (ssize_t)size);
    kiln_model *m = NULL;
    CHECK_OK(kiln_model_load(path, &m));
    if (m) {
        check_runs_as_loaded(m);
        uint8_t *scribble = malloc(size);
        if (!scribble) exit(2);
        memset(scribble, 0x7f, size); /* float32 NaN-free junk: 0x7f7f7f7f is a large finite number */
        CHECK(pwrite(fd, scribble, size, 0) == (ssize_t)size);
        free(scribble);
        check_runs_as_loaded(m);
        CHECK(ftruncate(fd, 16) == 0); /* a shared mapping's later reads would fault (SIGBUS) */
        check_runs_as_loaded(m);
        CHECK(unlink(path) == 0);
        check_runs_as_loaded(m);
        /* its parameters and cases still read as they were loaded */
        CHECK(*(float *)kiln_model_case_input(m, 0, 0)->data == 1);
        kiln_model_free(m);
    } else {
        unlink(path);
    }
    close(fd);
}

/* Names and texts that are not UTF-8: the writer refuses them, and so does the reader (a file
 * whose name bytes were changed). */
static void test_not_utf8(const kiln_graph *g, const uint8_t *file, size_t size) {
    const char *ins[2] = {"x", "y\xff"}, *outs[2] = {"out", "total"};
    kiln_model_desc d = {g, ins, outs, NULL, NULL, 0, NULL, NULL};
    void *bytes = NULL;
    size_t n = 0;
    CHECK_STATUS(kiln_model_write(&d, &bytes, &n), KILN_ERR_VALUE);
    CHECK(strstr(kiln_last_error(), "input name 1 is not UTF-8 text") != NULL);
    ins[1] = "y", d.metadata = "\xc0\xaf"; /* an overlong '/' */
    CHECK_STATUS(kiln_model_write(&d, &bytes, &n), KILN_ERR_VALUE);
    CHECK(strstr(kiln_last_error(), "the metadata is not UTF-8 text") != NULL);
    d.metadata = NULL, d.name = "\xed\xa0\x80"; /* a UTF-16 surrogate */
    CHECK_STATUS(kiln_model_write(&d, &bytes, &n), KILN_ERR_VALUE);
    CHECK(bytes == NULL);
    d.name = NULL, outs[1] = "x";
    CHECK_STATUS(kiln_model_write(&d, &bytes, &n), KILN_ERR_VALUE);
    CHECK(strstr(kiln_last_error(), "an input and an output are both named 'x'") != NULL);
    uint8_t *bad = malloc(size);
    if (!bad) exit(2);
    memcpy(bad, file, size);
    const uint8_t total[9] = {5, 0, 0, 0, 't', 'o', 't', 'a', 'l'};
    uint8_t *at = NULL;
    for (size_t k = 0; k + sizeof total <= size && !at; k++)
        if (memcmp(bad + k, total, sizeof total) == 0) at = bad + k;
    CHECK(at != NULL);
    if (at) {
        at[6] = 0xff;
        expect_refused(bad, size, false, "output 1 at offset");
        CHECK(strstr(kiln_last_error(), "is not UTF-8 text") != NULL);
    }
    free(bad);
}

int main(void) {
    kiln_graph *g = make_graph();
    size_t size = 0;
    uint8_t *file = write_file(g, &size);
    if (!file) return 1;
    test_round_trip(file, size, g);
    test_hostile(file, size);
    test_two_graphs(g);
    test_file_changes_after_load(file, size);
    test_not_utf8(g, file, size);
    /* the writer refuses what a reader would: two nodes of one name, an empty or over-long graph name */
    kiln_graph *dup;
    CHECK_OK(kiln_graph_clone(g, &dup));
    CHECK_OK(kiln_graph_set_node_name(dup, 1, kiln_graph_node_name(dup, 0)));
    void *bytes = NULL;
    size_t n = 0;
    kiln_model_desc d = {dup, NULL, NULL, NULL, NULL, 0, NULL, NULL};
    CHECK_STATUS(kiln_model_write(&d, &bytes, &n), KILN_ERR_VALUE);
    CHECK(strstr(kiln_last_error(), "two nodes are named 'mul(x)[0]'") != NULL);
    char long_name[KILN_MODEL_MAX_NAME + 2];
    memset(long_name, 'a', sizeof long_name - 1);
    long_name[sizeof long_name - 1] = '\0';
    d.graph = g, d.name = long_name;
    CHECK_STATUS(kiln_model_write(&d, &bytes, &n), KILN_ERR_VALUE);
    CHECK(bytes == NULL);
    kiln_graph_free(dup);
    kiln_model *m = NULL;
    CHECK_STATUS(kiln_model_load("/nonexistent/model.kiln", &m), KILN_ERR_RUNTIME);
    free(file);
    kiln_graph_free(g);
    CHECK_DONE();
}
