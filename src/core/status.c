/* Thread-local error messages behind kiln_status. */
#include "internal.h"

#define KILN_ERROR_CAP 1024
static _Thread_local char error_message[KILN_ERROR_CAP];
static _Thread_local int64_t last_check = -1;

const char *kiln_last_error(void) { return error_message; }

int64_t kiln_last_check(void) { return last_check; }

kiln_status kiln_error_check(int64_t id) {
    last_check = id;
    return kiln_error(KILN_ERR_CHECK, "check %lld: its condition held", (long long)id);
}

void kiln_clear_error(void) { error_message[0] = '\0'; }

kiln_status kiln_error(kiln_status status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(error_message, sizeof error_message, fmt, ap);
    va_end(ap);
    return status;
}

kiln_status kiln_error_context(kiln_status status, const char *fmt, ...) {
    char prefix[256], old[KILN_ERROR_CAP];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, error_message, sizeof old);
    size_t n = strlen(prefix);
    if (n + 2 >= sizeof error_message) return status;
    memcpy(error_message, prefix, n);
    memcpy(error_message + n, ": ", 2);
    size_t rest = sizeof error_message - n - 3;
    strncpy(error_message + n + 2, old, rest);
    error_message[sizeof error_message - 1] = '\0';
    return status;
}

void kiln_assert_fail(const char *what, const char *file, int line) {
    fprintf(stderr, "kiln: internal error: assertion `%s` failed at %s:%d\n", what, file, line);
    abort();
}

kiln_status kiln_attrs_expect(const char *op, const kiln_attrs *a, int min_ints, int min_floats) {
    if (!a || a->ni < min_ints || a->nf < min_floats)
        return kiln_error(KILN_ERR_VALUE, "%s: expected at least %d int and %d float attributes, got %d and %d",
                          op, min_ints, min_floats, a ? a->ni : 0, a ? a->nf : 0);
    return KILN_OK;
}
