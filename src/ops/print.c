/* print: writes text and tensor values to stdout when it runs (an effect op: passes keep it and
 * schedules keep its place among other effects). The text travels in the attrs so a saved graph
 * prints the same: i[0] = template length in bytes, i[1..] = the template packed 8 bytes per int
 * (little end first); in the template, byte 0x01 stands for the next input tensor. The output is
 * a 0-d int8 token (0). */
#include <stdio.h>
#include <string.h>

#include "../core/internal.h"
#include "../core/hooks.h"

#define PRINT_SLOT 0x01

static kiln_status template_length(const kiln_attrs *a, int64_t *len) {
    KILN_TRY(kiln_attrs_expect("print", a, 1, 0));
    *len = a->i[0];
    if (*len < 0 || *len > (int64_t)(a->ni - 1) * 8)
        return kiln_error(KILN_ERR_VALUE, "print: template of %lld bytes does not fit its %d attribute ints",
                          (long long)*len, a->ni - 1);
    return KILN_OK;
}

static char template_byte(const kiln_attrs *a, int64_t k) {
    return (char)((uint64_t)a->i[1 + k / 8] >> (8 * (k % 8)) & 0xff);
}

KILN_INFER(print) {
    int64_t len;
    KILN_TRY(template_length(a, &len));
    int slots = 0;
    for (int64_t k = 0; k < len; k++) slots += template_byte(a, k) == PRINT_SLOT;
    if (slots != nin)
        return kiln_error(KILN_ERR_VALUE, "print: the text has %d tensor places but %d tensors were given", slots,
                          nin);
    kiln_meta_set(out, KILN_DTYPE_INT8, 0, NULL);
    return KILN_OK;
}

static void print_element(FILE *f, const kiln_tensor *t, int64_t offset) {
    const char *p = (const char *)t->data + offset * (int64_t)kiln_dtype_size(t->meta.dtype);
    switch (t->meta.dtype) {
    case KILN_DTYPE_BOOL: fputs(*(const uint8_t *)p ? "True" : "False", f); break;
    case KILN_DTYPE_INT8: fprintf(f, "%d", *(const int8_t *)p); break;
    case KILN_DTYPE_INT32: fprintf(f, "%d", *(const int32_t *)p); break;
    case KILN_DTYPE_INT64: fprintf(f, "%lld", (long long)*(const int64_t *)p); break;
    case KILN_DTYPE_FLOAT16: fprintf(f, "%.6g", (double)kiln_f16_to_f32(*(const uint16_t *)p)); break;
    case KILN_DTYPE_BFLOAT16: fprintf(f, "%.6g", (double)kiln_bf16_to_f32(*(const uint16_t *)p)); break;
    case KILN_DTYPE_FLOAT32: fprintf(f, "%.6g", (double)*(const float *)p); break;
    case KILN_DTYPE_FLOAT64: fprintf(f, "%.6g", *(const double *)p); break;
    default: fputs("?", f); break;
    }
}

/* NumPy's str layout: [[1 2 3]\n [4 5 6]], values with 6 significant digits. */
static void print_dims(FILE *f, const kiln_tensor *t, int dim, int64_t offset) {
    if (dim == t->meta.ndim) {
        print_element(f, t, offset);
        return;
    }
    fputc('[', f);
    for (int64_t k = 0; k < t->meta.shape[dim]; k++) {
        if (k > 0) {
            if (dim == t->meta.ndim - 1) {
                fputc(' ', f);
            } else {
                for (int r = dim; r < t->meta.ndim - 1; r++) fputc('\n', f);
                for (int r = 0; r <= dim; r++) fputc(' ', f);
            }
        }
        print_dims(f, t, dim + 1, offset + k * t->strides[dim]);
    }
    fputc(']', f);
}

KILN_KERNEL(print) {
    *(int8_t *)out[0]->data = 0;
    if (kiln_thread.trace_in_body) return KILN_OK; /* traced once to be recorded: it prints when the node runs */
    int64_t len;
    KILN_TRY(template_length(a, &len));
    int next = 0;
    for (int64_t k = 0; k < len; k++) {
        char c = template_byte(a, k);
        if (c == PRINT_SLOT && next < nin)
            print_dims(stdout, in[next++], 0, 0);
        else
            fputc(c, stdout);
    }
    fflush(stdout);
    return KILN_OK;
}
