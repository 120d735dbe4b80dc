/* .npy reading and writing: the magic "\x93NUMPY", a version, the header length, a Python dict
 * literal {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), } padded with spaces to a
 * multiple of 64 bytes and ending in '\n', then the data. */
#define _POSIX_C_SOURCE 200809L
#include "npy.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const struct {
    const char *descr;
    kiln_dtype dtype;
} descrs[] = {
    {"|b1", KILN_DTYPE_BOOL},    {"|i1", KILN_DTYPE_INT8},    {"<i4", KILN_DTYPE_INT32},
    {"<i8", KILN_DTYPE_INT64},   {"<f2", KILN_DTYPE_FLOAT16}, {"<f4", KILN_DTYPE_FLOAT32},
    {"<f8", KILN_DTYPE_FLOAT64},
};

static kiln_status fail(char *err, size_t size, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static kiln_status fail(char *err, size_t size, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, size, fmt, ap);
    va_end(ap);
    return KILN_ERR_VALUE;
}

/* The text after "'key':" in the header, or NULL. */
static const char *value_of(const char *header, const char *key) {
    const char *p = strstr(header, key);
    if (!p) return NULL;
    p = strchr(p + strlen(key), ':');
    if (!p) return NULL;
    p++;
    while (*p == ' ') p++;
    return p;
}

kiln_status npy_read(const char *path, kiln_tensor **out, char *err, size_t esize) {
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return fail(err, esize, "%s: can't open it", path);
    unsigned char pre[12];
    kiln_status s = KILN_OK;
    char *header = NULL;
    size_t hlen = 0, prelen = 10;
    if (fread(pre, 1, 10, f) != 10 || memcmp(pre, "\x93NUMPY", 6) != 0) {
        s = fail(err, esize, "%s: not a .npy file", path);
    } else if (pre[6] == 1) {
        hlen = pre[8] | (size_t)pre[9] << 8;
    } else if (pre[6] == 2 || pre[6] == 3) {
        if (fread(pre + 10, 1, 2, f) != 2) s = fail(err, esize, "%s: truncated header", path);
        hlen = pre[8] | (size_t)pre[9] << 8 | (size_t)pre[10] << 16 | (size_t)pre[11] << 24;
        prelen = 12;
    } else {
        s = fail(err, esize, "%s: .npy format version %d is not supported", path, pre[6]);
    }
    (void)prelen;
    if (s == KILN_OK && hlen > (1 << 20)) s = fail(err, esize, "%s: header of %zu bytes", path, hlen);
    if (s == KILN_OK) {
        header = malloc(hlen + 1);
        if (!header || fread(header, 1, hlen, f) != hlen) s = fail(err, esize, "%s: truncated header", path);
        else header[hlen] = '\0';
    }
    kiln_dtype dtype = KILN_DTYPE_COUNT;
    int64_t shape[KILN_MAX_DIMS];
    int ndim = 0;
    if (s == KILN_OK) {
        const char *d = value_of(header, "'descr'"), *fo = value_of(header, "'fortran_order'"),
                   *sh = value_of(header, "'shape'");
        if (!d || !fo || !sh || *sh != '(') s = fail(err, esize, "%s: malformed header", path);
        for (size_t k = 0; s == KILN_OK && k < sizeof descrs / sizeof descrs[0]; k++)
            if (d[0] == '\'' && strncmp(d + 1, descrs[k].descr, 3) == 0 && d[4] == '\'') dtype = descrs[k].dtype;
        if (s == KILN_OK && dtype == KILN_DTYPE_COUNT)
            s = fail(err, esize, "%s: dtype %.8s is not supported (bool, int8, int32, int64, float16/32/64, little-endian)",
                     path, d);
        if (s == KILN_OK && strncmp(fo, "False", 5) != 0) s = fail(err, esize, "%s: Fortran order is not supported", path);
        for (const char *p = sh + 1; s == KILN_OK;) {
            while (*p == ' ' || *p == ',') p++;
            if (*p == ')') break;
            if (!isdigit((unsigned char)*p) || ndim == KILN_MAX_DIMS) {
                s = fail(err, esize, "%s: bad shape", path);
                break;
            }
            char *e;
            shape[ndim++] = strtoll(p, &e, 10);
            p = e;
        }
    }
    if (s == KILN_OK) {
        s = kiln_tensor_empty(dtype, ndim, shape, out);
        if (s != KILN_OK) fail(err, esize, "%s: %s", path, kiln_last_error());
    }
    if (s == KILN_OK) {
        size_t nbytes = (size_t)(*out)->numel * kiln_dtype_size(dtype);
        if (fread((*out)->data, 1, nbytes, f) != nbytes) {
            s = fail(err, esize, "%s: truncated data (%zu bytes expected)", path, nbytes);
            kiln_tensor_release(*out);
            *out = NULL;
        }
    }
    free(header);
    fclose(f);
    return s;
}

kiln_status npy_write(FILE *f, const char *path, const kiln_tensor *t, char *err, size_t esize) {
    const char *descr = NULL;
    for (size_t k = 0; k < sizeof descrs / sizeof descrs[0]; k++)
        if (descrs[k].dtype == t->meta.dtype) descr = descrs[k].descr;
    if (!descr) {
        fclose(f);
        return fail(err, esize, "%s: dtype %s has no .npy form here", path, kiln_dtype_name(t->meta.dtype));
    }
    char header[512];
    int n = snprintf(header, sizeof header, "{'descr': '%s', 'fortran_order': False, 'shape': (", descr);
    for (int d = 0; d < t->meta.ndim; d++)
        n += snprintf(header + n, sizeof header - (size_t)n, "%lld,%s", (long long)t->meta.shape[d],
                      d + 1 < t->meta.ndim ? " " : "");
    n += snprintf(header + n, sizeof header - (size_t)n, "), }");
    int total = (10 + n + 1 + 63) / 64 * 64;
    while (10 + n + 1 < total) header[n++] = ' ';
    header[n++] = '\n';
    unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (unsigned char)(n & 0xff), (unsigned char)(n >> 8)};
    size_t nbytes = (size_t)t->numel * kiln_dtype_size(t->meta.dtype);
    bool ok = fwrite(pre, 1, 10, f) == 10 && fwrite(header, 1, (size_t)n, f) == (size_t)n &&
              fwrite(t->data, 1, nbytes, f) == nbytes;
    ok &= fclose(f) == 0;
    return ok ? KILN_OK : fail(err, esize, "%s: write failed", path);
}
