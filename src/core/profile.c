/* The recorder: one list of events for the process, appended to under a lock while sessions are
 * open (see profile.h), each event packed (80 bytes) with its texts interned in one table. */
#define _GNU_SOURCE
#include "profile.h"

#include <pthread.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

_Atomic int kiln_profile_sessions;
_Atomic int kiln_profile_phase_sessions;
kiln_profile_loc_fn kiln_profile_eager_loc;

/* One recorded event, compact: texts are ids in the recorder's string table (0: absent), and the
 * three counts are a kernel's flops, bytes read and written, or an allocation's bytes, bytes in
 * use and peak. 80 bytes; a profile of a million eager ops (a kernel, an allocation and a free
 * each) holds about 240 MB of them. */
typedef struct packed_event {
    int64_t start_ns, end_ns;
    int64_t count[3];
    uint64_t graph;
    int32_t op, node, tid;
    uint32_t name, loc, inputs, outputs;
    uint8_t kind, source;
    int16_t depth;
} packed_event;

/* Interned texts: each distinct text stored once, NUL-terminated, at offset[id] of `chars` (id 0 is
 * unused: absent). A hash table of ids finds a text's id. */
typedef struct strings {
    char *chars;
    size_t nchars, capchars;
    size_t *offset;
    uint32_t n, cap; /* ids in use (including 0), offset's capacity */
    uint32_t *slots; /* hash table of ids (0: empty), nslots a power of two */
    uint32_t nslots;
} strings;

#define CHUNK 8192 /* events per block: the list grows without moving what it holds */

static struct {
    pthread_mutex_t lock;
    packed_event **chunks;
    size_t n, nchunks;
    strings str;
    struct named_thread {
        int32_t tid;
        char *name;
    } *names;
    size_t nnames;
} rec = {.lock = PTHREAD_MUTEX_INITIALIZER};

static _Thread_local int32_t thread_id, thread_depth;

static int32_t current_tid(void) {
    if (!thread_id) thread_id = (int32_t)syscall(SYS_gettid);
    return thread_id;
}

int64_t kiln_profile_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static uint64_t text_hash(const char *s) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
    return h;
}

static void strings_free(strings *t) {
    free(t->chars), free(t->offset), free(t->slots);
    memset(t, 0, sizeof *t);
}

/* The id of text s in t, added when new; 0 for NULL, and when out of memory (the text is lost). */
static uint32_t intern(strings *t, const char *s) {
    if (!s) return 0;
    if ((uint64_t)t->n * 2 + 2 > t->nslots) { /* grow the table, keeping it at most half full */
        uint32_t nslots = t->nslots ? t->nslots * 2 : 1024;
        uint32_t *slots = calloc(nslots, sizeof *slots);
        if (!slots) return 0;
        for (uint32_t id = 1; id < t->n; id++) {
            uint32_t k = (uint32_t)text_hash(t->chars + t->offset[id]) & (nslots - 1);
            while (slots[k]) k = (k + 1) & (nslots - 1);
            slots[k] = id;
        }
        free(t->slots);
        t->slots = slots, t->nslots = nslots;
    }
    uint32_t k = (uint32_t)text_hash(s) & (t->nslots - 1);
    for (; t->slots[k]; k = (k + 1) & (t->nslots - 1))
        if (strcmp(t->chars + t->offset[t->slots[k]], s) == 0) return t->slots[k];
    size_t len = strlen(s) + 1;
    if (t->n == 0) t->n = 1; /* id 0: absent */
    if (t->n + 1 > t->cap) {
        uint32_t cap = t->cap ? t->cap * 2 : 1024;
        size_t *offset = realloc(t->offset, cap * sizeof *offset);
        if (!offset) return 0;
        t->offset = offset, t->cap = cap;
    }
    if (t->nchars + len > t->capchars) {
        size_t cap = t->capchars ? t->capchars * 2 : 1 << 16;
        while (cap < t->nchars + len) cap *= 2;
        char *chars = realloc(t->chars, cap);
        if (!chars) return 0;
        t->chars = chars, t->capchars = cap;
    }
    memcpy(t->chars + t->nchars, s, len);
    t->offset[t->n] = t->nchars;
    t->nchars += len;
    t->slots[k] = t->n;
    return t->n++;
}

static const char *text_of(const strings *t, uint32_t id) { return id ? t->chars + t->offset[id] : NULL; }

static packed_event *event_at(size_t i) { return &rec.chunks[i / CHUNK][i % CHUNK]; }

static void clear_locked(void) {
    for (size_t k = 0; k < rec.nchunks; k++) free(rec.chunks[k]);
    free(rec.chunks);
    rec.chunks = NULL, rec.nchunks = 0, rec.n = 0;
    strings_free(&rec.str);
}

size_t kiln_profile_start(void) {
    pthread_mutex_lock(&rec.lock);
    size_t mark = rec.n;
    atomic_fetch_add(&kiln_profile_sessions, 1);
    pthread_mutex_unlock(&rec.lock);
    return mark;
}

static bool no_session_open(void) {
    return atomic_load(&kiln_profile_sessions) == 0 && atomic_load(&kiln_profile_phase_sessions) == 0;
}

/* Closes one session counted by `sessions`; the list is emptied when no session of either kind is left. */
static void stop_one(_Atomic int *sessions) {
    pthread_mutex_lock(&rec.lock);
    if (atomic_load(sessions) > 0) {
        atomic_fetch_sub(sessions, 1);
        if (no_session_open()) clear_locked();
    }
    pthread_mutex_unlock(&rec.lock);
}

void kiln_profile_stop(void) { stop_one(&kiln_profile_sessions); }

size_t kiln_profile_start_phases(void) {
    pthread_mutex_lock(&rec.lock);
    size_t mark = rec.n;
    atomic_fetch_add(&kiln_profile_phase_sessions, 1);
    pthread_mutex_unlock(&rec.lock);
    return mark;
}

void kiln_profile_stop_phases(void) { stop_one(&kiln_profile_phase_sessions); }

/* Appends e (texts interned). Recording never fails its caller: an event without memory is dropped. */
static void append(const kiln_profile_event *e) {
    pthread_mutex_lock(&rec.lock);
    /* a session that closed while this event was on its way: nobody is left to read it */
    if (no_session_open()) goto done;
    /* only phases while phase-only sessions are open (a kernel begun under a full session that closed) */
    if (e->kind != KILN_PROFILE_PHASE && atomic_load(&kiln_profile_sessions) == 0) goto done;
    if (rec.n == rec.nchunks * CHUNK) {
        packed_event **chunks = realloc(rec.chunks, (rec.nchunks + 1) * sizeof *chunks);
        if (!chunks) goto done;
        rec.chunks = chunks;
        if (!(rec.chunks[rec.nchunks] = malloc(CHUNK * sizeof(packed_event)))) goto done;
        rec.nchunks++;
    }
    packed_event *p = event_at(rec.n);
    *p = (packed_event){.start_ns = e->start_ns, .end_ns = e->end_ns, .graph = e->graph, .op = e->op,
                        .node = e->node, .tid = e->tid, .kind = (uint8_t)e->kind, .source = (uint8_t)e->source,
                        .depth = (int16_t)(e->depth > INT16_MAX ? INT16_MAX : e->depth)};
    if (e->kind == KILN_PROFILE_ALLOC) {
        p->count[0] = e->bytes, p->count[1] = e->in_use, p->count[2] = e->peak;
        p->name = 0; /* "alloc" / "free", by the sign of bytes */
    } else {
        p->count[0] = e->flops, p->count[1] = e->bytes_read, p->count[2] = e->bytes_written;
        p->name = intern(&rec.str, e->name ? e->name : "");
        p->loc = intern(&rec.str, e->loc);
        p->inputs = intern(&rec.str, e->inputs);
        p->outputs = intern(&rec.str, e->outputs);
    }
    rec.n++;
done:
    pthread_mutex_unlock(&rec.lock);
}

int64_t kiln_profile_begin(void) {
    thread_depth++;
    return kiln_profile_now();
}

void kiln_profile_record_kernel(kiln_profile_event *e, int64_t start) {
    e->end_ns = kiln_profile_now();
    e->start_ns = start;
    e->kind = KILN_PROFILE_KERNEL;
    e->tid = current_tid();
    e->depth = --thread_depth;
    append(e);
}

void kiln_profile_phase(const char *name, const char *detail, int64_t start) {
    kiln_profile_event e = {.kind = KILN_PROFILE_PHASE, .source = KILN_PROFILE_COMPILE, .op = -1, .node = -1,
                            .tid = current_tid(), .depth = thread_depth, .start_ns = start,
                            .end_ns = kiln_profile_now(), .name = name, .loc = detail};
    append(&e);
}

void kiln_profile_alloc(int64_t bytes, int64_t in_use, int64_t peak) {
    int64_t now = kiln_profile_now();
    kiln_profile_event e = {.kind = KILN_PROFILE_ALLOC, .source = KILN_PROFILE_MEMORY, .op = -1, .node = -1,
                            .tid = current_tid(), .depth = thread_depth, .start_ns = now, .end_ns = now,
                            .bytes = bytes, .in_use = in_use, .peak = peak};
    append(&e);
}

/* ---- logs: the events of a session, taken out of the recorder ------------------------------- */

struct kiln_profile_log {
    packed_event *ev;
    size_t n;
    strings str; /* only the texts its events name, ids renumbered */
    struct named_thread *names; /* each thread of its events, named when taken */
    size_t nnames;
};

kiln_status kiln_profile_take(size_t mark, kiln_profile_log **out) {
    *out = NULL;
    kiln_profile_log *log = calloc(1, sizeof *log);
    if (!log) return kiln_error(KILN_ERR_MEMORY, "out of memory taking a profile");
    pthread_mutex_lock(&rec.lock);
    size_t n = mark < rec.n ? rec.n - mark : 0;
    uint32_t *renumber = rec.str.n ? calloc(rec.str.n, sizeof *renumber) : NULL;
    log->ev = malloc((n ? n : 1) * sizeof *log->ev);
    bool ok = log->ev && (renumber || !rec.str.n);
    for (size_t i = 0; ok && i < n; i++) {
        packed_event e = *event_at(mark + i);
        uint32_t *ids[4] = {&e.name, &e.loc, &e.inputs, &e.outputs};
        for (int k = 0; k < 4 && ok; k++) {
            if (!*ids[k]) continue;
            if (!renumber[*ids[k]]) ok = (renumber[*ids[k]] = intern(&log->str, text_of(&rec.str, *ids[k]))) != 0;
            *ids[k] = renumber[*ids[k]];
        }
        log->ev[log->n++] = e;
    }
    pthread_mutex_unlock(&rec.lock);
    free(renumber);
    for (size_t i = 0; ok && i < log->n; i++) { /* one name per thread */
        size_t j = 0;
        while (j < log->nnames && log->names[j].tid != log->ev[i].tid) j++;
        if (j < log->nnames) continue;
        struct named_thread *grown = realloc(log->names, (log->nnames + 1) * sizeof *grown);
        if (!(ok = grown != NULL)) break;
        log->names = grown;
        log->names[log->nnames++] = (struct named_thread){log->ev[i].tid, kiln_profile_thread_name(log->ev[i].tid)};
    }
    if (!ok) {
        kiln_profile_log_free(log);
        return kiln_error(KILN_ERR_MEMORY, "out of memory taking %zu profile events", n);
    }
    *out = log;
    return KILN_OK;
}

void kiln_profile_log_free(kiln_profile_log *log) {
    if (!log) return;
    for (size_t k = 0; k < log->nnames; k++) free(log->names[k].name);
    free(log->names), free(log->ev);
    strings_free(&log->str);
    free(log);
}

size_t kiln_profile_log_count(const kiln_profile_log *log) { return log->n; }

size_t kiln_profile_log_bytes(const kiln_profile_log *log) {
    return sizeof *log + log->n * sizeof *log->ev + log->str.capchars + log->str.cap * sizeof(size_t) +
           log->str.nslots * sizeof(uint32_t) + log->nnames * sizeof *log->names;
}

void kiln_profile_log_get(const kiln_profile_log *log, size_t i, kiln_profile_event *e) {
    const packed_event *p = &log->ev[i];
    *e = (kiln_profile_event){.kind = p->kind, .source = p->source, .op = p->op, .node = p->node, .tid = p->tid,
                              .depth = p->depth, .graph = p->graph, .start_ns = p->start_ns, .end_ns = p->end_ns};
    if (p->kind == KILN_PROFILE_ALLOC) {
        e->bytes = p->count[0], e->in_use = p->count[1], e->peak = p->count[2];
        e->name = e->bytes >= 0 ? "alloc" : "free";
    } else {
        e->flops = p->count[0], e->bytes_read = p->count[1], e->bytes_written = p->count[2];
        e->name = text_of(&log->str, p->name), e->loc = text_of(&log->str, p->loc);
        e->inputs = text_of(&log->str, p->inputs), e->outputs = text_of(&log->str, p->outputs);
        if (!e->name) e->name = "";
    }
}

const char *kiln_profile_log_thread_name(const kiln_profile_log *log, int32_t tid) {
    for (size_t k = 0; k < log->nnames; k++)
        if (log->names[k].tid == tid) return log->names[k].name;
    return NULL;
}

/* Each event's texts copied into one block of its own (name first: freeing name frees them all). */
static bool copy_texts(kiln_profile_event *e) {
    if (e->kind == KILN_PROFILE_ALLOC) return true;
    const char *texts[4] = {e->name, e->loc, e->inputs, e->outputs};
    size_t len = 0;
    for (int k = 0; k < 4; k++) len += texts[k] ? strlen(texts[k]) + 1 : 0;
    char *block = malloc(len), *p = block;
    if (!block) return false;
    const char **fields[4] = {&e->name, &e->loc, &e->inputs, &e->outputs};
    for (int k = 0; k < 4; k++) {
        if (!texts[k]) continue;
        size_t n = strlen(texts[k]) + 1;
        memcpy(p, texts[k], n);
        *fields[k] = p;
        p += n;
    }
    return true;
}

kiln_status kiln_profile_events(size_t mark, kiln_profile_event **out, size_t *count) {
    kiln_profile_log *log;
    KILN_TRY(kiln_profile_take(mark, &log));
    size_t n = log->n, done = 0;
    kiln_profile_event *copy = calloc(n ? n : 1, sizeof *copy);
    for (; copy && done < n; done++) {
        kiln_profile_log_get(log, done, &copy[done]);
        if (!copy_texts(&copy[done])) break;
    }
    kiln_profile_log_free(log);
    if (!copy || done < n) {
        kiln_profile_events_free(copy, done);
        return kiln_error(KILN_ERR_MEMORY, "out of memory copying %zu profile events", n);
    }
    *out = copy, *count = n;
    return KILN_OK;
}

void kiln_profile_events_free(kiln_profile_event *events, size_t count) {
    for (size_t i = 0; events && i < count; i++)
        if (events[i].kind != KILN_PROFILE_ALLOC) free((void *)events[i].name);
    free(events);
}

void kiln_profile_name_thread(int32_t tid, const char *name) {
    if (tid == 0) tid = current_tid();
    char *copy = strdup(name ? name : "");
    if (!copy) return;
    pthread_mutex_lock(&rec.lock);
    size_t i = 0;
    while (i < rec.nnames && rec.names[i].tid != tid) i++;
    if (i == rec.nnames) {
        struct named_thread *grown = realloc(rec.names, (rec.nnames + 1) * sizeof *grown);
        if (!grown) {
            pthread_mutex_unlock(&rec.lock);
            free(copy);
            return;
        }
        rec.names = grown;
        rec.names[rec.nnames++] = (struct named_thread){tid, NULL};
    }
    free(rec.names[i].name);
    rec.names[i].name = copy;
    pthread_mutex_unlock(&rec.lock);
}

char *kiln_profile_thread_name(int32_t tid) {
    char *name = NULL;
    pthread_mutex_lock(&rec.lock);
    for (size_t i = 0; i < rec.nnames && !name; i++)
        if (rec.names[i].tid == tid) name = strdup(rec.names[i].name);
    pthread_mutex_unlock(&rec.lock);
    if (name) return name;
    char path[64], buf[64];
    snprintf(path, sizeof path, "/proc/self/task/%d/comm", (int)tid);
    FILE *f = fopen(path, "r");
    if (!f) return NULL;
    if (fgets(buf, sizeof buf, f)) {
        buf[strcspn(buf, "\n")] = '\0';
        name = strdup(buf);
    }
    fclose(f);
    return name;
}
