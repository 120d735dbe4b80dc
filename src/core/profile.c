/* The recorder: one list of events for the process, appended to under a lock while sessions are
 * open (see profile.h). Each event's texts are copied into one block of their own. */
#define _GNU_SOURCE
#include "profile.h"

#include <pthread.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

_Atomic int kiln_profile_sessions;

static struct {
    pthread_mutex_t lock;
    kiln_profile_event *ev;
    size_t n, cap;
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

/* An allocation's texts are static ("alloc", "free"): no block of its own. */
static void free_texts(kiln_profile_event *e) {
    if (e->kind != KILN_PROFILE_ALLOC) free((void *)e->name);
}

static void clear_locked(void) {
    for (size_t i = 0; i < rec.n; i++) free_texts(&rec.ev[i]);
    rec.n = 0;
}

size_t kiln_profile_start(void) {
    pthread_mutex_lock(&rec.lock);
    size_t mark = rec.n;
    atomic_fetch_add(&kiln_profile_sessions, 1);
    pthread_mutex_unlock(&rec.lock);
    return mark;
}

void kiln_profile_stop(void) {
    pthread_mutex_lock(&rec.lock);
    if (atomic_load(&kiln_profile_sessions) > 0 && atomic_fetch_sub(&kiln_profile_sessions, 1) == 1) clear_locked();
    pthread_mutex_unlock(&rec.lock);
}

/* One block holding the texts, NUL-terminated one after another; the event's pointers point into it
 * (name first: freeing name frees them all). */
static bool copy_texts(kiln_profile_event *e) {
    if (e->kind == KILN_PROFILE_ALLOC) return true;
    if (!e->name) e->name = "";
    const char *texts[4] = {e->name, e->loc, e->inputs, e->outputs};
    size_t len = 0;
    for (int k = 0; k < 4; k++) len += texts[k] ? strlen(texts[k]) + 1 : 0;
    char *block = malloc(len), *p = block;
    if (!block) return false;
    const char **fields[4] = {&e->name, &e->loc, &e->inputs, &e->outputs};
    for (int k = 0; k < 4; k++) {
        if (!texts[k]) {
            *fields[k] = NULL;
            continue;
        }
        size_t n = strlen(texts[k]) + 1;
        memcpy(p, texts[k], n);
        *fields[k] = p;
        p += n;
    }
    return true;
}

/* Appends e (texts copied). Recording never fails its caller: an event without memory is dropped. */
static void append(kiln_profile_event *e) {
    if (!copy_texts(e)) return;
    pthread_mutex_lock(&rec.lock);
    if (rec.n == rec.cap) {
        size_t cap = rec.cap ? rec.cap * 2 : 1024;
        kiln_profile_event *grown = realloc(rec.ev, cap * sizeof *grown);
        if (!grown) {
            pthread_mutex_unlock(&rec.lock);
            free_texts(e);
            return;
        }
        rec.ev = grown, rec.cap = cap;
    }
    /* a session that closed while this event was on its way: nobody is left to read it */
    if (atomic_load(&kiln_profile_sessions) > 0) rec.ev[rec.n++] = *e;
    else free_texts(e);
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
                            .bytes = bytes, .in_use = in_use, .peak = peak, .name = bytes >= 0 ? "alloc" : "free"};
    append(&e);
}

kiln_status kiln_profile_events(size_t mark, kiln_profile_event **out, size_t *count) {
    pthread_mutex_lock(&rec.lock);
    size_t n = mark < rec.n ? rec.n - mark : 0;
    kiln_profile_event *copy = calloc(n ? n : 1, sizeof *copy);
    size_t done = 0;
    for (; copy && done < n; done++) {
        copy[done] = rec.ev[mark + done];
        if (!copy_texts(&copy[done])) break;
    }
    pthread_mutex_unlock(&rec.lock);
    if (!copy || done < n) {
        kiln_profile_events_free(copy, done);
        return kiln_error(KILN_ERR_MEMORY, "out of memory copying %zu profile events", n);
    }
    *out = copy, *count = n;
    return KILN_OK;
}

void kiln_profile_events_free(kiln_profile_event *events, size_t count) {
    for (size_t i = 0; events && i < count; i++) free_texts(&events[i]);
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
