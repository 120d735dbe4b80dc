/* The compile cache's directory and the private work directories of compiles: see disk_cache.h.
 * Callers serialize (the driver's lock). */
#define _POSIX_C_SOURCE 200809L

#include "disk_cache.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pwd.h>
#include <signal.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "codegen.h"

#define STALE_SECONDS (24 * 3600) /* temporaries older than this go whoever left them */
#define WORK_PREFIX "kiln-tmp-"

/* ---- small helpers ------------------------------------------------------------------------ */

/* A directory of ours that only we can write (and search). */
static bool private_dir(const struct stat *st) {
    return S_ISDIR(st->st_mode) && st->st_uid == geteuid() && !(st->st_mode & 022) &&
           (st->st_mode & S_IRWXU) == S_IRWXU;
}

/* Everything fd reads (closing it), NUL-terminated; NULL on failure. */
static char *read_all(int fd, size_t *len) {
    struct stat st;
    size_t cap = fstat(fd, &st) == 0 && st.st_size > 0 ? (size_t)st.st_size : 4096, n = 0;
    char *buf = kiln_malloc(cap + 1);
    while (buf) {
        if (n == cap) {
            char *grown = kiln_realloc(buf, 2 * cap + 1);
            if (!grown) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = grown, cap *= 2;
        }
        ssize_t got = read(fd, buf + n, cap - n);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) {
            free(buf);
            buf = NULL;
        }
        if (got <= 0) break;
        n += (size_t)got;
    }
    close(fd);
    if (buf) {
        buf[n] = '\0';
        if (len) *len = n;
    }
    return buf;
}

/* Which machine and pid namespace this process's ids belong to: work directories name it, so
 * only those of this namespace are judged by whether their process is alive. */
static unsigned space_id(void) {
    static bool known;
    static unsigned id;
    if (known) return id;
    uint64_t h = 0;
    char buf[256];
    int fd = open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        ssize_t n = read(fd, buf, sizeof buf);
        if (n > 0) h ^= kiln_codegen_hash(buf, (size_t)n, 21);
        close(fd);
    }
    ssize_t n = readlink("/proc/self/ns/pid", buf, sizeof buf);
    if (n > 0) h ^= kiln_codegen_hash(buf, (size_t)n, 22);
    id = (unsigned)(h ^ (h >> 32));
    known = true;
    return id;
}

/* Removes directory `name` of parent with the files in it. */
static void remove_dir(int parent, const char *name) {
    int fd = openat(parent, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (!d) {
        if (fd >= 0) close(fd);
        return;
    }
    for (int pass = 0; pass < 2; pass++) { /* entries unlinked while reading may hide others: look twice */
        for (struct dirent *e; (e = readdir(d));)
            if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) unlinkat(fd, e->d_name, 0);
        if (unlinkat(parent, name, AT_REMOVEDIR) == 0 || errno != ENOTEMPTY) break;
        rewinddir(d);
    }
    closedir(d);
}

/* ---- sweeping what killed processes left ---------------------------------------------------- */

/* <32 hex digits>.tmp.<pid>.<n>.so: a temporary of the versions that built in the cache directory. */
static bool legacy_temporary(const char *name, long *pid) {
    const char *t = strstr(name, ".tmp.");
    size_t n = strlen(name);
    if (!t || t - name != 32 || n < 3 || strcmp(name + n - 3, ".so") != 0) return false;
    char *end;
    *pid = strtol(t + 5, &end, 10);
    return end != t + 5 && *end == '.';
}

static bool process_gone(long pid) { return pid > 0 && kill((pid_t)pid, 0) != 0 && errno == ESRCH; }

static void sweep(int dir) {
    int fd = fcntl(dir, F_DUPFD_CLOEXEC, 0);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (!d) {
        if (fd >= 0) close(fd);
        return;
    }
    time_t now = time(NULL);
    for (struct dirent *e; (e = readdir(d));) {
        long pid = 0;
        unsigned space = 0;
        bool work = sscanf(e->d_name, WORK_PREFIX "%8x-%ld-", &space, &pid) == 2;
        bool legacy = !work && legacy_temporary(e->d_name, &pid);
        struct stat st;
        if ((!work && !legacy) || fstatat(dir, e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || st.st_uid != geteuid())
            continue;
        bool here = legacy || space == space_id(); /* its pid is one of this namespace */
        if (work && here && pid == (long)getpid()) continue;
        if (!(here && process_gone(pid)) && now - st.st_mtime <= STALE_SECONDS) continue;
        if (work && S_ISDIR(st.st_mode)) remove_dir(dir, e->d_name);
        else if (legacy && S_ISREG(st.st_mode)) unlinkat(dir, e->d_name, 0);
    }
    closedir(d);
}

/* Sweeps directory fd once per process. */
static void sweep_once(int fd, const struct stat *st) {
    static struct {
        dev_t dev;
        ino_t ino;
    } swept[16];
    static int nswept;
    for (int k = 0; k < nswept; k++)
        if (swept[k].dev == st->st_dev && swept[k].ino == st->st_ino) return;
    if (nswept < 16) swept[nswept].dev = st->st_dev, swept[nswept++].ino = st->st_ino;
    sweep(fd);
}

/* ---- the cache directory ---------------------------------------------------------------------- */

/* mkdir -p with mode 0700 for what it creates. */
static bool make_dirs(const char *path) {
    char buf[KILN_PATH_MAX];
    size_t n = strlen(path);
    if (n == 0 || n >= sizeof buf) return false;
    memcpy(buf, path, n + 1);
    for (size_t k = 1; k <= n; k++) {
        if (buf[k] != '/' && buf[k] != '\0') continue;
        char c = buf[k];
        buf[k] = '\0';
        if (mkdir(buf, 0700) != 0 && errno != EEXIST) return false;
        buf[k] = c;
    }
    return true;
}

static bool cache_path(char *out, size_t size) {
    const char *env = getenv("KILN_CACHE_DIR");
    int n;
    if (env && *env) {
        n = snprintf(out, size, "%s", env);
    } else {
        const char *home = getenv("HOME");
        if (!home || !*home) {
            struct passwd *pw = getpwuid(getuid());
            home = pw ? pw->pw_dir : NULL;
        }
        if (!home) return false;
        n = snprintf(out, size, "%s/.cache/kiln", home);
    }
    return n > 0 && (size_t)n < size;
}

bool kiln_cache_open(kiln_cache_dir *c) {
    c->fd = -1;
    c->path[0] = '\0';
    if (!cache_path(c->path, sizeof c->path) || !make_dirs(c->path)) return false;
    int fd = open(c->path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    struct stat st;
    if (fd < 0) return false;
    if (fstat(fd, &st) != 0 || !private_dir(&st)) {
        close(fd);
        return false;
    }
    c->fd = fd, c->dev = st.st_dev, c->ino = st.st_ino;
    sweep_once(fd, &st);
    return true;
}

void kiln_cache_close(kiln_cache_dir *c) {
    if (c->fd >= 0) close(c->fd);
    c->fd = -1;
}

bool kiln_cache_unchanged(const kiln_cache_dir *c) {
    struct stat now, opened;
    return c->fd >= 0 && stat(c->path, &now) == 0 && fstat(c->fd, &opened) == 0 && now.st_dev == c->dev &&
           now.st_ino == c->ino && private_dir(&opened);
}

char *kiln_cache_read(const kiln_cache_dir *c, const char *name, size_t *len) {
    int fd = openat(c->fd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    struct stat st;
    if (fd < 0) return NULL;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 022)) {
        close(fd);
        return NULL;
    }
    return read_all(fd, len);
}

bool kiln_cache_publish(const kiln_cache_dir *c, const kiln_work_dir *w, const char *from, const char *name) {
    return kiln_cache_unchanged(c) && renameat(w->fd, from, c->fd, name) == 0;
}

void kiln_cache_remove(const kiln_cache_dir *c, const char *name) { unlinkat(c->fd, name, 0); }

/* ---- work directories ---------------------------------------------------------------------------- */

kiln_status kiln_work_dir_make(const kiln_cache_dir *c, kiln_work_dir *w) {
    memset(w, 0, sizeof *w);
    w->fd = -1;
    const char *where = c->fd >= 0 ? c->path : getenv("TMPDIR");
    if (!where || !*where) where = "/tmp";
    if (c->fd >= 0) {
        w->parent = c->fd;
    } else {
        w->parent = open(where, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        w->owns_parent = w->parent >= 0;
        struct stat st;
        if (w->parent >= 0 && fstat(w->parent, &st) == 0) sweep_once(w->parent, &st);
    }
    static unsigned counter;
    int err = w->parent >= 0 ? EEXIST : errno;
    for (int attempt = 0; attempt < 64 && err == EEXIST; attempt++) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        uint64_t material[3] = {(uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 30), (uint64_t)getpid(), counter++};
        uint64_t r = kiln_codegen_hash(material, sizeof material, 23) & 0xffffffffffffull;
        snprintf(w->name, sizeof w->name, WORK_PREFIX "%08x-%ld-%012llx", space_id(), (long)getpid(),
                 (unsigned long long)r);
        err = mkdirat(w->parent, w->name, 0700) == 0 ? 0 : errno;
    }
    w->made = err == 0;
    struct stat st;
    if (err == 0) {
        w->fd = openat(w->parent, w->name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (w->fd < 0 || fstat(w->fd, &st) != 0 || !private_dir(&st)) err = w->fd < 0 ? errno : EPERM;
    }
    if (err != 0) {
        kiln_work_dir_remove(w);
        return kiln_error(KILN_ERR_RUNTIME, "codegen: cannot create a work directory in %s: %s", where, strerror(err));
    }
    char self[64];
    snprintf(self, sizeof self, "/proc/self/fd/%d", w->fd);
    if (access(self, X_OK) == 0) snprintf(w->where, sizeof w->where, "%s", self); /* exactly this directory */
    else snprintf(w->where, sizeof w->where, "%s/%s", where, w->name);
    return KILN_OK;
}

void kiln_work_dir_remove(kiln_work_dir *w) {
    if (w->made) remove_dir(w->parent, w->name);
    if (w->fd >= 0) close(w->fd);
    if (w->owns_parent) close(w->parent);
    w->fd = -1;
    w->made = w->owns_parent = false;
}

int kiln_work_open(const kiln_work_dir *w, const char *name) {
    return openat(w->fd, name, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
}

bool kiln_work_write(const kiln_work_dir *w, const char *name, const void *data, size_t n, bool append) {
    int fd = openat(w->fd, name, O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC | (append ? O_APPEND : O_TRUNC), 0600);
    if (fd < 0) return false;
    const char *p = data;
    while (n > 0) {
        ssize_t put = write(fd, p, n);
        if (put < 0 && errno == EINTR) continue;
        if (put <= 0) break;
        p += put, n -= (size_t)put;
    }
    return close(fd) == 0 && n == 0;
}

char *kiln_work_read(const kiln_work_dir *w, const char *name, size_t *len) {
    int fd = openat(w->fd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    return fd >= 0 ? read_all(fd, len) : NULL;
}

void kiln_work_path(const kiln_work_dir *w, const char *name, char *out, size_t size) {
    snprintf(out, size, "%s/%s", w->where, name);
}
