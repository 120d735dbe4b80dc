/* libFuzzer harness for the model file loader (src/ir/model_read.c): any bytes either load or fail
 * with KILN_ERR_VALUE (KILN_ERR_MEMORY when an allocation fails), leaving nothing allocated. The
 * bytes are loaded twice: as they are (the header and checksum checks), and with the checksum
 * check off, so that mutations reach the metadata parser behind it. Each graph of a file that loads
 * is written again from its graph, names and test cases, and that must load to the same graph
 * (compared by what its values are, kiln_graph_diff_*, and by its value and node names and
 * priorities), with a writer's output a fixed point. Bytes that load are also written to a file and
 * loaded from its path; the file is then rewritten (every byte changed) and truncated before the
 * model runs: its tensors must still be the bytes loaded, and running it must not fault. Built and run
 * by scripts/fuzz.sh (corpus: tests/fuzz/corpus_model, made by tests/fuzz/make_model_corpus.py). */
#define _POSIX_C_SOURCE 200809L
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ir/compare.h"
#include "ir/model_format.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_failure(kiln_status s, const kiln_model *m) {
    if ((s != KILN_ERR_VALUE && s != KILN_ERR_MEMORY) || m != NULL) {
        fprintf(stderr, "kiln_model_load: status %d (model %p): %s\n", (int)s, (const void *)m, kiln_last_error());
        abort();
    }
}

/* The file m's description writes. */
static void *rewrite(const kiln_model *m, size_t *size) {
    int32_t nin = kiln_model_num_inputs(m), nout = kiln_model_num_outputs(m), nc = kiln_model_num_cases(m);
    const char **names = malloc(sizeof *names * (size_t)(nin + nout + 1));
    kiln_tensor **cases = malloc(sizeof *cases * ((size_t)nc * (size_t)(nin + nout) + 1));
    if (!names || !cases) abort();
    for (int32_t k = 0; k < nin; k++) names[k] = kiln_model_input_name(m, k);
    for (int32_t k = 0; k < nout; k++) names[nin + k] = kiln_model_output_name(m, k);
    for (int32_t c = 0; c < nc; c++)
        for (int32_t k = 0; k < nin + nout; k++)
            cases[(size_t)c * (size_t)(nin + nout) + (size_t)k] =
                k < nin ? kiln_model_case_input(m, c, k) : kiln_model_case_output(m, c, k - nin);
    kiln_model_desc d = {kiln_model_graph(m), names, names + nin, kiln_model_metadata(m), kiln_model_user_info(m), nc, cases,
                         kiln_model_name(m)};
    void *bytes = NULL;
    kiln_status s = kiln_model_write(&d, &bytes, size);
    free(names), free(cases);
    if (s == KILN_ERR_MEMORY) return NULL;
    if (s != KILN_OK) {
        fprintf(stderr, "a loaded model does not write: %s\n", kiln_last_error());
        abort();
    }
    return bytes;
}

static bool same_str(const char *a, const char *b) { return a == b || (a && b && strcmp(a, b) == 0); }

/* The same value names, node names and priorities. */
static bool same_names(const kiln_graph *a, const kiln_graph *b) {
    if (a->nvalues != b->nvalues || a->nnodes != b->nnodes) return false;
    for (int32_t v = 0; v < a->nvalues; v++)
        if (!same_str(kiln_graph_value_name(a, v), kiln_graph_value_name(b, v))) return false;
    for (int32_t i = 0; i < a->nnodes; i++)
        if (!same_str(kiln_graph_node_name(a, i), kiln_graph_node_name(b, i)) ||
            kiln_graph_node_priority(a, i) != kiln_graph_node_priority(b, i))
            return false;
    return true;
}

/* Graph k of the file, loaded with the checksum check off, written again: the same graph and names,
 * and writing it a fixed point. Returns the number of graphs in the file (0: it does not load). */
static int32_t round_trip(const uint8_t *data, size_t size, int32_t k) {
    kiln_model *m = NULL;
    kiln_status s = kiln_model_load_bytes(data, size, false, k, &m);
    if (s != KILN_OK) {
        check_failure(s, m);
        return 0;
    }
    int32_t ngraphs = kiln_model_num_graphs(m);
    if (kiln_model_index(m) != k || ngraphs <= k) {
        fprintf(stderr, "graph %d loads as graph %d of %d\n", (int)k, (int)kiln_model_index(m), (int)ngraphs);
        abort();
    }
    size_t n1 = 0, n2 = 0;
    void *b1 = rewrite(m, &n1);
    kiln_model *again = NULL;
    if (b1 && kiln_model_load_memory(b1, n1, &again) != KILN_OK) {
        fprintf(stderr, "a rewritten model does not load: %s\n", kiln_last_error());
        abort();
    }
    if (again) {
        kiln_graph_diff d;
        if (kiln_graph_diff_ops(kiln_model_graph(m), kiln_model_graph(again), &d) ||
            kiln_graph_diff_outputs(kiln_model_graph(m), kiln_model_graph(again), &d)) {
            fprintf(stderr, "a rewritten model loads to another graph\n");
            abort();
        }
        if (!same_names(kiln_model_graph(m), kiln_model_graph(again)) ||
            strcmp(kiln_model_name(m), kiln_model_name(again)) != 0) {
            fprintf(stderr, "a rewritten model loads with other names\n");
            abort();
        }
        void *b2 = rewrite(again, &n2);
        if (b2 && (n1 != n2 || memcmp(b1, b2, n1) != 0)) {
            fprintf(stderr, "writing a model is not a fixed point\n");
            abort();
        }
        free(b2);
    }
    free(b1);
    kiln_model_free(again);
    kiln_model_free(m);
    return ngraphs;
}

/* Tensors a and b hold the same bytes. */
static bool same_tensor(const kiln_tensor *a, const kiln_tensor *b) {
    return kiln_meta_equal(&a->meta, &b->meta) &&
           memcmp(a->data, b->data, (size_t)a->numel * kiln_dtype_size(a->meta.dtype)) == 0;
}

/* A graph small and plain enough to run here: no control flow (a fuzzed loop may never end), no
 * value of more than 4096 elements. */
static bool small_graph(const kiln_graph *g) {
    if (g->nsubgraphs) return false;
    for (int32_t v = 0; v < g->nvalues; v++)
        if (kiln_meta_numel(&g->values[v].meta) > 4096) return false;
    return true;
}

/* The file the bytes are written to (one per fuzzing process, unlinked at once: its path is
 * /proc/self/fd/N), or -1 when none could be made. */
static int scratch_file(char *path, size_t size) {
    static int fd = -2;
    if (fd == -2) {
        char name[] = "/tmp/kiln-fuzz-model-XXXXXX";
        fd = mkstemp(name);
        if (fd >= 0) unlink(name);
    }
    snprintf(path, size, "/proc/self/fd/%d", fd);
    return fd;
}

/* `mem`, loaded from memory, loaded again from a file holding the same bytes; the file is then
 * rewritten and truncated: the model from the file still has mem's tensors, and runs. */
static void check_file_changes(const uint8_t *data, size_t size, const kiln_model *mem) {
    char path[64];
    int fd = scratch_file(path, sizeof path);
    if (fd < 0 || ftruncate(fd, 0) != 0 || pwrite(fd, data, size, 0) != (ssize_t)size) return;
    kiln_model *m = NULL;
    kiln_status s = kiln_model_load(path, &m);
    if (s == KILN_ERR_MEMORY) return;
    if (s != KILN_OK) {
        fprintf(stderr, "bytes that load from memory do not load from a file: %s\n", kiln_last_error());
        abort();
    }
    uint8_t *junk = malloc(size ? size : 1);
    if (!junk) abort();
    for (size_t k = 0; k < size; k++) junk[k] = (uint8_t)~data[k];
    if (pwrite(fd, junk, size, 0) != (ssize_t)size || ftruncate(fd, (off_t)(size / 3)) != 0) abort();
    free(junk);
    int32_t nin = kiln_model_num_inputs(m), nout = kiln_model_num_outputs(m);
    for (int32_t c = 0; c < kiln_model_num_cases(m); c++)
        for (int32_t k = 0; k < nin + nout; k++) {
            const kiln_tensor *a = k < nin ? kiln_model_case_input(m, c, k) : kiln_model_case_output(m, c, k - nin);
            const kiln_tensor *b = k < nin ? kiln_model_case_input(mem, c, k) : kiln_model_case_output(mem, c, k - nin);
            if (!same_tensor(a, b)) {
                fprintf(stderr, "a model loaded from a file changed when the file did\n");
                abort();
            }
        }
    const kiln_graph *g = kiln_model_graph(m), *gm = kiln_model_graph(mem);
    for (int32_t k = 0; k < g->ncaptures; k++)
        if (!same_tensor(g->values[g->captures[k]].bound, gm->values[gm->captures[k]].bound)) {
            fprintf(stderr, "a model loaded from a file changed when the file did\n");
            abort();
        }
    kiln_executable *e = NULL;
    if (kiln_model_num_cases(m) > 0 && small_graph(g) && kiln_compile(g, NULL, &e) == KILN_OK) {
        kiln_tensor **in = calloc((size_t)nin + 1, sizeof *in), **out = calloc((size_t)nout + 1, sizeof *out);
        if (!in || !out) abort();
        for (int32_t k = 0; k < nin; k++) in[k] = kiln_model_case_input(m, 0, k);
        if (kiln_executable_run(e, nin, in, nout, out) == KILN_OK)
            for (int32_t k = 0; k < nout; k++) kiln_tensor_release(out[k]);
        free(in), free(out);
        kiln_executable_free(e);
    }
    kiln_model_free(m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    kiln_model *m = NULL;
    kiln_status s = kiln_model_load_memory(data, size, &m);
    if (s != KILN_OK) check_failure(s, m);
    else check_file_changes(data, size, m);
    kiln_model_free(m);
    int32_t ngraphs = round_trip(data, size, 0);
    for (int32_t k = 1; k < ngraphs && k < 4; k++) round_trip(data, size, k);
    return 0;
}
