/* The compiler driver: generated C becomes a shared object built by the system C compiler
 * ($CC, else cc), loaded with dlopen and kept for the life of the process.
 *
 * Objects are cached in memory and on disk under key = hash(source, compiler identity, flags,
 * kiln version, CPU), as <key>.so in $KILN_CACHE_DIR (default ~/.cache/kiln, created with mode
 * 0700). Entries are written to a temporary name and renamed into place; each ends with a
 * footer (magic, payload size, payload hash) so a corrupt or truncated entry is detected and
 * rebuilt. Without a usable cache directory the object is built in a temporary directory,
 * loaded and deleted. Without a compiler, loads fail with KILN_ERR_NOT_IMPLEMENTED after one
 * warning per process, and callers run their interpreted path. The compiler runs through
 * posix_spawn with an argument vector: no shell sees any string. */
#define _POSIX_C_SOURCE 200809L

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <pwd.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "codegen_info.h"

extern char **environ;

#define KILN_CODEGEN_VERSION "kiln 0.1.0 codegen 1"
#define FOOTER_MAGIC "KILNSO\x01\x00"
#define FOOTER_BYTES 24 /* magic, payload size, payload hash */

static const char *const compile_flags[] = {
    "-O2", "-march=native", "-fopenmp", "-fno-math-errno", "-fno-trapping-math", "-ffp-contract=off",
    "-std=c11", "-fPIC", "-shared", "-w",
};
#define NFLAGS ((int)(sizeof compile_flags / sizeof compile_flags[0]))

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
    char *cc_identity;
    uint64_t cpu_hash;
    loaded *objects;
    int nobjects, cap_objects;
    unsigned tmp_counter;
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

/* Runs argv with stdout and stderr into out_path (or /dev/null); *status = exit status, or -1
 * when it could not start. */
static int run_process(char *const *argv, const char *out_path, int *status) {
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    const char *to = out_path ? out_path : "/dev/null";
    posix_spawn_file_actions_addopen(&fa, 1, to, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    pid_t pid;
    int err = posix_spawnp(&pid, argv[0], &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (err != 0) {
        *status = -1;
        return err;
    }
    int ws;
    while (waitpid(pid, &ws, 0) < 0)
        if (errno != EINTR) {
            *status = -1;
            return errno;
        }
    *status = WIFEXITED(ws) ? WEXITSTATUS(ws) : -1;
    return 0;
}

static char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap + 1);
    while (buf) {
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (n < cap) break;
        char *grown = realloc(buf, cap * 2 + 1);
        if (!grown) {
            free(buf);
            buf = NULL;
            break;
        }
        buf = grown;
        cap *= 2;
    }
    bool err = ferror(f);
    fclose(f);
    if (err) {
        free(buf);
        return NULL;
    }
    if (buf) buf[n] = '\0';
    if (len) *len = n;
    return buf;
}

static char *make_temp_dir(void) {
    const char *base = getenv("TMPDIR");
    if (!base || !*base) base = "/tmp";
    size_t n = strlen(base) + 32;
    char *dir = malloc(n);
    if (!dir) return NULL;
    snprintf(dir, n, "%s/kiln-cc-XXXXXX", base);
    if (!mkdtemp(dir)) {
        free(dir);
        return NULL;
    }
    return dir;
}

static void remove_temp_dir(char *dir) {
    static const char *const names[] = {"kernel.c", "kernel.so", "log.txt", "version.txt"};
    char path[4096];
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) {
        snprintf(path, sizeof path, "%s/%s", dir, names[k]);
        unlink(path);
    }
    rmdir(dir);
    free(dir);
}

/* Finds the compiler and its identity (first line of `cc --version`), once per process. */
static void probe_compiler(void) {
    state.probed = true;
    const char *cc = getenv("CC");
    if (!cc || !*cc) cc = "cc";
    char *copy = kiln_strdup(cc);
    if (!copy) return;
    int cap = 8;
    char **argv = calloc((size_t)cap + NFLAGS + 8, sizeof *argv);
    int argc = 0;
    for (char *tok = strtok(copy, " \t"); tok && argv; tok = strtok(NULL, " \t")) {
        if (argc == cap) break; /* more words than any sensible $CC */
        argv[argc++] = tok;
    }
    if (!argv || argc == 0) {
        free(copy), free(argv);
        return;
    }
    state.cc_argv = argv;
    state.cc_argc = argc;
    char *dir = make_temp_dir();
    if (!dir) return;
    char out[4096];
    snprintf(out, sizeof out, "%s/version.txt", dir);
    char *vargv[16];
    for (int k = 0; k < argc; k++) vargv[k] = argv[k];
    vargv[argc] = "--version";
    vargv[argc + 1] = NULL;
    int status;
    if (run_process(vargv, out, &status) == 0 && status == 0) {
        char *text = read_file(out, NULL);
        if (text) {
            text[strcspn(text, "\n")] = '\0';
            state.cc_identity = text;
            state.have_cc = true;
        }
    }
    remove_temp_dir(dir);
    /* the CPU the objects are built for (-march=native) */
    char *cpu = read_file("/proc/cpuinfo", NULL);
    if (cpu) {
        const char *model = strstr(cpu, "model name"), *flags = strstr(cpu, "\nflags");
        uint64_t h = 0;
        if (model) h ^= kiln_codegen_hash(model, strcspn(model, "\n"), 1);
        if (flags) h ^= kiln_codegen_hash(flags, strcspn(flags + 1, "\n") + 1, 2);
        state.cpu_hash = h;
        free(cpu);
    }
}

/* ---- the disk cache -------------------------------------------------------------------------- */

/* mkdir -p with mode 0700 for what it creates. */
static bool make_dirs(const char *path) {
    char buf[4096];
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

/* The cache directory when usable: ours, a directory, writable, not writable by others. */
static bool cache_dir(char *out, size_t size) {
    const char *env = getenv("KILN_CACHE_DIR");
    if (env && *env) {
        snprintf(out, size, "%s", env);
    } else {
        const char *home = getenv("HOME");
        if (!home || !*home) {
            struct passwd *pw = getpwuid(getuid());
            home = pw ? pw->pw_dir : NULL;
        }
        if (!home) return false;
        snprintf(out, size, "%s/.cache/kiln", home);
    }
    if (!make_dirs(out)) return false;
    struct stat st;
    if (stat(out, &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 022)) return false;
    return access(out, W_OK | X_OK) == 0;
}

static void put_u64(unsigned char *p, uint64_t v) {
    for (int k = 0; k < 8; k++) p[k] = (unsigned char)(v >> (8 * k));
}
static uint64_t get_u64(const unsigned char *p) {
    uint64_t v = 0;
    for (int k = 0; k < 8; k++) v |= (uint64_t)p[k] << (8 * k);
    return v;
}

static uint64_t key_seed(const char *key) { return kiln_codegen_hash(key, strlen(key), 3); }

/* Whether the file at path is a complete entry for key. */
static bool entry_valid(const char *path, const char *key) {
    size_t len;
    char *data = read_file(path, &len);
    if (!data) return false;
    bool ok = false;
    if (len > FOOTER_BYTES) {
        const unsigned char *f = (const unsigned char *)data + len - FOOTER_BYTES;
        size_t payload = len - FOOTER_BYTES;
        ok = memcmp(f, FOOTER_MAGIC, 8) == 0 && get_u64(f + 8) == payload &&
             get_u64(f + 16) == kiln_codegen_hash(data, payload, key_seed(key));
    }
    free(data);
    return ok;
}

/* Appends the footer to a freshly built object. */
static bool add_footer(const char *path, const char *key) {
    size_t len;
    char *data = read_file(path, &len);
    if (!data) return false;
    unsigned char f[FOOTER_BYTES];
    memcpy(f, FOOTER_MAGIC, 8);
    put_u64(f + 8, len);
    put_u64(f + 16, kiln_codegen_hash(data, len, key_seed(key)));
    free(data);
    FILE *out = fopen(path, "ab");
    if (!out) return false;
    bool ok = fwrite(f, 1, sizeof f, out) == sizeof f;
    return fclose(out) == 0 && ok;
}

/* ---- loading ------------------------------------------------------------------------------- */

static kiln_status remember(const char *key, void *handle) {
    if (state.nobjects == state.cap_objects) {
        int ncap = state.cap_objects ? 2 * state.cap_objects : 16;
        loaded *grown = realloc(state.objects, sizeof *grown * (size_t)ncap);
        if (!grown) return kiln_error(KILN_ERR_MEMORY, "out of memory loading generated code");
        state.objects = grown;
        state.cap_objects = ncap;
    }
    loaded *l = &state.objects[state.nobjects++];
    snprintf(l->key, sizeof l->key, "%s", key);
    l->handle = handle;
    return KILN_OK;
}

/* Builds source into `target` (a path); the compiler's messages go to the error on failure. */
static kiln_status compile_to(const char *source, const char *dir, const char *target) {
    char src[4096], log[4096];
    snprintf(src, sizeof src, "%s/kernel.c", dir);
    snprintf(log, sizeof log, "%s/log.txt", dir);
    FILE *f = fopen(src, "wb");
    if (!f) return kiln_error(KILN_ERR_RUNTIME, "codegen: cannot write %s: %s", src, strerror(errno));
    size_t n = strlen(source);
    bool ok = fwrite(source, 1, n, f) == n;
    if (fclose(f) != 0 || !ok) return kiln_error(KILN_ERR_RUNTIME, "codegen: cannot write %s", src);
    char *argv[64];
    int argc = 0;
    for (int k = 0; k < state.cc_argc; k++) argv[argc++] = state.cc_argv[k];
    for (int k = 0; k < NFLAGS; k++) argv[argc++] = (char *)compile_flags[k];
    argv[argc++] = "-o";
    argv[argc++] = (char *)target;
    argv[argc++] = src;
    argv[argc] = NULL;
    int status;
    double t0 = now_seconds();
    int err = run_process(argv, log, &status);
    state.stats.compile_seconds += now_seconds() - t0;
    if (err != 0 || status != 0) {
        char *text = read_file(log, NULL);
        if (text && strlen(text) > 1500) text[1500] = '\0';
        kiln_status s = kiln_error(KILN_ERR_RUNTIME, "codegen: %s failed (%s): %s", state.cc_argv[0],
                                   err ? strerror(err) : "exit status", text ? text : "");
        free(text);
        return s;
    }
    state.stats.compiles++;
    return KILN_OK;
}

/* Finds the object for key on disk or builds it; *handle stays loaded for the process. */
static kiln_status build_and_load(const char *source, const char *key, const char *probe_symbol, void **handle) {
    char dirpath[4096], entry[4096 + 64], tmp[4096 + 96];
    bool use_disk = cache_dir(dirpath, sizeof dirpath);
    if (use_disk) {
        snprintf(entry, sizeof entry, "%s/%s.so", dirpath, key);
        if (access(entry, F_OK) == 0) {
            if (entry_valid(entry, key)) {
                void *h = dlopen(entry, RTLD_NOW | RTLD_LOCAL);
                if (h && dlsym(h, probe_symbol)) {
                    state.stats.disk_hits++;
                    *handle = h;
                    return KILN_OK;
                }
            }
            state.stats.rebuilt++; /* corrupt, truncated or unloadable: built again below */
            unlink(entry);
        }
    }
    char *dir = make_temp_dir();
    if (!dir) return kiln_error(KILN_ERR_RUNTIME, "codegen: cannot create a temporary directory: %s", strerror(errno));
    if (use_disk)
        snprintf(tmp, sizeof tmp, "%s/%s.tmp.%ld.%u.so", dirpath, key, (long)getpid(), state.tmp_counter++);
    else
        snprintf(tmp, sizeof tmp, "%s/kernel.so", dir);
    kiln_status s = compile_to(source, dir, tmp);
    const char *load_path = tmp;
    if (s == KILN_OK && use_disk) {
        if (add_footer(tmp, key) && rename(tmp, entry) == 0) {
            load_path = entry;
        } else {
            unlink(tmp);
            use_disk = false;
            s = kiln_error(KILN_ERR_RUNTIME, "codegen: cannot write %s", entry);
        }
    }
    void *h = NULL;
    if (s == KILN_OK) {
        h = dlopen(load_path, RTLD_NOW | RTLD_LOCAL);
        if (!h) s = kiln_error(KILN_ERR_RUNTIME, "codegen: dlopen failed: %s", dlerror());
    }
    if (!use_disk) unlink(tmp); /* the mapping stays valid */
    remove_temp_dir(dir);
    if (s == KILN_OK) *handle = h;
    return s;
}

/* key = hash(version, compiler identity, CPU, flags, source): 32 hex digits. */
static kiln_status make_key(const char *source, char key[33]) {
    size_t n = strlen(source) + strlen(state.cc_identity) + strlen(KILN_CODEGEN_VERSION) + 64;
    for (int k = 0; k < NFLAGS; k++) n += strlen(compile_flags[k]) + 1;
    char *material = malloc(n);
    if (!material) return kiln_error(KILN_ERR_MEMORY, "out of memory loading generated code");
    size_t len = (size_t)snprintf(material, n, "%s\n%s\n%016llx\n", KILN_CODEGEN_VERSION, state.cc_identity,
                                  (unsigned long long)state.cpu_hash);
    for (int k = 0; k < NFLAGS; k++) len += (size_t)snprintf(material + len, n - len, "%s ", compile_flags[k]);
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

static kiln_status load_locked(int n, const char *const *sources, const char *const *symbols, void **fns) {
    if (!compiler_ready(true)) return kiln_error(KILN_ERR_NOT_IMPLEMENTED, "codegen: no C compiler");
    char (*keys)[33] = malloc(sizeof *keys * (size_t)(n ? n : 1));
    int *todo = malloc(sizeof(int) * (size_t)(n ? n : 1)), ntodo = 0;
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
        char *batch = ntodo == 1 ? NULL : malloc(total), batch_key[33];
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
        if (s == KILN_OK) s = build_and_load(src, batch_key, symbols[todo[0]], &h);
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
    kiln_status s = load_locked(n, sources, symbols, fns);
    if (s != KILN_OK && s != KILN_ERR_MEMORY && s != KILN_ERR_NOT_IMPLEMENTED && !state.warned_failure) {
        fprintf(stderr, "kiln: warning: generated code unavailable, fused kernels run interpreted: %s\n",
                kiln_last_error());
        state.warned_failure = true;
    }
    pthread_mutex_unlock(&state.lock);
    return s;
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
    for (int k = 0; k < NFLAGS; k++) {
        size_t len = strlen(compile_flags[k]);
        if (n + len + 2 > sizeof out->flags) break;
        if (k) out->flags[n++] = ' ';
        memcpy(out->flags + n, compile_flags[k], len + 1);
        n += len;
    }
    pthread_mutex_lock(&state.lock);
    if (compiler_ready(false) && state.cc_identity)
        snprintf(out->identity, sizeof out->identity, "%s", state.cc_identity);
    out->cache_usable = cache_dir(out->cache_dir, sizeof out->cache_dir);
    pthread_mutex_unlock(&state.lock);
}

/* Whether name is an entry's: 32 hex digits, then ".so". */
static bool is_entry_name(const char *name) {
    for (int k = 0; k < 32; k++)
        if (!((name[k] >= '0' && name[k] <= '9') || (name[k] >= 'a' && name[k] <= 'f'))) return false;
    return strcmp(name + 32, ".so") == 0;
}

kiln_status kiln_codegen_cache_scan(bool clear, int64_t *entries, int64_t *bytes) {
    *entries = *bytes = 0;
    char dirpath[4096];
    pthread_mutex_lock(&state.lock);
    bool usable = cache_dir(dirpath, sizeof dirpath);
    pthread_mutex_unlock(&state.lock);
    if (!usable) {
        struct stat st;
        if (stat(dirpath, &st) != 0 && errno == ENOENT) return KILN_OK;
        return kiln_error(KILN_ERR_RUNTIME, "codegen cache: %s is not a usable cache directory (it must be a directory of this user's that others cannot write)",
                          dirpath);
    }
    DIR *d = opendir(dirpath);
    if (!d) return kiln_error(KILN_ERR_RUNTIME, "codegen cache: cannot read %s: %s", dirpath, strerror(errno));
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
    return s;
}
