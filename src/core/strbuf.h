/* A growing string for text the library writes (graph dumps, generated C); UTF-8 checks. */
#ifndef KILN_STRBUF_H
#define KILN_STRBUF_H

#include "internal.h"

typedef struct kiln_strbuf {
    char *buf;
    size_t len, cap;
    bool failed; /* out of memory: later appends do nothing */
} kiln_strbuf;

/* Appends formatted text (a failed buffer stays failed). */
void kiln_strbuf_printf(kiln_strbuf *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Appends v in the fewest significant digits (up to 17) that strtod reads back as v exactly. */
void kiln_strbuf_put_double(kiln_strbuf *t, double v);
/* The same for a float32 value, read back through strtod and a cast to float. */
void kiln_strbuf_put_float(kiln_strbuf *t, float v);

/* Whether the n bytes at s are well-formed UTF-8 (no overlong forms, surrogates or code points
 * above U+10FFFF). */
bool kiln_utf8_valid(const char *s, size_t n);

#endif
