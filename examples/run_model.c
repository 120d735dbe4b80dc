/* The smallest use of kiln's C runtime: load a model file, list its inputs and outputs, run
 * each embedded test case and compare the outputs with the expected ones. No Python.
 *
 *   cc run_model.c -Iinclude -Lbuild -lkiln -o run_model && ./run_model model.kiln
 *
 * Exit status 0 when every case matches (relative error <= 1e-3; 1e-1 for float16 outputs), 1
 * otherwise. */
#include <stdio.h>
#include <stdlib.h>

#include "kiln/kiln.h"

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s MODEL\n", argv[0]);
        return 2;
    }
    kiln_model *m;
    if (kiln_model_load(argv[1], &m) != KILN_OK) {
        fprintf(stderr, "%s\n", kiln_last_error());
        return 2;
    }
    int32_t nin = kiln_model_num_inputs(m), nout = kiln_model_num_outputs(m);
    for (int32_t k = 0; k < nin; k++) printf("input %s\n", kiln_model_input_name(m, k));
    for (int32_t k = 0; k < nout; k++) printf("output %s\n", kiln_model_output_name(m, k));
    kiln_executable *e;
    kiln_compile_options opt = {KILN_ORDER_BFS, false, "kbk"};
    if (kiln_compile(kiln_model_graph(m), &opt, &e) != KILN_OK) {
        fprintf(stderr, "%s\n", kiln_last_error());
        kiln_model_free(m);
        return 2;
    }
    kiln_tensor **in = calloc((size_t)nin + 1, sizeof *in), **out = calloc((size_t)nout + 1, sizeof *out);
    int rc = 0;
    for (int32_t c = 0; c < kiln_model_num_cases(m) && rc == 0; c++) {
        for (int32_t k = 0; k < nin; k++) in[k] = kiln_model_case_input(m, c, k); /* borrowed */
        if (kiln_executable_run(e, nin, in, nout, out) != KILN_OK) {
            fprintf(stderr, "%s\n", kiln_last_error());
            rc = 2;
            break;
        }
        for (int32_t k = 0; k < nout; k++) {
            double abs_err = 0, rel_err = 0;
            kiln_tensor *expected = kiln_model_case_output(m, c, k);
            kiln_status s = kiln_tensor_is_contiguous(out[k]) ? kiln_tensor_max_error(out[k], expected, &abs_err, &rel_err)
                                                            : KILN_ERR_VALUE;
            printf("case %d output %s: relative error %.3g\n", c, kiln_model_output_name(m, k), rel_err);
            double tol = expected->meta.dtype == KILN_DTYPE_FLOAT16 ? 1e-1 : 1e-3;
            if (s != KILN_OK || rel_err > tol) rc = 1;
            kiln_tensor_release(out[k]);
        }
    }
    printf("%d case(s): %s\n", kiln_model_num_cases(m), rc == 0 ? "ok" : "FAILED");
    free(in), free(out);
    kiln_executable_free(e);
    kiln_model_free(m);
    return rc;
}
