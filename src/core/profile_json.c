/* Chrome Trace Event JSON (the format Perfetto and chrome://tracing open) of the recorder's events:
 * "X" (complete) events per kernel and compile phase with their args, a "C" counter track of the
 * bytes of tensor memory in use, and "M" metadata naming the process and each thread. Times are
 * microseconds from the first event. Any runtime can call kiln_profile_write_chrome. Events are streamed from a log (one
 * unpacked at a time), never all held unpacked at once. */
#include "profile.h"

#include <unistd.h>

static void put_string(FILE *f, const char *s) {
    fputc('"', f);
    for (; s && *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c < 0x20) fprintf(f, "\\u%04x", c);
        else fputc(c, f);
    }
    fputc('"', f);
}

/* "float32[2,3];int64[4]" as a JSON list of strings. */
static void put_list(FILE *f, const char *s) {
    fputc('[', f);
    for (bool first = true; s && *s; first = false) {
        size_t n = strcspn(s, ";");
        char item[256];
        snprintf(item, sizeof item, "%.*s", (int)(n < sizeof item ? n : sizeof item - 1), s);
        if (!first) fputc(',', f);
        put_string(f, item);
        s += n + (s[n] == ';');
    }
    fputc(']', f);
}

static const char *source_name(int32_t source) {
    static const char *const names[] = {"eager", "kbk", "sink", "compile", "memory"};
    return source >= 0 && source < (int32_t)(sizeof names / sizeof *names) ? names[source] : "other";
}

static void put_event(FILE *f, const kiln_profile_event *e, int64_t t0, int pid, unsigned what) {
    double ts = (double)(e->start_ns - t0) / 1e3;
    if (e->kind == KILN_PROFILE_ALLOC) {
        fprintf(f, "{\"name\":\"memory\",\"cat\":\"memory\",\"ph\":\"C\",\"ts\":%.3f,\"pid\":%d,\"tid\":%d,"
                   "\"args\":{\"bytes in use\":%lld}}",
                ts, pid, (int)e->tid, (long long)e->in_use);
        return;
    }
    fputs("{\"name\":", f);
    put_string(f, e->name);
    fprintf(f, ",\"cat\":\"%s\",\"ph\":\"X\",\"ts\":%.3f,\"dur\":%.3f,\"pid\":%d,\"tid\":%d,\"args\":{",
            source_name(e->source), ts, (double)(e->end_ns - e->start_ns) / 1e3, pid, (int)e->tid);
    if (e->kind == KILN_PROFILE_PHASE) {
        fputs("\"detail\":", f);
        put_string(f, e->loc);
        fputs("}}", f);
        return;
    }
    fputs("\"location\":", f);
    put_string(f, e->loc);
    if (what & KILN_PROFILE_WRITE_SHAPES) {
        fputs(",\"inputs\":", f);
        put_list(f, e->inputs);
        fputs(",\"outputs\":", f);
        put_list(f, e->outputs);
    }
    fprintf(f, ",\"flops\":%lld,\"bytes_read\":%lld,\"bytes_written\":%lld,\"node\":%d,\"graph\":%llu}}",
            (long long)e->flops, (long long)e->bytes_read, (long long)e->bytes_written, (int)e->node,
            (unsigned long long)e->graph);
}

static kiln_status write_log(FILE *f, const kiln_profile_log *log, unsigned what) {
    int pid = (int)getpid();
    size_t n = kiln_profile_log_count(log);
    kiln_profile_event e;
    int64_t t0 = 0;
    for (size_t i = 0; i < n; i++) {
        kiln_profile_log_get(log, i, &e);
        t0 = i == 0 || e.start_ns < t0 ? e.start_ns : t0;
    }
    fprintf(f, "{\"displayTimeUnit\":\"ns\",\"traceEvents\":[\n");
    fprintf(f, "{\"name\":\"process_name\",\"ph\":\"M\",\"ts\":0,\"pid\":%d,\"tid\":0,\"args\":{\"name\":\"kiln\"}}", pid);
    int32_t tids[64];
    size_t ntids = 0;
    for (size_t i = 0; i < n && ntids < sizeof tids / sizeof *tids; i++) { /* one thread_name per thread */
        kiln_profile_log_get(log, i, &e);
        size_t j = 0;
        while (j < ntids && tids[j] != e.tid) j++;
        if (j < ntids) continue;
        tids[ntids++] = e.tid;
        const char *name = kiln_profile_log_thread_name(log, e.tid);
        char fallback[32];
        snprintf(fallback, sizeof fallback, "thread %d", (int)e.tid);
        fprintf(f, ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"ts\":0,\"pid\":%d,\"tid\":%d,\"args\":{\"name\":", pid,
                (int)e.tid);
        put_string(f, name ? name : fallback);
        fputs("}}", f);
    }
    for (size_t i = 0; i < n; i++) {
        kiln_profile_log_get(log, i, &e);
        if (e.kind == KILN_PROFILE_ALLOC && !(what & KILN_PROFILE_WRITE_MEMORY)) continue;
        fputs(",\n", f);
        put_event(f, &e, t0, pid, what);
    }
    fputs("\n]}\n", f);
    return ferror(f) ? kiln_error(KILN_ERR_RUNTIME, "profile: writing the trace failed") : KILN_OK;
}

kiln_status kiln_profile_log_write_chrome(const kiln_profile_log *log, const char *path, unsigned what) {
    FILE *f = fopen(path, "w");
    if (!f) return kiln_error(KILN_ERR_RUNTIME, "profile: cannot write %s", path);
    kiln_status s = write_log(f, log, what);
    if (fclose(f) != 0 && s == KILN_OK) s = kiln_error(KILN_ERR_RUNTIME, "profile: writing %s failed", path);
    return s;
}

kiln_status kiln_profile_write_chrome(const char *path, size_t mark, unsigned what) {
    kiln_profile_log *log = NULL;
    KILN_TRY(kiln_profile_take(mark, &log));
    kiln_status s = kiln_profile_log_write_chrome(log, path, what);
    kiln_profile_log_free(log);
    return s;
}
