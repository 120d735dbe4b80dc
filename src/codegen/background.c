/* Background builds of generated code: one builder thread runs the compiler for jobs handed over
 * by kiln_codegen_load_later, while the threads that asked keep running their interpreted paths.
 * A finished job stores each function into the place its asker named (an atomic release store,
 * under the queue's lock, so kiln_codegen_forget can promise that a place it returns from is
 * never written again). Jobs run one at a time, in the order given: a 2-core machine gains
 * nothing from two compilers beside the program that is running. A forked child starts with no
 * builder and no queue (what its parent queued stays interpreted there). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "codegen.h"

typedef struct job {
    int n;
    char **sources, **symbols;
    void ***targets; /* where each function goes; NULL once forgotten */
    struct job *next;
} job;

static struct {
    pthread_mutex_t lock;
    pthread_cond_t changed;
    job *head, *tail, *running;
    bool started;
} queue = {.lock = PTHREAD_MUTEX_INITIALIZER, .changed = PTHREAD_COND_INITIALIZER};

static atomic_bool enabled;

static void job_free(job *j) {
    if (!j) return;
    for (int k = 0; k < j->n; k++) free(j->sources ? j->sources[k] : NULL), free(j->symbols ? j->symbols[k] : NULL);
    free(j->sources), free(j->symbols), free(j->targets), free(j);
}

static void *builder(void *arg) {
    (void)arg;
    for (;;) {
        pthread_mutex_lock(&queue.lock);
        while (!queue.head) pthread_cond_wait(&queue.changed, &queue.lock);
        job *j = queue.head;
        queue.head = j->next;
        j->next = NULL;
        if (!queue.head) queue.tail = NULL;
        queue.running = j;
        pthread_mutex_unlock(&queue.lock);

        void **fns = calloc((size_t)j->n, sizeof *fns);
        bool ok = fns && kiln_codegen_load_many(j->n, (const char *const *)j->sources, (const char *const *)j->symbols,
                                                fns) == KILN_OK;
        if (!ok) kiln_clear_error(); /* the driver warned once: the interpreted paths stay */

        pthread_mutex_lock(&queue.lock);
        for (int k = 0; k < j->n && ok; k++)
            if (j->targets[k] && fns[k]) __atomic_store_n(j->targets[k], fns[k], __ATOMIC_RELEASE);
        queue.running = NULL;
        pthread_cond_broadcast(&queue.changed);
        pthread_mutex_unlock(&queue.lock);
        free(fns);
        job_free(j);
    }
    return NULL;
}

static void after_fork_in_child(void) {
    pthread_mutex_init(&queue.lock, NULL);
    pthread_cond_init(&queue.changed, NULL);
    queue.head = queue.tail = queue.running = NULL; /* the parent's jobs: left to it */
    queue.started = false;
}

static pthread_once_t at_fork_once = PTHREAD_ONCE_INIT;
static void register_at_fork(void) { pthread_atfork(NULL, NULL, after_fork_in_child); }

void kiln_codegen_set_background(bool on) { atomic_store(&enabled, on); }

bool kiln_codegen_background(void) { return atomic_load(&enabled); }

__attribute__((constructor)) static void background_from_environment(void) {
    const char *v = getenv("KILN_BACKGROUND_COMPILE");
    if (v && v[0] == '1' && v[1] == '\0') atomic_store(&enabled, true);
}

static char *copy(const char *s) {
    size_t n = strlen(s) + 1;
    char *c = malloc(n);
    if (c) memcpy(c, s, n);
    return c;
}

kiln_status kiln_codegen_load_later(int n, const char *const *sources, const char *const *symbols, void **const *targets) {
    pthread_once(&at_fork_once, register_at_fork);
    job *j = calloc(1, sizeof *j);
    bool ok = j && (j->sources = calloc((size_t)n, sizeof(char *))) && (j->symbols = calloc((size_t)n, sizeof(char *))) &&
              (j->targets = calloc((size_t)n, sizeof(void **)));
    if (j) j->n = n;
    for (int k = 0; k < n && ok; k++) {
        ok = (j->sources[k] = copy(sources[k])) && (j->symbols[k] = copy(symbols[k]));
        if (ok) j->targets[k] = targets[k];
    }
    if (!ok) {
        job_free(j);
        return kiln_error(KILN_ERR_MEMORY, "out of memory queueing generated code");
    }
    pthread_mutex_lock(&queue.lock);
    kiln_status s = KILN_OK;
    if (!queue.started) {
        pthread_t t;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        if (pthread_create(&t, &attr, builder, NULL) == 0) queue.started = true;
        else s = kiln_error(KILN_ERR_RUNTIME, "codegen: cannot start the background builder");
        pthread_attr_destroy(&attr);
    }
    if (s == KILN_OK) {
        if (queue.tail) queue.tail->next = j;
        else queue.head = j;
        queue.tail = j;
        pthread_cond_broadcast(&queue.changed);
    }
    pthread_mutex_unlock(&queue.lock);
    if (s != KILN_OK) job_free(j);
    return s;
}

static void forget_in(job *j, void **target) {
    for (; j; j = j->next)
        for (int k = 0; k < j->n; k++)
            if (j->targets[k] == target) j->targets[k] = NULL;
}

void kiln_codegen_forget(void **target) {
    pthread_mutex_lock(&queue.lock);
    forget_in(queue.head, target);
    forget_in(queue.running, target); /* off the list: its next is NULL */
    pthread_mutex_unlock(&queue.lock);
}

void kiln_codegen_wait(void) {
    pthread_mutex_lock(&queue.lock);
    while (queue.head || queue.running) pthread_cond_wait(&queue.changed, &queue.lock);
    pthread_mutex_unlock(&queue.lock);
}
