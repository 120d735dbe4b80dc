/* kiln — public C API: every public header (status codes, dtypes and tensors in kiln/core.h; the op
 * table, autodiff, graphs, passes, sublinear memory, model files).
 *
 * Ownership: every function that returns a kiln_tensor ** gives the caller a new
 * reference; release it with kiln_tensor_release(). Functions taking tensors borrow them.
 */
#ifndef KILN_KILN_H
#define KILN_KILN_H

#include "kiln/core.h"
#include "kiln/ops.h"
#include "kiln/autograd.h"
#include "kiln/graph.h"
#include "kiln/passes.h"
#include "kiln/sublinear.h"
#include "kiln/model.h"

#endif
