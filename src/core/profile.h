/* The recorder behind profiling (issue 14): while at least one profiling session is open, every
 * executed kernel (eager kiln_apply, the kbk and sink backends, control-flow bodies), every tensor
 * allocation and every compile phase is appended as an event to one process-wide list, with the
 * thread that ran it and monotonic nanosecond times. Off, it costs the callers one predictable
 * branch on kiln_profiling(). Sessions nest and overlap: each remembers the event count when it
 * opened (its mark) and reads the events from there; the list is emptied when the last one closes.
 *
 * The kernel events' footprints (FLOPs, bytes) come from the op table (kiln_op_flops,
 * src/ops/footprint.c); a graph node's (its fused group's ops, its source line) from
 * src/runtime/profile_node.c. kiln_profile_write_chrome (src/core/profile_json.c) writes events as
 * Chrome Trace Event JSON, for the Python profiler and any C runtime alike. */
#ifndef KILN_CORE_PROFILE_H
#define KILN_CORE_PROFILE_H

#include "internal.h"

typedef enum kiln_profile_kind {
    KILN_PROFILE_KERNEL, /* a kernel ran: [start, end], op, shapes, footprint */
    KILN_PROFILE_PHASE,  /* a compile phase: [start, end], name (and detail in loc) */
    KILN_PROFILE_ALLOC,  /* a tensor block allocated (bytes > 0) or freed (bytes < 0) at start */
} kiln_profile_kind;

typedef enum kiln_profile_source {
    KILN_PROFILE_EAGER,
    KILN_PROFILE_KBK,
    KILN_PROFILE_SINK,
    KILN_PROFILE_COMPILE,
    KILN_PROFILE_MEMORY,
} kiln_profile_source;

typedef struct kiln_profile_event {
    int32_t kind, source;
    int32_t op;    /* kiln_op of a kernel, or -1 */
    int32_t node;  /* the graph node of a kbk / sink kernel, or -1 */
    int32_t tid;   /* the OS thread id */
    int32_t depth; /* kernels running around it on the same thread (a control-flow node's body: 1) */
    uint64_t graph; /* which compiled graph ran it (an id, not a pointer to use), 0 for eager */
    int64_t start_ns, end_ns;
    int64_t flops, bytes_read, bytes_written;
    int64_t bytes, in_use, peak; /* allocations: this block (negative when freed), then all blocks */
    /* texts, NULL when absent: kernels' name (op, or "fused(mul+add)"), loc ("file.py:12"),
     * inputs / outputs ("float32[2,3];int64[4]"); a phase's name and detail (in loc) */
    const char *name, *loc, *inputs, *outputs;
} kiln_profile_event;

/* Hidden: read directly by every executor loop and allocation. Nonzero: sessions are open. */
extern __attribute__((visibility("hidden"))) _Atomic int kiln_profile_sessions;

static inline bool kiln_profiling(void) {
    return __builtin_expect(atomic_load_explicit(&kiln_profile_sessions, memory_order_relaxed) != 0, 0);
}

/* Hidden: phase-only sessions (kiln_profile_start_phases), which record compile phases but no
 * kernel or allocation events: what kiln.jit keeps of every capture for explain(). */
extern __attribute__((visibility("hidden"))) _Atomic int kiln_profile_phase_sessions;

/* Whether compile phases are recorded: a full or a phase-only session is open. */
static inline bool kiln_profiling_phases(void) {
    return __builtin_expect(atomic_load_explicit(&kiln_profile_sessions, memory_order_relaxed) != 0 ||
                                atomic_load_explicit(&kiln_profile_phase_sessions, memory_order_relaxed) != 0,
                            0);
}

/* Opens a session: returns its mark (the number of events recorded before it). */
KILN_API size_t kiln_profile_start(void);
/* Closes one session; the last one to close empties the list. */
KILN_API void kiln_profile_stop(void);
/* A session that records compile phases only (no kernel or allocation events, so a capture's
 * eager run pays nothing per kernel); closed by kiln_profile_stop_phases. Its mark works as a full
 * session's. */
KILN_API size_t kiln_profile_start_phases(void);
KILN_API void kiln_profile_stop_phases(void);
/* A session's events, taken out of the recorder as they are kept there (packed, texts interned):
 * what kiln.profiler keeps of a profile and what the JSON writer streams from. The threads of its
 * events are named when it is taken. */
typedef struct kiln_profile_log kiln_profile_log;
KILN_API kiln_status kiln_profile_take(size_t mark, kiln_profile_log **out);
KILN_API void kiln_profile_log_free(kiln_profile_log *log);
KILN_API size_t kiln_profile_log_count(const kiln_profile_log *log);
/* The bytes the log holds (its events, texts and thread names). */
KILN_API size_t kiln_profile_log_bytes(const kiln_profile_log *log);
/* Event i, its texts pointing into the log (valid while it lives). */
KILN_API void kiln_profile_log_get(const kiln_profile_log *log, size_t i, kiln_profile_event *e);
/* The name thread tid had when the log was taken, or NULL. */
KILN_API const char *kiln_profile_log_thread_name(const kiln_profile_log *log, int32_t tid);
/* Writes the log as kiln_profile_write_chrome does. */
KILN_API kiln_status kiln_profile_log_write_chrome(const kiln_profile_log *log, const char *path, unsigned what);

/* Events recorded from mark on, copied into a block the caller frees with kiln_profile_events_free. */
KILN_API kiln_status kiln_profile_events(size_t mark, kiln_profile_event **out, size_t *count);
KILN_API void kiln_profile_events_free(kiln_profile_event *events, size_t count);
/* Names thread tid (0: the calling thread) in the traces (else the name the OS has for it). */
KILN_API void kiln_profile_name_thread(int32_t tid, const char *name);
/* The name of thread tid (malloc'd), from kiln_profile_name_thread or the OS; NULL when unknown. */
char *kiln_profile_thread_name(int32_t tid);

/* Where an eager kernel was called from ("file:line" written into buf, returned), or NULL: set by
 * the Python extension (the innermost Python frame outside the kiln package), read by kiln_apply
 * while profiling, before the kernel's clock starts. */
typedef const char *(*kiln_profile_loc_fn)(char *buf, size_t size);
extern KILN_API kiln_profile_loc_fn kiln_profile_eager_loc;

/* Monotonic nanoseconds. */
KILN_API int64_t kiln_profile_now(void);
/* Before a kernel runs (only when kiln_profiling()): its start time, never 0; the thread's depth
 * goes up until the event is recorded with kiln_profile_record_kernel. */
int64_t kiln_profile_begin(void);
/* Records the kernel begun at start (end: now); e's times, tid and depth are filled in here, its
 * texts copied. */
void kiln_profile_record_kernel(kiln_profile_event *e, int64_t start);
/* A compile phase from start to now. */
KILN_API void kiln_profile_phase(const char *name, const char *detail, int64_t start);
/* A tensor block of bytes allocated (> 0) or freed (< 0); in_use counts all blocks after it. */
void kiln_profile_alloc(int64_t bytes, int64_t in_use, int64_t peak);

/* Writes events from mark on as Chrome Trace Event JSON (Perfetto, chrome://tracing): complete
 * events per kernel and phase with their args (location, shapes, FLOPs, bytes), a memory counter
 * track, thread names. */
enum { KILN_PROFILE_WRITE_SHAPES = 1, KILN_PROFILE_WRITE_MEMORY = 2, KILN_PROFILE_WRITE_ALL = 3 };
/* what: KILN_PROFILE_WRITE_* bits (without SHAPES the kernels' inputs/outputs are left out, without
 * MEMORY the counter track). */
KILN_API kiln_status kiln_profile_write_chrome(const char *path, size_t mark, unsigned what);

#endif
