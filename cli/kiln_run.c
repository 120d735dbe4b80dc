/* kiln-run: runs a kiln model file without Python (MegEngine's load_and_run as the model).
 *
 *   kiln-run MODEL [--input NAME=FILE.npy]... [--iter N] [--warmup N] [--threads N]
 *            [--backend NAME] [--model-info] [--output-dir DIR] [--check] [--tolerance X]
 *            [--seed N] [--profile TRACE.json] [--graph N | --graph-name NAME]
 *
 * Inputs not given are random (uniform in [-1, 1), by the model's shapes; --seed). Each timed
 * iteration prints its time, then min/median/max. --check runs the file's embedded test cases
 * and exits 1 when an output differs from its expected value by more than the tolerance
 * (relative, see kiln_tensor_max_error; default 1e-3, 1e-1 for float16/bfloat16 outputs),
 * printing the worst error. --profile writes the compile phases and every kernel of every run as
 * Chrome Trace Event JSON. --graph / --graph-name pick a graph of a file of several (trace.dump's
 * append=True; default the first). --model-info also lists the file's graphs and the names the
 * file keeps (parameters, values, ops, op priorities). --output-dir writes output NAME as DIR/NAME.npy,
 * bytes of NAME that would make it more than a plain file name written %XX (output_file_name); a
 * bfloat16 output (amp) is written widened to float32, exactly (.npy has no bfloat16). Uses the public C API, and the recorder of src/core/profile.h. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ctype.h>
#include <fcntl.h>
#include <stdbool.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/profile.h"
#include "kiln/config.h"
#include "kiln/kiln.h"
#include "npy.h"

typedef struct {
    const char *model, *output_dir, *backend, *profile, *graph_name;
    long graph;
    const char **input_specs;
    int ninput_specs;
    long iters, warmup, threads;
    bool info, check;
    double tolerance; /* < 0: by the output's dtype (default_tolerance) */
    unsigned long long seed;
} options;

static void usage(FILE *to) {
    fprintf(to, "usage: kiln-run MODEL [--input NAME=FILE.npy]... [--iter N] [--warmup N] [--threads N]\n"
                "                [--backend NAME] [--model-info] [--output-dir DIR] [--check] [--tolerance X]\n"
                "                [--seed N] [--profile TRACE.json] [--graph N | --graph-name NAME]\n"
                "backends: %s\n", kiln_backend_names());
}

static int die(const char *what) {
    fprintf(stderr, "kiln-run: %s: %s\n", what, kiln_last_error());
    return 2;
}

static bool parse_long(const char *s, long lo, long hi, long *out) {
    char *e;
    errno = 0;
    long v = strtol(s, &e, 10);
    if (errno || *e || e == s || v < lo || v > hi) return false;
    *out = v;
    return true;
}

static int parse_args(int argc, char **argv, options *o) {
    *o = (options){.backend = "kbk", .iters = 10, .warmup = 1, .threads = 0, .tolerance = -1, .seed = 0};
    o->input_specs = calloc((size_t)argc, sizeof *o->input_specs);
    for (int k = 1; k < argc; k++) {
        const char *a = argv[k], *v = k + 1 < argc ? argv[k + 1] : NULL;
        bool takes = strcmp(a, "--input") == 0 || strcmp(a, "--iter") == 0 || strcmp(a, "--warmup") == 0 ||
                     strcmp(a, "--threads") == 0 || strcmp(a, "--backend") == 0 || strcmp(a, "--output-dir") == 0 ||
                     strcmp(a, "--tolerance") == 0 || strcmp(a, "--seed") == 0 || strcmp(a, "--profile") == 0 ||
                     strcmp(a, "--graph") == 0 || strcmp(a, "--graph-name") == 0;
        if (takes && !v) {
            fprintf(stderr, "kiln-run: %s needs a value\n", a);
            return 2;
        }
        bool ok = true;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            exit(0);
        } else if (strcmp(a, "--input") == 0) {
            o->input_specs[o->ninput_specs++] = v;
        } else if (strcmp(a, "--iter") == 0) {
            ok = parse_long(v, 0, 1L << 30, &o->iters);
        } else if (strcmp(a, "--warmup") == 0) {
            ok = parse_long(v, 0, 1L << 30, &o->warmup);
        } else if (strcmp(a, "--threads") == 0) {
            ok = parse_long(v, 1, KILN_MAX_THREADS, &o->threads);
        } else if (strcmp(a, "--backend") == 0) {
            o->backend = v;
            ok = false; /* a registered backend's name */
            for (int b = 0; b < kiln_backend_count(); b++) ok |= strcmp(v, kiln_backend_name_at(b)) == 0;
            if (!ok) {
                fprintf(stderr, "kiln-run: unknown backend '%s'; registered backends: %s\n", v, kiln_backend_names());
                return 2;
            }
        } else if (strcmp(a, "--output-dir") == 0) {
            o->output_dir = v;
        } else if (strcmp(a, "--tolerance") == 0) {
            char *e;
            o->tolerance = strtod(v, &e);
            ok = *e == '\0' && e != v && o->tolerance >= 0;
        } else if (strcmp(a, "--seed") == 0) {
            long s;
            ok = parse_long(v, 0, 1L << 62, &s);
            o->seed = (unsigned long long)s;
        } else if (strcmp(a, "--profile") == 0) {
            o->profile = v;
        } else if (strcmp(a, "--graph") == 0) {
            ok = parse_long(v, 0, INT32_MAX, &o->graph);
        } else if (strcmp(a, "--graph-name") == 0) {
            o->graph_name = v;
        } else if (strcmp(a, "--model-info") == 0) {
            o->info = true;
        } else if (strcmp(a, "--check") == 0) {
            o->check = true;
        } else if (a[0] == '-' || o->model) {
            fprintf(stderr, "kiln-run: unexpected argument '%s'\n", a);
            usage(stderr);
            return 2;
        } else {
            o->model = a;
        }
        if (!ok) {
            fprintf(stderr, "kiln-run: bad value '%s' for %s\n", v, a);
            return 2;
        }
        if (takes) k++;
    }
    if (!o->model) {
        usage(stderr);
        return 2;
    }
    return 0;
}

static void put_meta(const kiln_meta *m) {
    printf("%s[", kiln_dtype_name(m->dtype));
    for (int d = 0; d < m->ndim; d++) printf(d ? ", %lld" : "%lld", (long long)m->shape[d]);
    printf("]");
}

/* The names the file keeps: parameters (captures), other values, ops and their priorities. */
static void names_info(const kiln_graph *g) {
    for (int32_t v = 0; v < g->nvalues; v++) {
        const char *name = kiln_graph_value_name(g, v);
        if (name) printf("%s %%%d: %s\n", g->values[v].kind == KILN_VALUE_CAPTURED ? "param" : "var", v, name);
    }
    for (int32_t i = 0; i < g->nnodes; i++) {
        const char *name = kiln_graph_node_name(g, i);
        int32_t priority = kiln_graph_node_priority(g, i);
        if (!name && !priority) continue;
        printf("op %d (%s):", i, kiln_op_table[g->nodes[i].op].name);
        if (name) printf(" %s", name);
        if (priority) printf(" priority %d", priority);
        printf("\n");
    }
}

static void model_info(const kiln_model *m, const kiln_executable *e) {
    const kiln_graph *g = kiln_model_graph(m);
    printf("producer: %s\n", kiln_model_producer(m));
    for (int32_t k = 0; k < kiln_model_num_inputs(m); k++) {
        printf("input %d: %s ", k, kiln_model_input_name(m, k));
        put_meta(kiln_model_input_meta(m, k));
        printf("\n");
    }
    for (int32_t k = 0; k < kiln_model_num_outputs(m); k++) {
        printf("output %d: %s ", k, kiln_model_output_name(m, k));
        put_meta(kiln_model_output_meta(m, k));
        printf("\n");
    }
    printf("nodes: %d\nparameter bytes: %zu\ndata bytes: %zu\ntest cases: %d\n", g->nnodes, kiln_model_param_bytes(m),
           kiln_model_data_bytes(m), kiln_model_num_cases(m));
    printf("arena bytes: %zu\nbackend: %s\n", kiln_executable_arena_bytes(e), kiln_executable_backend(e));
    if (*kiln_model_metadata(m)) printf("metadata: %s\n", kiln_model_metadata(m));
    if (*kiln_model_user_info(m)) printf("user info: %s\n", kiln_model_user_info(m));
    char *order = kiln_executable_order_string(e);
    if (order) printf("order: %s\n", order);
    free(order);
    printf("format version: %d\ngraph: %d of %d, '%s'\n", kiln_model_version(m), kiln_model_index(m),
           kiln_model_num_graphs(m), kiln_model_name(m));
    for (int32_t k = 0; k < kiln_model_num_graphs(m); k++) printf("file graph %d: %s\n", k, kiln_model_graph_name(m, k));
    names_info(g);
}

/* A contiguous copy when t is not contiguous (new reference either way). */
static kiln_status contiguous(kiln_tensor *t, kiln_tensor **out) {
    if (kiln_tensor_is_contiguous(t)) {
        kiln_tensor_retain(t);
        *out = t;
        return KILN_OK;
    }
    return kiln_apply1(KILN_OP_CONTIGUOUS, t, NULL, out);
}

static kiln_status random_input(const kiln_meta *m, kiln_tensor **out) {
    kiln_attrs a = {0};
    a.i[a.ni++] = m->dtype;
    a.i[a.ni++] = m->ndim;
    for (int d = 0; d < m->ndim; d++) a.i[a.ni++] = m->shape[d];
    a.f[a.nf++] = -1;
    a.f[a.nf++] = 1;
    if (kiln_dtype_is_float(m->dtype)) return kiln_apply(KILN_OP_RAND, 0, NULL, &a, out);
    a.f[0] = 0; /* integer and bool inputs: zeros */
    a.nf = 1;
    return kiln_apply(KILN_OP_FULL, 0, NULL, &a, out);
}

static int load_inputs(const options *o, const kiln_model *m, kiln_tensor **in) {
    int32_t nin = kiln_model_num_inputs(m);
    for (int k = 0; k < o->ninput_specs; k++) {
        const char *spec = o->input_specs[k], *eq = strchr(spec, '=');
        char name[4096];
        if (!eq || (size_t)(eq - spec) >= sizeof name) {
            fprintf(stderr, "kiln-run: --input takes NAME=FILE.npy, got '%s'\n", spec);
            return 2;
        }
        memcpy(name, spec, (size_t)(eq - spec));
        name[eq - spec] = '\0';
        int32_t idx = kiln_model_input_index(m, name);
        if (idx < 0) {
            fprintf(stderr, "kiln-run: the model has no input named '%s'; its inputs:", name);
            for (int32_t j = 0; j < nin; j++) fprintf(stderr, " %s", kiln_model_input_name(m, j));
            fprintf(stderr, "\n");
            return 2;
        }
        char err[512];
        kiln_tensor *t;
        if (npy_read(eq + 1, &t, err, sizeof err) != KILN_OK) {
            fprintf(stderr, "kiln-run: %s\n", err);
            return 2;
        }
        const kiln_meta *want = kiln_model_input_meta(m, idx);
        if (t->meta.dtype != want->dtype || t->meta.ndim != want->ndim ||
            memcmp(t->meta.shape, want->shape, sizeof(int64_t) * (size_t)want->ndim) != 0) {
            char a[160], b[160];
            fprintf(stderr, "kiln-run: input '%s' from %s is %s%s, the model takes %s%s\n", name, eq + 1,
                    kiln_dtype_name(t->meta.dtype), kiln_shape_str(&t->meta, a, sizeof a),
                    kiln_dtype_name(want->dtype), kiln_shape_str(want, b, sizeof b));
            kiln_tensor_release(t);
            return 2;
        }
        kiln_tensor_release(in[idx]);
        in[idx] = t;
    }
    for (int32_t k = 0; k < nin; k++)
        if (!in[k] && random_input(kiln_model_input_meta(m, k), &in[k]) != KILN_OK) return die("random input");
    return 0;
}

/* --check's tolerance when none is given: float16 and bfloat16 outputs (enable_io16xc32 files,
 * whose expected values come from the float32 trace) carry their storage's rounding. */
static double default_tolerance(kiln_dtype d) {
    return d == KILN_DTYPE_FLOAT16 || d == KILN_DTYPE_BFLOAT16 ? 1e-1 : 1e-3;
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void release_all(kiln_tensor **t, int n) {
    for (int k = 0; k < n; k++) {
        kiln_tensor_release(t[k]);
        t[k] = NULL;
    }
}

/* Runs every embedded test case; 0 when all match within the tolerance. */
static int check_cases(const options *o, const kiln_model *m, kiln_executable *e) {
    int32_t nc = kiln_model_num_cases(m), nin = kiln_model_num_inputs(m), nout = kiln_model_num_outputs(m);
    if (nc == 0) {
        fprintf(stderr, "kiln-run: --check: the model has no embedded test cases (dump it with input_data=...)\n");
        return 1;
    }
    kiln_tensor **in = calloc((size_t)nin + 1, sizeof *in), **out = calloc((size_t)nout + 1, sizeof *out);
    double worst = 0, worst_abs = 0, worst_tol = 0, worst_ratio = -1; /* the case with the largest error / tolerance */
    int worst_case = -1, worst_out = -1, rc = 0;
    for (int32_t c = 0; c < nc && rc == 0; c++) {
        for (int32_t k = 0; k < nin; k++) in[k] = kiln_model_case_input(m, c, k);
        if (kiln_executable_run(e, nin, in, nout, out) != KILN_OK) {
            rc = die("run");
            break;
        }
        for (int32_t k = 0; k < nout && rc == 0; k++) {
            kiln_tensor *got = NULL; /* (left unset by a failed contiguous copy) */
            double abs_err = 0, rel_err = 0;
            if (contiguous(out[k], &got) != KILN_OK) rc = die("output");
            else if (kiln_tensor_max_error(got, kiln_model_case_output(m, c, k), &abs_err, &rel_err) != KILN_OK) rc = die("check");
            if (rc == 0) {
                double tol = o->tolerance >= 0 ? o->tolerance : default_tolerance(kiln_model_output_meta(m, k)->dtype);
                double ratio = rel_err == 0 ? 0 : tol > 0 ? rel_err / tol : INFINITY;
                if (ratio > worst_ratio)
                    worst = rel_err, worst_abs = abs_err, worst_tol = tol, worst_ratio = ratio, worst_case = c, worst_out = k;
            }
            kiln_tensor_release(got);
        }
        release_all(out, nout);
    }
    if (rc == 0) {
        bool pass = worst_ratio <= 1;
        printf("check: %d case(s), worst relative error %.3g (absolute %.3g) at case %d output '%s': %s (tolerance %g)\n",
               nc, worst, worst_abs, worst_case, kiln_model_output_name(m, worst_out), pass ? "ok" : "MISMATCH",
               worst_tol);
        rc = pass ? 0 : 1;
    }
    free(in), free(out);
    return rc;
}

/* The file name of an output named `name` (which comes from the model file, so from anyone): the
 * name itself when it is made of letters, digits, '_', '-', '.' and non-ASCII UTF-8 and does not
 * start with '.'; otherwise each other byte (and a leading '.') as %XX. Never a path: no '/', never
 * "." or "..", so --output-dir's files stay in it; and two names never give one file name. */
enum { OUTPUT_FILE_MAX = 3 * 4096 + 8 }; /* a name of at most 4096 bytes, each byte as %XX at worst, and ".npy" */
static void output_file_name(const char *name, char *out, size_t size) {
    size_t n = 0;
    for (const unsigned char *p = (const unsigned char *)name; *p && n + 8 < size; p++) {
        bool plain = isalnum(*p) || *p == '_' || *p == '-' || *p >= 0x80 || (*p == '.' && p != (const unsigned char *)name);
        if (plain) out[n++] = (char)*p;
        else n += (size_t)snprintf(out + n, size - n, "%%%02X", *p);
    }
    snprintf(out + n, size - n, ".npy");
}

static int write_outputs(const options *o, const kiln_model *m, kiln_tensor **out) {
    if (mkdir(o->output_dir, 0777) != 0 && errno != EEXIST) {
        fprintf(stderr, "kiln-run: can't create %s: %s\n", o->output_dir, strerror(errno));
        return 2;
    }
    /* files are made in the directory opened once, never through a symbolic link in it */
    int dir = open(o->output_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dir < 0) {
        fprintf(stderr, "kiln-run: can't open %s: %s\n", o->output_dir, strerror(errno));
        return 2;
    }
    int rc = 0;
    for (int32_t k = 0; k < kiln_model_num_outputs(m) && rc == 0; k++) {
        char file[OUTPUT_FILE_MAX], path[8192 + OUTPUT_FILE_MAX], err[512];
        output_file_name(kiln_model_output_name(m, k), file, sizeof file);
        snprintf(path, sizeof path, "%s/%s", o->output_dir, file);
        int fd = openat(dir, file, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0666);
        FILE *f = fd >= 0 ? fdopen(fd, "wb") : NULL;
        if (!f) {
            fprintf(stderr, "kiln-run: can't create %s: %s\n", path, strerror(errno));
            if (fd >= 0) close(fd);
            rc = 2;
            break;
        }
        kiln_tensor *c;
        if (contiguous(out[k], &c) != KILN_OK) {
            fclose(f);
            rc = die("output");
            break;
        }
        if (c->meta.dtype == KILN_DTYPE_BFLOAT16) { /* (amp) .npy has no bfloat16: widened, exactly */
            kiln_attrs a = {0};
            a.i[a.ni++] = KILN_DTYPE_FLOAT32;
            kiln_tensor *wide;
            kiln_status cs = kiln_apply1(KILN_OP_CAST, c, &a, &wide);
            kiln_tensor_release(c);
            if (cs != KILN_OK) {
                fclose(f);
                rc = die("output");
                break;
            }
            c = wide;
            fprintf(stderr, "kiln-run: output %s is bfloat16, written to %s as float32 (exact: .npy has no bfloat16)\n",
                    kiln_model_output_name(m, k), path);
        }
        kiln_status s = npy_write(f, path, c, err, sizeof err);
        kiln_tensor_release(c);
        if (s != KILN_OK) {
            fprintf(stderr, "kiln-run: %s\n", err);
            rc = 2;
        }
    }
    close(dir);
    return rc;
}

static int run(const options *o, kiln_model *m) {
    kiln_compile_options copt = {KILN_ORDER_BFS, false, o->backend}; /* any registered backend */
    kiln_executable *e;
    if (kiln_compile(kiln_model_graph(m), &copt, &e) != KILN_OK) return die("compile");
    if (o->info) model_info(m, e);
    int32_t nin = kiln_model_num_inputs(m), nout = kiln_model_num_outputs(m);
    kiln_tensor **in = calloc((size_t)nin + 1, sizeof *in), **out = calloc((size_t)nout + 1, sizeof *out);
    double *times = calloc((size_t)o->iters + 1, sizeof *times);
    int rc = o->check ? check_cases(o, m, e) : 0;
    if (rc == 0 && (o->iters > 0 || o->output_dir)) rc = load_inputs(o, m, in);
    long total = o->warmup + (o->iters > 0 ? o->iters : 1);
    for (long it = 0; rc == 0 && it < (o->iters > 0 || o->output_dir ? total : 0); it++) {
        release_all(out, nout);
        double t0 = now_ms();
        if (kiln_executable_run(e, nin, in, nout, out) != KILN_OK) {
            rc = die("run");
            break;
        }
        double ms = now_ms() - t0;
        if (it >= o->warmup && o->iters > 0) {
            times[it - o->warmup] = ms;
            printf("iter %ld: %.3f ms\n", it - o->warmup, ms);
        }
    }
    if (rc == 0 && o->iters > 0) {
        qsort(times, (size_t)o->iters, sizeof *times, cmp_double);
        printf("%ld iterations (%ld warmup), %s, %d threads: min %.3f ms, median %.3f ms, max %.3f ms\n", o->iters,
               o->warmup, kiln_executable_backend(e), kiln_num_threads(), times[0], times[o->iters / 2],
               times[o->iters - 1]);
    }
    if (rc == 0 && o->output_dir) rc = write_outputs(o, m, out);
    release_all(out, nout);
    release_all(in, nin);
    free(in), free(out), free(times);
    kiln_executable_free(e);
    return rc;
}

int main(int argc, char **argv) {
    options o;
    int rc = parse_args(argc, argv, &o);
    if (rc) return rc;
    if (kiln_max_isa_check() != KILN_OK) return die("environment"); /* a KILN_MAX_CPU_ISA kiln does not know */
    if (o.threads && kiln_set_num_threads(o.threads) != KILN_OK) return die("--threads");
    kiln_manual_seed(o.seed);
    double t0 = now_ms();
    kiln_model *m;
    if (kiln_model_load_graph(o.model, (int32_t)o.graph, o.graph_name, &m) != KILN_OK) {
        fprintf(stderr, "kiln-run: %s\n", kiln_last_error());
        free(o.input_specs);
        return 2;
    }
    if (o.info) printf("load: %.3f ms\n", now_ms() - t0);
    /* --profile: compile phases, every kernel of every run and the allocations, as Chrome Trace
     * Event JSON (the format kiln.profiler writes) */
    size_t mark = o.profile ? kiln_profile_start() : 0;
    rc = run(&o, m);
    if (o.profile) {
        if (rc == 0 && kiln_profile_write_chrome(o.profile, mark, KILN_PROFILE_WRITE_ALL) != KILN_OK) rc = die("--profile");
        kiln_profile_stop();
    }
    kiln_model_free(m);
    free(o.input_specs);
    return rc;
}
