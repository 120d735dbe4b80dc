/* Kernels that compute in another dtype than their tensors': contiguous inputs and output
 * buffers in the compute dtype, and the results stored back (norm.c, attention.c). */
#include "compute_buffers.h"

/* Contiguous copies of in[0..n) in dtype ct (new references; no copy when already so). */
kiln_status kiln_load_compute(kiln_tensor *const *in, int n, kiln_dtype ct, kiln_tensor **c) {
    for (int k = 0; k < n; k++) c[k] = NULL;
    for (int k = 0; k < n; k++) {
        kiln_status s = kiln_to_contiguous(in[k], ct, &c[k]);
        if (s != KILN_OK) {
            kiln_release_all(c, n);
            return s;
        }
    }
    return KILN_OK;
}

/* Where a kernel writes out[k]: out[k] itself when it has dtype ct, else a temporary that
 * kiln_store_compute converts back. */
kiln_status kiln_compute_outputs(kiln_tensor **out, int n, kiln_dtype ct, kiln_tensor **buf) {
    for (int k = 0; k < n; k++) buf[k] = NULL;
    for (int k = 0; k < n; k++) {
        kiln_status s = KILN_OK;
        if (out[k]->meta.dtype == ct) {
            kiln_tensor_retain(out[k]);
            buf[k] = out[k];
        } else {
            s = kiln_tensor_empty(ct, out[k]->meta.ndim, out[k]->meta.shape, &buf[k]);
        }
        if (s != KILN_OK) {
            kiln_release_all(buf, n);
            return s;
        }
    }
    return KILN_OK;
}

kiln_status kiln_store_compute(kiln_tensor **out, int n, kiln_tensor **buf) {
    kiln_status s = KILN_OK;
    for (int k = 0; k < n; k++)
        if (buf[k] != out[k] && s == KILN_OK) s = kiln_copy_into(out[k], buf[k]);
    kiln_release_all(buf, n);
    return s;
}
