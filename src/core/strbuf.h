/* A growing string for text the library writes (graph dumps, generated C). */
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

#endif
