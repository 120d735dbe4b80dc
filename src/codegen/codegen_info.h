/* What the compiler driver found on this machine, for kiln.show_config and `python -m kiln`:
 * the compiler of generated code, whether it works, and the disk cache (compiler.c,
 * codegen_info.c). */
#ifndef KILN_CODEGEN_INFO_H
#define KILN_CODEGEN_INFO_H

#include "codegen.h"

typedef struct kiln_codegen_description {
    char command[256];    /* $CC, else "cc" */
    char identity[256];   /* first line of `command --version`; "" when it does not run */
    char flags[256];      /* the flags generated code is built with */
    char cache_dir[4096]; /* $KILN_CACHE_DIR, else ~/.cache/kiln ("" when there is no home) */
    bool cache_usable;    /* ours, a directory, writable, not writable by others */
} kiln_codegen_description;

void kiln_codegen_describe(kiln_codegen_description *out);

/* The entries of the disk cache (files named <32 hex digits>.so, nothing else in the directory):
 * their count and total size in bytes; with clear, each is deleted and counted. Objects this or
 * another process has loaded stay loaded. KILN_ERR_RUNTIME when the directory cannot be read or
 * an entry cannot be deleted; a missing directory has no entries. */
kiln_status kiln_codegen_cache_scan(bool clear, int64_t *entries, int64_t *bytes);

/* Compiles and runs a tiny kernel through the ordinary path (memory and disk cache included):
 * KILN_OK when it loads and computes what it should; otherwise the status of the failure, with
 * kiln_last_error() saying why. */
kiln_status kiln_codegen_selftest(void);

#endif
