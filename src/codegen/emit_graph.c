/* C source for a whole graph run by the sink backend: one function that runs the planned steps
 * in order, calling each node's kernel directly through the environment's table, fused groups
 * run as the generated loops of emit_c.c over their fixed layouts: called through the
 * environment when the plan already loaded that kernel, else compiled into this source.
 *
 * The code depends on the graph's structure and layouts, never on sizes or addresses: tensors,
 * kernels, attributes and the native loops' sizes and strides come through the environment (src/codegen/sink_steps.h), so the
 * compiled object is cached and reused by any process compiling the same graph. */
#include "../core/strbuf.h"
#include "sink_steps.h"
#include "codegen.h"

#define STR_(x) #x
#define STR(x) STR_(x)

static void emit_types(kiln_strbuf *t) {
    kiln_strbuf_printf(t,
        "#include <stdint.h>\n"
        "typedef struct kiln_tensor kiln_tensor;\n"
        "typedef struct kiln_attrs kiln_attrs;\n"
        "typedef struct {\n    %s\n} kiln_sink_env;\n"
        "_Static_assert(sizeof(kiln_sink_env) == %zu, \"kiln_sink_env differs from sink_steps.h\");\n\n",
        STR(KILN_SINK_ENV_BODY(int)), sizeof(kiln_sink_env));
}

static void emit_list(kiln_strbuf *t, const char *table, const int32_t *ids, int n) {
    for (int k = 0; k < n; k++) kiln_strbuf_printf(t, "%s%s[%d]", k ? ", " : "", table, ids[k]);
}

static void emit_fail(kiln_strbuf *t, int32_t i) {
    kiln_strbuf_printf(t, "if (s != 0) {\n        e->step = %d;\n        return s;\n    }\n", i);
}

static void emit_step(kiln_strbuf *t, const kiln_graph *g, const kiln_sink_step *st, int32_t i) {
    const kiln_node *nd = &g->nodes[st->node];
    kiln_strbuf_printf(t, "    /* step %d: %s */\n", i, kiln_op_table[nd->op].name);
    if (st->kind != KILN_SINK_VIEW) { /* an interrupt request: one load and a branch not taken */
        kiln_strbuf_printf(t, "    if (__builtin_expect(*stop != 0, 0) && (s = e->interrupted()) != 0) {\n"
                              "        e->step = %d;\n        return s;\n    }\n", i);
    }
    if (st->native) { /* a fused group, or a lone elementwise node */
        /* sizes and strides come through the environment: one compiled function for every binding of
         * a symbolic plan */
        kiln_strbuf_printf(t, "    {\n        char *const p[%d] = {d[%d]%s", 1 + st->nin, st->out[0], st->nin ? ", " : "");
        emit_list(t, "d", st->in, st->nin);
        if (st->loaded) kiln_strbuf_printf(t, "};\n        e->gf[%d](p, %d, e->shp[%d], e->str[%d]);\n    }\n", i, st->ndim, i, i);
        else kiln_strbuf_printf(t, "};\n        %s(p, %d, e->shp[%d], e->str[%d]);\n    }\n", st->symbol, st->ndim, i, i);
    } else if (st->kind != KILN_SINK_VIEW) {
        kiln_strbuf_printf(t, "    {\n");
        if (st->nin > 0) {
            kiln_strbuf_printf(t, "        kiln_tensor *const in[%d] = {", st->nin);
            emit_list(t, "t", st->in, st->nin);
            kiln_strbuf_printf(t, "};\n");
        }
        const char *in = st->nin > 0 ? "in" : "(kiln_tensor *const *)0";
        switch (st->kind) {
        case KILN_SINK_KERNEL:
            kiln_strbuf_printf(t, "        kiln_tensor *out[%d] = {", st->nout);
            emit_list(t, "t", st->out, st->nout);
            kiln_strbuf_printf(t, "};\n        s = e->k[%d](%s, %d, e->a[%d], out);\n", i, in, st->nin, i);
            break;
        case KILN_SINK_MUTATES:
            kiln_strbuf_printf(t, "        kiln_tensor *out[%d] = {0};\n        s = e->k[%d](%s, %d, e->a[%d], out);\n"
                                  "        e->release(out[0]);\n        if (s == 0) e->bump(in[0]);\n",
                               st->nout > 0 ? st->nout : 1, i, in, st->nin, i);
            break;
        case KILN_SINK_RESHAPE_COPY:
            kiln_strbuf_printf(t, "        s = e->reshape_copy(in[0], t[%d]);\n", st->out[0]);
            break;
        default: /* an interpreted fused group */
            kiln_strbuf_printf(t, "        s = e->fused_run(e->fk[%d], %d, %s, t[%d]);\n", i, st->nin, in, st->out[0]);
            break;
        }
        kiln_strbuf_printf(t, "    }\n    ");
        emit_fail(t, i);
    }
    if (st->poison_after)
        for (const int32_t *p = st->poison_after; *p >= 0; p++) kiln_strbuf_printf(t, "    e->poison(t[%d]);\n", *p);
}

kiln_status kiln_sink_emit(const kiln_graph *g, const kiln_sink_step *steps, int32_t nsteps, char **source,
                           char symbol[48]) {
    kiln_strbuf head = {kiln_malloc(4096), 0, 4096, false}, tail = {kiln_malloc(4096), 0, 4096, false};
    if (!head.buf || !tail.buf) {
        free(head.buf), free(tail.buf);
        return kiln_error(KILN_ERR_MEMORY, "out of memory generating code");
    }
    head.buf[0] = tail.buf[0] = '\0';
    kiln_strbuf_printf(&head, "/* kiln sink: %d steps */\n", nsteps);
    for (int32_t i = 0; i < nsteps; i++) { /* each generated group once */
        if (!steps[i].native || steps[i].loaded) continue;
        bool seen = false;
        for (int32_t j = 0; j < i && !seen; j++)
            seen = steps[j].native && !steps[j].loaded && strcmp(steps[j].symbol, steps[i].symbol) == 0;
        if (!seen) kiln_strbuf_printf(&head, "%s\n", steps[i].source);
    }
    emit_types(&head);
    kiln_strbuf_printf(&head, "int ");
    kiln_strbuf_printf(&tail, "(kiln_sink_env *e) {\n    kiln_tensor **const t = e->t;\n    char **const d = e->d;\n"
                              "    const volatile int *const stop = e->stop;\n"
                              "    int s = 0;\n    (void)t, (void)d, (void)s, (void)stop;\n");
    for (int32_t i = 0; i < nsteps; i++) emit_step(&tail, g, &steps[i], i);
    kiln_strbuf_printf(&tail, "    return 0;\n}\n");
    kiln_status s = KILN_OK;
    if (head.failed || tail.failed) {
        s = kiln_error(KILN_ERR_MEMORY, "out of memory generating code");
    } else {
        uint64_t h = kiln_codegen_hash(head.buf, head.len, 0x73696e6bu) ^ kiln_codegen_hash(tail.buf, tail.len, 0x6b696c6eu);
        snprintf(symbol, 48, "kiln_sink_%016llx", (unsigned long long)h);
        size_t n = head.len + strlen(symbol) + tail.len + 1;
        *source = kiln_malloc(n);
        if (!*source) s = kiln_error(KILN_ERR_MEMORY, "out of memory generating code");
        else snprintf(*source, n, "%s%s%s", head.buf, symbol, tail.buf);
    }
    free(head.buf), free(tail.buf);
    return s;
}
