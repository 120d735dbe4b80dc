/* The print op: its text template, NumPy's layout for tensors of every rank (strided inputs
 * too), and its argument errors. stdout is redirected to a temporary file to read it back. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "kiln/ops.h"

/* attrs holding `text` (byte 0x01: the next tensor), as kiln.ops.print_ packs them */
static void pack(kiln_attrs *a, const char *text, size_t len) {
    memset(a, 0, sizeof *a);
    a->i[0] = (int64_t)len;
    a->ni = 1 + (int32_t)((len + 7) / 8);
    for (size_t k = 0; k < len; k++) a->i[1 + k / 8] |= (int64_t)((uint64_t)(unsigned char)text[k] << (8 * (k % 8)));
}

/* Runs print over `in` and returns what it wrote (static buffer), or NULL when it failed. */
static const char *printed(const char *text, int nin, kiln_tensor *const *in, kiln_status *status) {
    static char buf[4096];
    kiln_attrs a;
    pack(&a, text, strlen(text));
    FILE *tmp = tmpfile();
    if (!tmp) return NULL;
    fflush(stdout);
    int saved = dup(fileno(stdout));
    dup2(fileno(tmp), fileno(stdout));
    kiln_tensor *token = NULL;
    *status = kiln_apply(KILN_OP_PRINT, nin, in, &a, &token);
    fflush(stdout);
    dup2(saved, fileno(stdout));
    close(saved);
    rewind(tmp);
    size_t n = fread(buf, 1, sizeof buf - 1, tmp);
    buf[n] = '\0';
    fclose(tmp);
    if (token) {
        CHECK(token->meta.dtype == KILN_DTYPE_INT8 && token->meta.ndim == 0);
        kiln_tensor_release(token);
    }
    return *status == KILN_OK ? buf : NULL;
}

static void test_text_and_tensors(void) {
    const float v[] = {1.5f, 2, 3, 4, 5, 6};
    kiln_tensor *m = tensor_f32(2, (const int64_t[]){2, 3}, v);
    kiln_tensor *s = tensor_f32(0, NULL, v);
    kiln_status st;
    const char *out = printed("m = \x01, s = \x01!\n", 2, (kiln_tensor *[]){m, s}, &st);
    CHECK(out && strcmp(out, "m = [[1.5 2 3]\n [4 5 6]], s = 1.5!\n") == 0);
    /* a transposed (strided) view prints in its logical order */
    kiln_tensor *t = NULL;
    CHECK_OK(kiln_tensor_view(m, 2, (const int64_t[]){3, 2}, (const int64_t[]){1, 3}, 0, &t));
    out = printed("\x01", 1, &t, &st);
    CHECK(out && strcmp(out, "[[1.5 4]\n [2 5]\n [3 6]]") == 0);
    kiln_tensor_release(t), kiln_tensor_release(m), kiln_tensor_release(s);
}

static void test_ranks_and_dtypes(void) {
    kiln_tensor *t = NULL;
    CHECK_OK(kiln_tensor_empty(KILN_DTYPE_INT64, 3, (const int64_t[]){2, 2, 2}, &t));
    for (int64_t i = 0; i < 8; i++) ((int64_t *)t->data)[i] = i - 3;
    kiln_tensor *b = NULL;
    CHECK_OK(kiln_tensor_empty(KILN_DTYPE_BOOL, 1, (const int64_t[]){2}, &b));
    ((uint8_t *)b->data)[0] = 1, ((uint8_t *)b->data)[1] = 0;
    kiln_status st;
    const char *out = printed("\x01 \x01", 2, (kiln_tensor *[]){t, b}, &st);
    CHECK(out && strcmp(out, "[[[-3 -2]\n  [-1 0]]\n\n [[1 2]\n  [3 4]]] [True False]") == 0);
    kiln_tensor_release(t), kiln_tensor_release(b);
}

static void test_errors(void) {
    kiln_tensor *s = tensor_f32(0, NULL, (const float[]){1});
    kiln_status st;
    CHECK(printed("no places", 1, &s, &st) == NULL && st == KILN_ERR_VALUE);
    CHECK(strstr(kiln_last_error(), "1 tensors were given") != NULL);
    kiln_attrs a;
    pack(&a, "abc", 3);
    a.i[0] = 100; /* longer than the ints that carry it */
    kiln_tensor *token = NULL;
    CHECK_STATUS(kiln_apply(KILN_OP_PRINT, 0, NULL, &a, &token), KILN_ERR_VALUE);
    CHECK(token == NULL);
    kiln_tensor_release(s);
}

int main(void) {
    test_text_and_tensors();
    test_ranks_and_dtypes();
    test_errors();
    if (check_failures) fprintf(stderr, "%d check(s) failed\n", check_failures);
    return check_failures != 0;
}
