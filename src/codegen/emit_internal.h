/* Helpers shared by the C emitters of elementwise kernels (emit_c.c) and row kernels
 * (emit_rows.c). */
#ifndef KILN_EMIT_INTERNAL_H
#define KILN_EMIT_INTERNAL_H

#include "../core/strbuf.h"
#include "../ir/fusion.h"
#include "codegen.h"

#define KILN_PARALLEL_MIN 32768 /* elements below which a kernel stays on one thread */

/* Which libm names the code calls (the prelude defines vectorizable float32 versions). */
enum { KILN_USE_EXP = 1, KILN_USE_ERF = 2, KILN_USE_TANH = 4, KILN_USE_LOG = 8, KILN_USE_LIBM = 16 };

const char *kiln_cg_c_type(kiln_dtype d); /* NULL: not generated */
bool kiln_cg_is_float(kiln_dtype d);
void kiln_cg_put_double(kiln_strbuf *t, double v);
/* `static const int64_t KILN_SYM_isz[]`: the item sizes of the output and of each input. */
void kiln_cg_put_item_sizes(kiln_strbuf *t, const kiln_graph *g);
/* The uses of the elementwise expressions of sub's nodes (their ops' KILN_OPF_ math flags). */
unsigned kiln_cg_uses(const kiln_graph *sub);
void kiln_cg_prelude(kiln_strbuf *t, unsigned uses);
/* `const T a = <value v as T>;`-style operand text: value v of g held in variable `name`,
 * converted to compute type ct (as kiln_copy_into converts). */
void kiln_cg_put_converted(kiln_strbuf *t, const char *name, kiln_dtype d, kiln_dtype ct);
/* The statement computing node i's expression over operand names a, b, c into variable out. */
void kiln_cg_put_expr(kiln_strbuf *t, const kiln_graph *g, int32_t i, const char *const *operands, const char *out);

/* The body of a row kernel (emit_rows.c): KILN_SYM stands for the function's name. */
void kiln_cg_emit_rows(kiln_strbuf *t, const kiln_graph *sub, const int8_t *kinds);

#endif
