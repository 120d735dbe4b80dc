/* Inputs and outputs of kernels that compute in a dtype of their own (float32 for 16-bit floats). */
#ifndef KILN_OPS_COMPUTE_BUFFERS_H
#define KILN_OPS_COMPUTE_BUFFERS_H

#include "../core/internal.h"

/* Contiguous copies of in[0..n) in dtype ct (new references; no copy when already so). */
kiln_status kiln_load_compute(kiln_tensor *const *in, int n, kiln_dtype ct, kiln_tensor **c);
/* Where a kernel writes out[k]: out[k] itself when it has dtype ct, else a temporary that
 * kiln_store_compute converts back. */
kiln_status kiln_compute_outputs(kiln_tensor **out, int n, kiln_dtype ct, kiln_tensor **buf);
/* Copies the temporaries into out[0..n) and releases buf[0..n). */
kiln_status kiln_store_compute(kiln_tensor **out, int n, kiln_tensor **buf);

#endif
