/* The compiler driver: generated C becomes a shared object built by the system C compiler
 * ($CC, else cc), loaded with dlopen and kept for the life of the process.
 *
 * Objects are cached in memory and on disk under key = hash(source, kiln's codegen version, the
 * compiler command (every word of $CC, the compiler's path and its full --version text), the
 * flags, the CPU), as <key>.so in $KILN_CACHE_DIR (default ~/.cache/kiln, created with mode
 * 0700). The directory and the work directories of compiles are disk_cache.c's: used through
 * descriptors, so a directory swapped in meanwhile is never written or loaded from, and no
 * temporary outlives its compile. An object is built in a private work directory, sealed with a
 * footer (magic, payload size, payload hash) so a corrupt or truncated entry is detected and
 * rebuilt, loaded, and renamed into the cache. Every object is loaded from a fresh name in a work
 * directory (an entry is copied there after its footer checks), never from the cache's path:
 * dlopen returns the object already loaded under a name, so an entry that turned out unusable and
 * its rebuild must not share one. Without a usable cache directory the object is built in
 * $TMPDIR and not kept. Without a compiler, loads fail with KILN_ERR_NOT_IMPLEMENTED after one
 * warning per process, and callers run their interpreted path. The compiler runs through
 * posix_spawn with an argument vector (no shell sees any string), in the work directory. */
#define _GNU_SOURCE /* posix_spawn_file_actions_addfchdir_np */

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "codegen.h"
#include "codegen_info.h"
#include "disk_cache.h"
#include "../core/profile.h"
#include "kiln/config.h"

extern char **environ;

#define KILN_CODEGEN_VERSION "kiln 0.1.0 codegen 2"
/* build_and_load without compiling, the object not in the cache (no error text) */
#define NOT_CACHED KILN_ERR_NOT_IMPLEMENTED
#define FOOTER_MAGIC "KILNSO\x01\x00"
#define FOOTER_BYTES 24 /* magic, payload size, payload hash */

static const char *const compile_flags[] = {
    "-O2", "-march=native", "-fopenmp", "-fno-math-errno", "-fno-trapping-math", "-ffp-contract=off",
    "-std=c11", "-fPIC", "-shared", "-w",
};
#define NFLAGS ((int)(sizeof compile_flags / sizeof compile_flags[0]))
#define MAX_ISA_FLAGS 2

/* The flags that keep generated code within the level kiln uses (KILN_MAX_CPU_ISA below the
 * CPU's: -march=native alone would use all of the CPU's); none at the CPU's own level. */
static int isa_flags(const char *out[MAX_ISA_FLAGS]) {
    kiln_isa cpu = kiln_cpu_isa_level(), used = kiln_isa_level();
    if (used >= cpu) return 0;
    switch (used) {
    case KILN_ISA_AVX2: out[0] = "-mno-avx512f"; return 1; /* and every AVX-512 extension with it */
    case KILN_ISA_AVX: out[0] = "-mno-avx2", out[1] = "-mno-fma"; return 2;
    default: out[0] = "-mno-avx"; return 1; /* and AVX2, FMA, F16C, AVX-512 */
    }
}

/* ---- hashing ------------------------------------------------------------------------------ */

static uint64_t mix64(uint64_t x) {
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}

uint64_t kiln_codegen_hash(const void *data, size_t n, uint64_t seed) {
    const unsigned char *p = data;
    uint64_t h = mix64(seed ^ (0x9e3779b97f4a7c15ull * (n + 1)));
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = mix64(h ^ w) * 0x100000001b3ull + 0x9e3779b97f4a7c15ull;
        p += 8, n -= 8;
    }
    uint64_t w = 0;
    for (size_t k = 0; k < n; k++) w |= (uint64_t)p[k] << (8 * k);
    return mix64(h ^ w ^ (uint64_t)n << 59);
}

/* ---- process state ------------------------------------------------------------------------ */

typedef struct {
    char key[33];
    void *handle;
} loaded;

static struct {
    pthread_mutex_t lock;
    bool probed, have_cc, warned_no_cc, warned_failure;
    char **cc_argv; /* $CC split on blanks, NULL-terminated */
    int cc_argc;
    char *cc_identity; /* the compiler's path, each word of $CC and its whole --version text */
    uint64_t cpu_hash;
    loaded *objects;
    int nobjects, cap_objects;
    unsigned names; /* objects loaded so far: each from a name of its own */
    kiln_codegen_stats stats;
} state = {.lock = PTHREAD_MUTEX_INITIALIZER};

void kiln_codegen_get_stats(kiln_codegen_stats *out) {
    pthread_mutex_lock(&state.lock);
    *out = state.stats;
    pthread_mutex_unlock(&state.lock);
}

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- running the compiler ------------------------------------------------------------------ */

/* Starts argv with stdout and stderr into out_fd and, when cwd_fd >= 0, that directory as its
 * working directory; 0 or an errno value. */
static int spawn(char *const *argv, int cwd_fd, int out_fd, pid_t *pid) {
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    if (cwd_fd >= 0) posix_spawn_file_actions_addfchdir_np(&fa, cwd_fd);
    posix_spawn_file_actions_adddup2(&fa, out_fd, 1);
    posix_spawn_file_actions_adddup2(&fa, out_fd, 2);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    int err = posix_spawnp(pid, argv[0], &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    return err;
}

/* The exit status of pid, or -1 when it did not exit normally. */
static int wait_for(pid_t pid) {
    int ws;
    while (waitpid(pid, &ws, 0) < 0)
        if (errno != EINTR) return -1;
    return WIFEXITED(ws) ? WEXITSTATUS(ws) : -1;
}

/* What `$CC --version` prints (malloc'd), or NULL when it fails. */
static char *compiler_version(void) {
    char **vargv = kiln_calloc((size_t)state.cc_argc + 2, sizeof *vargv);
    int fds[2] = {-1, -1};
    if (!vargv || pipe(fds) != 0) {
        free(vargv);
        return NULL;
    }
    fcntl(fds[0], F_SETFD, FD_CLOEXEC);
    fcntl(fds[1], F_SETFD, FD_CLOEXEC);
    memcpy(vargv, state.cc_argv, sizeof *vargv * (size_t)state.cc_argc);
    vargv[state.cc_argc] = "--version";
    pid_t pid;
    int err = spawn(vargv, -1, fds[1], &pid);
    close(fds[1]);
    free(vargv);
    size_t cap = 4096, n = 0;
    char *text = err == 0 ? kiln_malloc(cap + 1) : NULL;
    for (ssize_t got = 1; text && got != 0;) { /* read to the end before waiting: the pipe must not fill */
        if (n == cap) {
            char *grown = kiln_realloc(text, 2 * cap + 1);
            if (!grown) break;
            text = grown, cap *= 2;
        }
        got = read(fds[0], text + n, cap - n);
        if (got < 0 && errno != EINTR) break;
        if (got > 0) n += (size_t)got;
    }
    close(fds[0]);
    if (err == 0 && wait_for(pid) != 0) err = -1;
    if (err != 0 || !text) {
        free(text);
        return NULL;
    }
    text[n] = '\0';
    return text;
}

/* Where argv[0] is found, as posix_spawnp looks: itself when it has a '/', else along $PATH. */
static void compiler_path(char *out, size_t size) {
    const char *name = state.cc_argv[0];
    snprintf(out, size, "%s", name);
    if (strchr(name, '/')) return;
    const char *path = getenv("PATH");
    for (const char *p = path ? path : ""; *p;) {
        size_t n = strcspn(p, ":");
        char candidate[KILN_PATH_MAX];
        if (snprintf(candidate, sizeof candidate, "%.*s/%s", (int)n, p, name) < (int)sizeof candidate &&
            access(candidate, X_OK) == 0) {
            snprintf(out, size, "%s", candidate);
            return;
        }
        p += n + (p[n] == ':');
    }
}

/* Finds the compiler and its identity, once per process. */
static void probe_compiler(void) {
    state.probed = true;
    const char *cc = getenv("CC");
    if (!cc || !*cc) cc = "cc";
    char *copy = kiln_strdup(cc);
    int words = 0;
    for (const char *p = cc; *p;) { /* words: runs of non-blanks */
        p += strspn(p, " \t");
        if (*p) words++;
        p += strcspn(p, " \t");
    }
    char **argv = kiln_calloc((size_t)words + 1, sizeof *argv);
    int argc = 0;
    for (char *tok = copy && argv ? strtok(copy, " \t") : NULL; tok; tok = strtok(NULL, " \t")) argv[argc++] = tok;
    if (argc == 0) {
        free(copy), free(argv);
        return;
    }
    state.cc_argv = argv;
    state.cc_argc = argc;
    char *version = compiler_version();
    if (version) {
        char where[KILN_PATH_MAX];
        compiler_path(where, sizeof where);
        size_t n = strlen(where) + strlen(cc) + strlen(version) + 4 * (size_t)argc + 16;
        state.cc_identity = kiln_malloc(n);
        if (state.cc_identity) {
            size_t len = (size_t)snprintf(state.cc_identity, n, "%s\n", where);
            for (int k = 0; k < argc; k++) len += (size_t)snprintf(state.cc_identity + len, n - len, "%s\x1f", argv[k]);
            snprintf(state.cc_identity + len, n - len, "\n%s", version);
            state.have_cc = true;
        }
        free(version);
    }
    /* the CPU the objects are built for (-march=native) */
    int fd = open("/proc/cpuinfo", O_RDONLY | O_CLOEXEC);
    char cpu[16384]; /* the first processor's lines */
    size_t got = 0;
    for (ssize_t r = 1; fd >= 0 && r > 0 && got < sizeof cpu - 1; got += r > 0 ? (size_t)r : 0)
        r = read(fd, cpu + got, sizeof cpu - 1 - got);
    if (fd >= 0) close(fd);
    if (got > 0) {
        cpu[got] = '\0';
        const char *model = strstr(cpu, "model name"), *flags = strstr(cpu, "\nflags");
        uint64_t h = 0;
        if (model) h ^= kiln_codegen_hash(model, strcspn(model, "\n"), 1);
        if (flags) h ^= kiln_codegen_hash(flags, strcspn(flags + 1, "\n") + 1, 2);
        state.cpu_hash = h;
    }
}

/* ---- entries: an object and its footer ------------------------------------------------------- */

static void put_u64(unsigned char *p, uint64_t v) {
    for (int k = 0; k < 8; k++) p[k] = (unsigned char)(v >> (8 * k));
}
static uint64_t get_u64(const unsigned char *p) {
    uint64_t v = 0;
    for (int k = 0; k < 8; k++) v |= (uint64_t)p[k] << (8 * k);
    return v;
}

static uint64_t key_seed(const char *key) { return kiln_codegen_hash(key, strlen(key), 3); }

/* Whether data is a complete entry for key. */
static bool entry_valid(const char *data, size_t len, const char *key) {
    if (len <= FOOTER_BYTES) return false;
    const unsigned char *f = (const unsigned char *)data + len - FOOTER_BYTES;
    size_t payload = len - FOOTER_BYTES;
    return memcmp(f, FOOTER_MAGIC, 8) == 0 && get_u64(f + 8) == payload &&
           get_u64(f + 16) == kiln_codegen_hash(data, payload, key_seed(key));
}

/* Appends the footer to work file `name`, a freshly built object. */
static bool add_footer(const kiln_work_dir *w, const char *name, const char *key) {
    size_t len;
    char *data = kiln_work_read(w, name, &len);
    if (!data) return false;
    unsigned char f[FOOTER_BYTES];
    memcpy(f, FOOTER_MAGIC, 8);
    put_u64(f + 8, len);
    put_u64(f + 16, kiln_codegen_hash(data, len, key_seed(key)));
    free(data);
    return kiln_work_write(w, name, f, sizeof f, true);
}

/* ---- loading ------------------------------------------------------------------------------- */

static kiln_status remember(const char *key, void *handle) {
    if (state.nobjects == state.cap_objects) {
        int ncap = state.cap_objects ? 2 * state.cap_objects : 16;
        loaded *grown = kiln_realloc(state.objects, sizeof *grown * (size_t)ncap);
        if (!grown) return kiln_error(KILN_ERR_MEMORY, "out of memory loading generated code");
        state.objects = grown;
        state.cap_objects = ncap;
    }
    loaded *l = &state.objects[state.nobjects++];
    snprintf(l->key, sizeof l->key, "%s", key);
    l->handle = handle;
    return KILN_OK;
}

/* A name no object of this process was loaded from. */
static void fresh_name(char out[32]) { snprintf(out, 32, "object-%u.so", state.names++); }

/* dlopen of work file `name`: *handle, or NULL with the loader's message in *why. */
static void *open_object(const kiln_work_dir *w, const char *name, const char **why) {
    char path[sizeof w->where + 48];
    kiln_work_path(w, name, path, sizeof path);
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    *why = h ? NULL : dlerror();
    return h;
}

/* Builds source in w into work file `target`; the compiler's messages go to the error on failure.
 * Called with the lock held; releases it while the compiler runs. */
static kiln_status compile_in(const kiln_work_dir *w, const char *source, const char *target) {
    if (!kiln_work_write(w, "kernel.c", source, strlen(source), false))
        return kiln_error(KILN_ERR_RUNTIME, "codegen: cannot write kernel.c in %s: %s", w->where, strerror(errno));
    char **argv = kiln_calloc((size_t)state.cc_argc + NFLAGS + MAX_ISA_FLAGS + 4, sizeof *argv);
    if (!argv) return KILN_ERR_MEMORY;
    int log = kiln_work_open(w, "log.txt");
    if (log < 0) {
        free(argv);
        return kiln_error(KILN_ERR_RUNTIME, "codegen: cannot start the compiler: %s", strerror(errno));
    }
    int argc = 0;
    for (int k = 0; k < state.cc_argc; k++) argv[argc++] = state.cc_argv[k];
    for (int k = 0; k < NFLAGS; k++) argv[argc++] = (char *)compile_flags[k];
    const char *isa[MAX_ISA_FLAGS];
    for (int k = 0, n = isa_flags(isa); k < n; k++) argv[argc++] = (char *)isa[k];
    argv[argc++] = "-o";
    argv[argc++] = (char *)target;
    argv[argc++] = "kernel.c";
    double t0 = now_seconds();
    pid_t pid;
    /* the compiler runs without the lock: other threads find and load objects meanwhile (a
     * background build, src/codegen/background.c, must not stall the thread that runs) */
    pthread_mutex_unlock(&state.lock);
    int err = spawn(argv, w->fd, log, &pid);
    close(log);
    free(argv);
    int status = err == 0 ? wait_for(pid) : -1;
    pthread_mutex_lock(&state.lock);
    state.stats.compile_seconds += now_seconds() - t0;
    if (err != 0 || status != 0) {
        char *text = kiln_work_read(w, "log.txt", NULL);
        if (text && strlen(text) > 1500) text[1500] = '\0';
        kiln_status s = kiln_error(KILN_ERR_RUNTIME, "codegen: %s failed (%s): %s", state.cc_argv[0],
                                   err ? strerror(err) : "exit status", text ? text : "");
        free(text);
        return s;
    }
    state.stats.compiles++;
    return KILN_OK;
}

/* The cache's entry for key, copied into w under a fresh name and loaded, when it is complete and
 * has probe_symbol: the handle, else NULL (an entry that is there but unusable is removed). */
static void *load_entry(const kiln_cache_dir *c, const kiln_work_dir *w, const char *key, const char *entry,
                        const char *probe_symbol) {
    size_t len;
    char *data = kiln_cache_read(c, entry, &len);
    if (!data) return NULL;
    char name[32];
    fresh_name(name);
    const char *why;
    void *h = entry_valid(data, len, key) && kiln_work_write(w, name, data, len, false) ? open_object(w, name, &why)
                                                                                          : NULL;
    free(data);
    if (h && dlsym(h, probe_symbol)) {
        state.stats.disk_hits++;
        return h;
    }
    if (h) dlclose(h); /* loads, but lacks what it should have */
    state.stats.rebuilt++; /* corrupt, truncated or unloadable: built again */
    kiln_cache_remove(c, entry);
    return NULL;
}

/* Finds the object for key on disk or builds it (when `compile`; else NOT_CACHED);
 * *handle stays loaded for the process. */
static kiln_status build_and_load(const char *source, const char *key, const char *probe_symbol, bool compile,
                                  void **handle) {
    kiln_cache_dir c;
    kiln_work_dir w;
    char entry[48], name[32];
    snprintf(entry, sizeof entry, "%s.so", key);
    int64_t start = kiln_profiling_phases() ? kiln_profile_now() : 0;
    bool use_disk = kiln_cache_open(&c);
    kiln_status s = kiln_work_dir_make(&c, &w);
    void *h = NULL;
    if (s == KILN_OK && use_disk) h = load_entry(&c, &w, key, entry, probe_symbol);
    bool hit = h != NULL;
    if (s == KILN_OK && !h && !compile) s = NOT_CACHED; /* no error text: callers ask, then build */
    if (s == KILN_OK && !h) {
        fresh_name(name);
        s = compile_in(&w, source, name);
        if (s == KILN_OK && !add_footer(&w, name, key))
            s = kiln_error(KILN_ERR_RUNTIME, "codegen: cannot write %s in %s", name, w.where);
        const char *why = NULL;
        if (s == KILN_OK && !(h = open_object(&w, name, &why)))
            s = kiln_error(KILN_ERR_RUNTIME, "codegen: dlopen failed: %s", why ? why : "");
        /* loaded: into the cache under its key (unless the directory changed meanwhile) */
        if (s == KILN_OK && use_disk) kiln_cache_publish(&c, &w, name, entry);
    }
    kiln_work_dir_remove(&w); /* everything in it: loaded objects stay mapped */
    kiln_cache_close(&c);
    if (start && s != NOT_CACHED) kiln_profile_phase("codegen", hit ? "disk cache hit" : "cache miss: compiled", start);
    if (s == KILN_OK) *handle = h;
    return s;
}

/* key = hash(version, compiler identity, CPU, flags, source): 32 hex digits. */
static kiln_status make_key(const char *source, char key[33]) {
    size_t n = strlen(source) + strlen(state.cc_identity) + strlen(KILN_CODEGEN_VERSION) + 64;
    for (int k = 0; k < NFLAGS; k++) n += strlen(compile_flags[k]) + 1;
    const char *isa[MAX_ISA_FLAGS];
    int nisa = isa_flags(isa);
    for (int k = 0; k < nisa; k++) n += strlen(isa[k]) + 1;
    char *material = kiln_malloc(n);
    if (!material) return kiln_error(KILN_ERR_MEMORY, "out of memory loading generated code");
    size_t len = (size_t)snprintf(material, n, "%s\n%s\n%016llx\n", KILN_CODEGEN_VERSION, state.cc_identity,
                                  (unsigned long long)state.cpu_hash);
    for (int k = 0; k < NFLAGS; k++) len += (size_t)snprintf(material + len, n - len, "%s ", compile_flags[k]);
    for (int k = 0; k < nisa; k++) len += (size_t)snprintf(material + len, n - len, "%s ", isa[k]);
    len += (size_t)snprintf(material + len, n - len, "\n%s", source);
    snprintf(key, 33, "%016llx%016llx", (unsigned long long)kiln_codegen_hash(material, len, 11),
             (unsigned long long)kiln_codegen_hash(material, len, 12));
    free(material);
    return KILN_OK;
}

static void *loaded_handle(const char *key) {
    for (int k = 0; k < state.nobjects; k++)
        if (strcmp(state.objects[k].key, key) == 0) return state.objects[k].handle;
    return NULL;
}

/* With the lock held: whether a compiler is there (warning once when not). */
static bool compiler_ready(bool warn) {
    if (!state.probed) probe_compiler();
    if (!state.have_cc && warn && !state.warned_no_cc) {
        const char *cc = getenv("CC");
        fprintf(stderr, "kiln: warning: no working C compiler (%s); fused kernels run interpreted\n", cc && *cc ? cc : "cc");
        state.warned_no_cc = true;
    }
    return state.have_cc;
}

bool kiln_codegen_available(void) {
    pthread_mutex_lock(&state.lock);
    bool ok = compiler_ready(true);
    pthread_mutex_unlock(&state.lock);
    return ok;
}

bool kiln_codegen_find(const char *source, const char *symbol, void **fn) {
    pthread_mutex_lock(&state.lock);
    char key[33];
    void *h = NULL;
    if (compiler_ready(false) && make_key(source, key) == KILN_OK) h = loaded_handle(key);
    *fn = h ? dlsym(h, symbol) : NULL;
    if (*fn) state.stats.memory_hits++;
    pthread_mutex_unlock(&state.lock);
    return *fn != NULL;
}

static kiln_status load_locked(int n, const char *const *sources, const char *const *symbols, bool compile, void **fns) {
    if (!compiler_ready(true)) return kiln_error(KILN_ERR_NOT_IMPLEMENTED, "codegen: no C compiler");
    char (*keys)[33] = kiln_malloc(sizeof *keys * (size_t)(n ? n : 1));
    int *todo = kiln_malloc(sizeof(int) * (size_t)(n ? n : 1)), ntodo = 0;
    kiln_status s = keys && todo ? KILN_OK : kiln_error(KILN_ERR_MEMORY, "out of memory loading generated code");
    size_t total = 1;
    for (int k = 0; k < n && s == KILN_OK; k++) {
        fns[k] = NULL;
        s = make_key(sources[k], keys[k]);
        void *h = s == KILN_OK ? loaded_handle(keys[k]) : NULL;
        if (h && (fns[k] = dlsym(h, symbols[k]))) {
            state.stats.memory_hits++;
            continue;
        }
        bool dup = false; /* the same kernel twice: built once */
        for (int j = 0; j < ntodo && !dup; j++) dup = strcmp(keys[todo[j]], keys[k]) == 0;
        if (!dup) todo[ntodo++] = k, total += strlen(sources[k]) + 1;
    }
    if (s == KILN_OK && ntodo > 0) {
        /* one object for all of them: one compiler run */
        char *batch = ntodo == 1 ? NULL : kiln_malloc(total), batch_key[33];
        const char *src = sources[todo[0]];
        if (ntodo > 1) {
            if (!batch) s = kiln_error(KILN_ERR_MEMORY, "out of memory loading generated code");
            size_t len = 0;
            for (int j = 0; j < ntodo && batch; j++) {
                size_t m = strlen(sources[todo[j]]);
                memcpy(batch + len, sources[todo[j]], m);
                len += m;
                batch[len++] = '\n';
            }
            if (batch) batch[len] = '\0';
            src = batch;
            if (s == KILN_OK) s = make_key(batch, batch_key);
        } else {
            memcpy(batch_key, keys[todo[0]], 33);
        }
        void *h = NULL;
        if (s == KILN_OK) s = build_and_load(src, batch_key, symbols[todo[0]], compile, &h);
        for (int j = 0; j < ntodo && s == KILN_OK; j++) s = remember(keys[todo[j]], h);
        free(batch);
        for (int k = 0; k < n && s == KILN_OK; k++) {
            if (fns[k]) continue;
            void *hk = loaded_handle(keys[k]);
            fns[k] = hk ? dlsym(hk, symbols[k]) : NULL;
            if (!fns[k]) s = kiln_error(KILN_ERR_RUNTIME, "codegen: generated object lacks %s", symbols[k]);
        }
    }
    free(keys), free(todo);
    return s;
}

kiln_status kiln_codegen_load_many(int n, const char *const *sources, const char *const *symbols, void **fns) {
    pthread_mutex_lock(&state.lock);
    int64_t start = kiln_profiling_phases() ? kiln_profile_now() : 0, hits = state.stats.memory_hits;
    kiln_status s = load_locked(n, sources, symbols, true, fns);
    if (start) {
        char detail[64];
        snprintf(detail, sizeof detail, "%d kernels, %lld loaded before (memory cache hits)", n,
                 (long long)(state.stats.memory_hits - hits));
        kiln_profile_phase("codegen.load", detail, start);
    }
    if (s != KILN_OK && s != KILN_ERR_MEMORY && s != KILN_ERR_NOT_IMPLEMENTED && !state.warned_failure) {
        fprintf(stderr, "kiln: warning: generated code unavailable, fused kernels run interpreted: %s\n",
                kiln_last_error());
        state.warned_failure = true;
    }
    pthread_mutex_unlock(&state.lock);
    return s;
}

bool kiln_codegen_load_cached(int n, const char *const *sources, const char *const *symbols, void **fns) {
    pthread_mutex_lock(&state.lock);
    kiln_status s = compiler_ready(false) ? load_locked(n, sources, symbols, false, fns) : NOT_CACHED;
    pthread_mutex_unlock(&state.lock);
    if (s != KILN_OK) kiln_clear_error(); /* not there (or unusable): the caller builds it */
    return s == KILN_OK;
}

kiln_status kiln_codegen_load(const char *source, const char *symbol, void **fn) {
    return kiln_codegen_load_many(1, &source, &symbol, fn);
}

/* ---- what it found (kiln.show_config) ------------------------------------------------------- */

void kiln_codegen_describe(kiln_codegen_description *out) {
    memset(out, 0, sizeof *out);
    const char *cc = getenv("CC");
    snprintf(out->command, sizeof out->command, "%s", cc && *cc ? cc : "cc");
    size_t n = 0;
    const char *flags[NFLAGS + MAX_ISA_FLAGS];
    memcpy(flags, compile_flags, sizeof compile_flags);
    int nflags = NFLAGS + isa_flags(flags + NFLAGS);
    for (int k = 0; k < nflags; k++) {
        size_t len = strlen(flags[k]);
        if (n + len + 2 > sizeof out->flags) break;
        if (k) out->flags[n++] = ' ';
        memcpy(out->flags + n, flags[k], len + 1);
        n += len;
    }
    pthread_mutex_lock(&state.lock);
    if (compiler_ready(false) && state.cc_identity) {
        /* cc_identity is "<path>\n<argv joined by 0x1f>\n<--version output>": its version's first line */
        const char *version = strchr(state.cc_identity, '\n');
        version = version ? strchr(version + 1, '\n') : NULL;
        if (version) {
            version++;
            int len = (int)strcspn(version, "\n");
            snprintf(out->identity, sizeof out->identity, "%.*s", len, version);
        }
    }
    pthread_mutex_unlock(&state.lock);
    kiln_cache_dir c;
    out->cache_usable = kiln_cache_open(&c);
    snprintf(out->cache_dir, sizeof out->cache_dir, "%s", c.path);
    kiln_cache_close(&c);
}

/* Whether name is an entry's: 32 hex digits, then ".so". */
static bool is_entry_name(const char *name) {
    for (int k = 0; k < 32; k++)
        if (!((name[k] >= '0' && name[k] <= '9') || (name[k] >= 'a' && name[k] <= 'f'))) return false;
    return strcmp(name + 32, ".so") == 0;
}

kiln_status kiln_codegen_cache_scan(bool clear, int64_t *entries, int64_t *bytes) {
    *entries = *bytes = 0;
    kiln_cache_dir c;
    if (!kiln_cache_open(&c)) {
        struct stat st;
        if (!c.path[0] || (stat(c.path, &st) != 0 && errno == ENOENT)) return KILN_OK;
        return kiln_error(KILN_ERR_RUNTIME, "codegen cache: %s is not a usable cache directory (it must be a directory of this user's that others cannot write)",
                          c.path);
    }
    const char *dirpath = c.path;
    int fd = openat(c.fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC); /* its own offset (a dup shares the sweep's) */
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (!d) {
        kiln_status s = kiln_error(KILN_ERR_RUNTIME, "codegen cache: cannot read %s: %s", dirpath, strerror(errno));
        if (fd >= 0) close(fd);
        kiln_cache_close(&c);
        return s;
    }
    kiln_status s = KILN_OK;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!is_entry_name(e->d_name)) continue;
        struct stat st;
        if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode)) continue;
        if (clear && unlinkat(dirfd(d), e->d_name, 0) != 0 && errno != ENOENT) {
            s = kiln_error(KILN_ERR_RUNTIME, "codegen cache: cannot delete %s/%s: %s", dirpath, e->d_name,
                           strerror(errno));
            break;
        }
        (*entries)++;
        *bytes += (int64_t)st.st_size;
    }
    closedir(d);
    kiln_cache_close(&c);
    return s;
}
