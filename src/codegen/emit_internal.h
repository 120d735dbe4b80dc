/* Helpers shared by the C emitters of elementwise kernels (emit_c.c) and row kernels
 * (emit_rows.c). */
#ifndef KILN_EMIT_INTERNAL_H
#define KILN_EMIT_INTERNAL_H

#include "../core/strbuf.h"
#include "../ir/fusion.h"
#include "codegen.h"

#define KILN_PARALLEL_MIN 32768 /* elements below which a kernel stays on one thread */

/* Whether the code calls libm functions beyond exp, erf, tanh and log, whose float32 versions
 * every prelude holds (src/core/approx_f32.h): the prelude then maps their names for float. */
enum { KILN_USE_LIBM = 1 };

const char *kiln_cg_c_type(kiln_dtype d); /* NULL: not generated */
bool kiln_cg_is_float(kiln_dtype d);
void kiln_cg_put_double(kiln_strbuf *t, double v);
/* `static const int64_t KILN_SYM_isz[]`: the item sizes of the output and of each input. */
void kiln_cg_put_item_sizes(kiln_strbuf *t, const kiln_graph *g);
/* The uses of the elementwise expressions of sub's nodes (their ops' KILN_OPF_LIBM flags). */
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
