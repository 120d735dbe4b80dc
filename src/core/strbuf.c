/* Growing strings, and checking text is UTF-8. */
#include "strbuf.h"

void kiln_strbuf_printf(kiln_strbuf *t, const char *fmt, ...) {
    if (t->failed) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(t->buf ? t->buf + t->len : NULL, t->buf ? t->cap - t->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) {
            t->failed = true;
            return;
        }
        if (t->buf && t->len + (size_t)n < t->cap) {
            t->len += (size_t)n;
            return;
        }
        size_t ncap = (t->cap + (size_t)n + 1) * 2;
        char *grown = kiln_realloc(t->buf, ncap);
        if (!grown) {
            t->failed = true;
            return;
        }
        t->buf = grown;
        t->cap = ncap;
    }
}

void kiln_strbuf_put_double(kiln_strbuf *t, double v) {
    char buf[40];
    for (int digits = 6; digits <= 17; digits++) {
        snprintf(buf, sizeof buf, "%.*g", digits, v);
        if (digits == 17 || v != v || strtod(buf, NULL) == v) break;
    }
    kiln_strbuf_printf(t, "%s", buf);
}

void kiln_strbuf_put_float(kiln_strbuf *t, float v) {
    char buf[40];
    for (int digits = 6; digits <= 9; digits++) {
        snprintf(buf, sizeof buf, "%.*g", digits, (double)v);
        if (digits == 9 || v != v || (float)strtod(buf, NULL) == v) break;
    }
    kiln_strbuf_printf(t, "%s", buf);
}

bool kiln_utf8_valid(const char *s, size_t n) {
    const unsigned char *p = (const unsigned char *)s;
    size_t k = 0;
    while (k < n) {
        unsigned c = p[k];
        if (c < 0x80) {
            k++;
            continue;
        }
        int more;
        unsigned lo = 0x80, hi = 0xBF; /* the range of the byte after the lead byte */
        if (c >= 0xC2 && c <= 0xDF) more = 1;
        else if (c >= 0xE0 && c <= 0xEF) {
            more = 2;
            if (c == 0xE0) lo = 0xA0;      /* overlong */
            else if (c == 0xED) hi = 0x9F; /* UTF-16 surrogates */
        } else if (c >= 0xF0 && c <= 0xF4) {
            more = 3;
            if (c == 0xF0) lo = 0x90;      /* overlong */
            else if (c == 0xF4) hi = 0x8F; /* above U+10FFFF */
        } else
            return false;
        if (n - k <= (size_t)more) return false;
        if (p[k + 1] < lo || p[k + 1] > hi) return false;
        for (int j = 2; j <= more; j++)
            if (p[k + (size_t)j] < 0x80 || p[k + (size_t)j] > 0xBF) return false;
        k += (size_t)more + 1;
    }
    return true;
}
