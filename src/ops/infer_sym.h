/* Symbolic shape inference by the op table's KILN_SYM rules (src/ops/infer_sym.c). */
#ifndef KILN_INFER_SYM_H
#define KILN_INFER_SYM_H

#include "../core/symdim.h"

/* Whether op has a KILN_SYM line. */
bool kiln_op_has_sym_rule(kiln_op op);
/* The symbolic shapes of op's nout outputs into out, from its inputs' symbolic shapes `in`, its
 * attributes `a` and those as sizes `ai` (a->ni of them: constants, or expressions where a size
 * attribute is symbolic), given `concrete`, the outputs kiln_infer gave at the hints (checked
 * against). KILN_ERR_VALUE naming the op and the symbolic shapes when op has no rule or the
 * rule cannot show its conditions hold for every value of the symbols. */
kiln_status kiln_infer_sym(kiln_symtab *t, kiln_op op, int nin, const kiln_sshape *in, const kiln_attrs *a,
                           const kiln_sdim *ai, int nout, const kiln_meta *concrete, kiln_sshape *out);

#endif
