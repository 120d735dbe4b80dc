/* The registry of backends: every backend listed in backends.def, found by name. */
#include <stdio.h>

#include "backend.h"

#define KILN_BACKEND(n) extern const kiln_backend kiln_backend_##n;
#include "backends.def"
#undef KILN_BACKEND

static const kiln_backend *const registered[] = {
#define KILN_BACKEND(n) &kiln_backend_##n,
#include "backends.def"
#undef KILN_BACKEND
};

#define NREGISTERED ((int)(sizeof registered / sizeof registered[0]))

int kiln_backend_count(void) { return NREGISTERED; }

const char *kiln_backend_name_at(int k) { return k >= 0 && k < NREGISTERED ? registered[k]->name : NULL; }

const char *kiln_backend_names(void) {
    static char names[256];
    if (!names[0]) { /* the same text each time: a race writes the same bytes */
        size_t used = 0;
        for (int k = 0; k < NREGISTERED && used < sizeof names; k++)
            used += (size_t)snprintf(names + used, sizeof names - used, "%s%s", k ? ", " : "", registered[k]->name);
    }
    return names;
}

const kiln_backend *kiln_backend_find(const char *name) {
    if (!name) return registered[0];
    for (int k = 0; k < NREGISTERED; k++)
        if (strcmp(registered[k]->name, name) == 0) return registered[k];
    kiln_error(KILN_ERR_VALUE, "unknown backend '%s'; registered backends: %s", name, kiln_backend_names());
    return NULL;
}
