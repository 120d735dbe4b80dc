/* Growing strings. */
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
