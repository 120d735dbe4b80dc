/* The compile cache's directory and the private work directories of compiles (disk_cache.c), for
 * the compiler driver (compiler.c).
 *
 * The cache directory is opened once per load and used only through its descriptor (openat,
 * renameat), so a directory swapped in at its path meanwhile is never read, written or loaded
 * from; before an entry is published its path is checked to name the same directory still.
 * Compiles run in a private work directory (mode 0700, named kiln-tmp-<space>-<pid>-<random>)
 * inside the cache directory, or in $TMPDIR without one; it is removed with everything in it
 * when the load ends, failed or not. Work directories (and the <key>.tmp.<pid>.* files of older
 * versions) left by processes that were killed are swept when a process first opens the
 * directory: those of dead processes of this machine's pid namespace, and any older than a day. */
#ifndef KILN_DISK_CACHE_H
#define KILN_DISK_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "../core/internal.h"

#define KILN_PATH_MAX 4096

typedef struct kiln_cache_dir {
    int fd; /* -1: no usable cache directory */
    char path[KILN_PATH_MAX];
    dev_t dev;
    ino_t ino;
} kiln_cache_dir;

typedef struct kiln_work_dir {
    int parent; /* the cache directory's descriptor (borrowed), or $TMPDIR's (owned) */
    bool owns_parent;
    bool made; /* the directory exists (and is removed with it) */
    int fd;
    char name[64];
    char where[KILN_PATH_MAX + 96]; /* the prefix of paths into it: /proc/self/fd/<fd>, or its path */
} kiln_work_dir;

/* $KILN_CACHE_DIR (default ~/.cache/kiln, created 0700) when usable: a directory of ours that
 * others cannot write. Sweeps stale temporaries there once per process. false: c->fd is -1. */
bool kiln_cache_open(kiln_cache_dir *c);
void kiln_cache_close(kiln_cache_dir *c);
/* Whether c's path still names the directory opened, still ours and private. */
bool kiln_cache_unchanged(const kiln_cache_dir *c);
/* The bytes of the regular file `name` in the cache (ours, not writable by others); NULL if none. */
char *kiln_cache_read(const kiln_cache_dir *c, const char *name, size_t *len);
/* Moves work file `from` into the cache as `name` (atomically replacing it) when the directory is
 * unchanged; false (and nothing written) otherwise. */
bool kiln_cache_publish(const kiln_cache_dir *c, const kiln_work_dir *w, const char *from, const char *name);
void kiln_cache_remove(const kiln_cache_dir *c, const char *name);

/* A fresh private work directory: in the cache directory when c has one, else in $TMPDIR. */
kiln_status kiln_work_dir_make(const kiln_cache_dir *c, kiln_work_dir *w);
/* Removes it and everything in it (loaded objects stay mapped). */
void kiln_work_dir_remove(kiln_work_dir *w);
/* Writes (or appends) data to the work file `name` (created 0600). */
bool kiln_work_write(const kiln_work_dir *w, const char *name, const void *data, size_t n, bool append);
/* The whole work file `name` (malloc'd, NUL-terminated), or NULL. */
char *kiln_work_read(const kiln_work_dir *w, const char *name, size_t *len);
/* A descriptor of work file `name` opened for writing (0600, truncated), or -1. */
int kiln_work_open(const kiln_work_dir *w, const char *name);
/* The path of work file `name` for dlopen. */
void kiln_work_path(const kiln_work_dir *w, const char *name, char *out, size_t size);

#endif
