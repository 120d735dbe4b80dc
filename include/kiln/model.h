/* kiln — model files: a graph with its parameters, named inputs and outputs and embedded test
 * cases, saved by trace.dump / kiln.export and run without Python (kiln-run, the C API below).
 * The format is docs/model_format.md.
 *
 * Running a loaded model: kiln_compile(kiln_model_graph(m), ...) and kiln_executable_run with
 * tensors of the input metas (kiln_tensor_wrap wraps caller memory without copying).
 *
 * Every file is treated as hostile: each count, length, offset, dtype, shape, op and attribute is
 * range-checked before use; a bad file gives KILN_ERR_VALUE with a message starting "kiln file"
 * that names what is wrong (KILN_ERR_MEMORY when an allocation fails, KILN_ERR_RUNTIME when the
 * file cannot be opened or read), never a crash or an allocation larger than the file implies. */
#ifndef KILN_MODEL_H
#define KILN_MODEL_H

#include "kiln/graph.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KILN_MODEL_VERSION 2 /* written; version 1 files are read too */

/* ---- writing --------------------------------------------------------------------------- */

typedef struct kiln_model_desc {
    const kiln_graph *graph;          /* its captures become the file's parameters */
    const char *const *input_names;   /* graph->ninputs names, or NULL: "input0", "input1", ... */
    const char *const *output_names;  /* graph->noutputs names, or NULL: "output0", ... */
    const char *metadata;             /* free text (trace.dump writes JSON), or NULL */
    const char *user_info;            /* free text, or NULL */
    int32_t ncases;                   /* embedded test cases */
    kiln_tensor *const *cases;        /* ncases * (ninputs + noutputs): inputs then expected outputs */
    const char *name;                 /* the graph's name in its file (1-4096 bytes), or NULL: "graph" */
} kiln_model_desc;

/* The file's bytes (malloc'd, free with free()). The same description gives the same bytes. The
 * graph's value names, node names and priorities (kiln_graph_set_value_name, ...) are stored as
 * they are: trace.dump leaves on the graph what its keep_* options keep. The bytes are one graph's
 * record; a file may be several records one after the other (trace.dump's append=True). */
KILN_API kiln_status kiln_model_write(const kiln_model_desc *d, void **bytes, size_t *size);

/* ---- reading ----------------------------------------------------------------------------- */

typedef struct kiln_model kiln_model;

/* Reads the file into memory once (parameters are used in place in that copy, never mapped from the
 * file): rewriting, truncating or deleting the file afterwards changes nothing the model computes. */
KILN_API kiln_status kiln_model_load(const char *path, kiln_model **out);
/* From bytes in memory (copied). */
KILN_API kiln_status kiln_model_load_memory(const void *data, size_t size, kiln_model **out);
/* One graph of a file of several (trace.dump's append=True): the one named `name`, or, when name
 * is NULL, the one at `index` (0 is the first; the loaders above load it). Every record's header,
 * checksum and name is checked; an index or name the file does not hold is KILN_ERR_VALUE. */
KILN_API kiln_status kiln_model_load_graph(const char *path, int32_t index, const char *name, kiln_model **out);
KILN_API kiln_status kiln_model_load_memory_graph(const void *data, size_t size, int32_t index, const char *name,
                                                  kiln_model **out);
KILN_API void kiln_model_free(kiln_model *m);

/* The graph (owned by the model; its captured tensors view the model's copy of the file). */
KILN_API const kiln_graph *kiln_model_graph(const kiln_model *m);
KILN_API int32_t kiln_model_num_inputs(const kiln_model *m);
KILN_API int32_t kiln_model_num_outputs(const kiln_model *m);
KILN_API const char *kiln_model_input_name(const kiln_model *m, int32_t k);
KILN_API const char *kiln_model_output_name(const kiln_model *m, int32_t k);
KILN_API const kiln_meta *kiln_model_input_meta(const kiln_model *m, int32_t k);
KILN_API const kiln_meta *kiln_model_output_meta(const kiln_model *m, int32_t k);
/* Index of the input named `name`, or -1. */
KILN_API int32_t kiln_model_input_index(const kiln_model *m, const char *name);
/* The file's format version (1 or 2), this graph's name (version 1: "graph"), its position in the
 * file, and the file's graphs. */
KILN_API int32_t kiln_model_version(const kiln_model *m);
KILN_API const char *kiln_model_name(const kiln_model *m);
KILN_API int32_t kiln_model_index(const kiln_model *m);
KILN_API int32_t kiln_model_num_graphs(const kiln_model *m);
KILN_API const char *kiln_model_graph_name(const kiln_model *m, int32_t k);
/* The names the file keeps are the graph's (kiln_graph_value_name, kiln_graph_node_name,
 * kiln_graph_node_priority on kiln_model_graph(m)). */
KILN_API const char *kiln_model_producer(const kiln_model *m);
KILN_API const char *kiln_model_metadata(const kiln_model *m);  /* "" when none */
KILN_API const char *kiln_model_user_info(const kiln_model *m); /* "" when none */
/* Bytes of tensor data in the file (parameters and test cases) and of the parameters alone. */
KILN_API size_t kiln_model_data_bytes(const kiln_model *m);
KILN_API size_t kiln_model_param_bytes(const kiln_model *m);
KILN_API int32_t kiln_model_num_cases(const kiln_model *m);
/* Case c's input k / expected output k (borrowed; read-only). */
KILN_API kiln_tensor *kiln_model_case_input(const kiln_model *m, int32_t c, int32_t k);
KILN_API kiln_tensor *kiln_model_case_output(const kiln_model *m, int32_t c, int32_t k);

/* ---- checking results ---------------------------------------------------------------------- */

#ifdef __cplusplus
}
#endif
#endif
