/* The layout of kiln model files (docs/model_format.md), shared by the writer (model_write.c)
 * and the reader (model_read.c). */
#ifndef KILN_IR_MODEL_FORMAT_H
#define KILN_IR_MODEL_FORMAT_H

#include "../core/internal.h"
#include "kiln/model.h"

#define KILN_MODEL_MAGIC "KILNMDL\0"
#define KILN_MODEL_HEADER_BYTES 64
#define KILN_MODEL_DATA_ALIGN 64
/* header fields: byte offsets */
#define KILN_MODEL_AT_VERSION 8
#define KILN_MODEL_AT_FLAGS 12
#define KILN_MODEL_AT_FILE_SIZE 16 /* version 2: the size of this graph's record */
#define KILN_MODEL_AT_META_OFFSET 24
#define KILN_MODEL_AT_META_SIZE 32
#define KILN_MODEL_AT_DATA_OFFSET 40
#define KILN_MODEL_AT_DATA_SIZE 48
#define KILN_MODEL_AT_CHECKSUM 56

/* limits a reader enforces (a writer refuses to exceed them) */
#define KILN_MODEL_MAX_STRING (1 << 24)  /* bytes of one string */
#define KILN_MODEL_MAX_DEPTH 64          /* subgraphs nested in subgraphs */
#define KILN_MODEL_MAX_VALUES (1 << 22)  /* values of one graph */
#define KILN_MODEL_MAX_NAME 4096         /* bytes of a name (input, output, graph, value, node) */
#define KILN_MODEL_DEFAULT_NAME "graph"  /* a graph's name when the writer is given none */

/* capture kinds */
enum { KILN_MODEL_CONSTANT = 0, KILN_MODEL_CAPTURED = 1, KILN_MODEL_PARAMETER = 2 };

/* The file's checksum: four FNV-1a-64 lanes over the little-endian 64-bit words of the file
 * (word w into lane w % 4), the 8 checksum bytes read as zero and a short tail zero-padded to
 * a word, then combined (see docs/model_format.md). */
uint64_t kiln_model_checksum(const uint8_t *bytes, size_t size);

/* kiln_model_load_memory_graph by index, with the checksum check skippable (the fuzz harness reaches the parser
 * with it off). */
kiln_status kiln_model_load_bytes(const void *data, size_t size, bool check_sum, int32_t index, kiln_model **out);

static inline void kiln_put_u32(uint8_t *p, uint32_t v) {
    for (int k = 0; k < 4; k++) p[k] = (uint8_t)(v >> (8 * k));
}
static inline void kiln_put_u64(uint8_t *p, uint64_t v) {
    for (int k = 0; k < 8; k++) p[k] = (uint8_t)(v >> (8 * k));
}
static inline uint32_t kiln_get_u32(const uint8_t *p) {
    uint32_t v = 0;
    for (int k = 0; k < 4; k++) v |= (uint32_t)p[k] << (8 * k);
    return v;
}
static inline uint64_t kiln_get_u64(const uint8_t *p) {
    uint64_t v = 0;
    for (int k = 0; k < 8; k++) v |= (uint64_t)p[k] << (8 * k);
    return v;
}

#endif
