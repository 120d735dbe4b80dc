/* matmul_epilogue: a matmul or linear whose product goes through a chain of elementwise steps
 * (bias and residual adds, scaling, activations) applied in place on each block of the output
 * right after the GEMM computed it, while the block is in cache. The steps run on each row of a
 * block in chunks of a few hundred elements: every step in turn on a chunk while it is in L1, so
 * the product is read and written once. Each step is the op's own inner loop (the eager
 * kernel's, elementwise_loops.h), so results equal the unfused ops' bit for bit. The reference
 * path (kiln_matmul_epilogue_set_reference, for tests) runs each step's whole kernel on views of
 * the block instead. The fuse_matmul_epilogue pass makes these nodes; the op has an eager kernel
 * too.
 *
 * Attributes (see ops.def): i[0] base (0 matmul, 1 linear), i[1] base inputs (2, or 3 for a
 * linear with bias), i[2] steps; step s: i[3+3s] step code (epilogue_ops below), i[4+3s] node
 * input holding the step's other operand (-1 for a unary step), i[5+3s] the operand position
 * of the running product in the step (0 or 1). */
#include <omp.h>

#include "elementwise_loops.h"
#include "matmul.h"
#include "matmul_epilogue.h"

/* Step codes are positions in this list: the text form of graphs stores them, so new ops go
 * at the end. */
static const kiln_op epilogue_ops[] = {
    KILN_OP_ADD,  KILN_OP_SUB,     KILN_OP_MUL,     KILN_OP_DIV,  KILN_OP_MAXIMUM, KILN_OP_MINIMUM,
    KILN_OP_RELU, KILN_OP_GELU,    KILN_OP_SILU,    KILN_OP_SIGMOID, KILN_OP_TANH, KILN_OP_NEG,
};
#define NCODES ((int)(sizeof epilogue_ops / sizeof epilogue_ops[0]))

int kiln_matmul_epilogue_code(kiln_op op) {
    for (int c = 0; c < NCODES; c++)
        if (epilogue_ops[c] == op) return c;
    return -1;
}

typedef struct {
    int base, nbase, nsteps;
    struct {
        kiln_op op;
        int operand; /* node input, or -1 */
        int product; /* 0 or 1 */
    } step[KILN_MATMUL_EPILOGUE_MAX_STEPS];
} epi_desc;

static kiln_status decode(const kiln_attrs *a, int nin, epi_desc *d) {
    if (a->ni < 3) return kiln_error(KILN_ERR_VALUE, "matmul_epilogue: malformed attributes (%d ints)", a->ni);
    d->base = (int)a->i[0], d->nbase = (int)a->i[1], d->nsteps = (int)a->i[2];
    if (d->base < 0 || d->base > 1 || d->nbase < 2 || d->nbase > (d->base ? 3 : 2) || nin < d->nbase)
        return kiln_error(KILN_ERR_VALUE, "matmul_epilogue: bad base (kind %d with %d inputs of %d)", d->base, d->nbase,
                          nin);
    if (d->nsteps < 0 || d->nsteps > KILN_MATMUL_EPILOGUE_MAX_STEPS || a->ni != 3 + 3 * d->nsteps)
        return kiln_error(KILN_ERR_VALUE, "matmul_epilogue: malformed attributes (%d steps, %d ints)", d->nsteps, a->ni);
    for (int s = 0; s < d->nsteps; s++) {
        int64_t code = a->i[3 + 3 * s], operand = a->i[4 + 3 * s], product = a->i[5 + 3 * s];
        if (code < 0 || code >= NCODES)
            return kiln_error(KILN_ERR_VALUE, "matmul_epilogue: step %d has unknown code %lld", s, (long long)code);
        kiln_op op = epilogue_ops[code];
        int arity = kiln_op_table[op].nin;
        bool ok = arity == 1 ? operand == -1 && product == 0
                             : operand >= d->nbase && operand < nin && (product == 0 || product == 1);
        if (!ok)
            return kiln_error(KILN_ERR_VALUE, "matmul_epilogue: step %d (%s) has bad operands (%lld, %lld)", s,
                              kiln_op_table[op].name, (long long)operand, (long long)product);
        d->step[s].op = op, d->step[s].operand = (int)operand, d->step[s].product = (int)product;
    }
    return KILN_OK;
}

static const kiln_attrs no_attrs;

KILN_INFER(matmul_epilogue) {
    epi_desc d;
    KILN_TRY(decode(a, nin, &d));
    kiln_status s = d.base ? kiln_infer_linear(in, d.nbase, a, out) : kiln_infer_matmul(in, 2, a, out);
    if (s != KILN_OK) return kiln_error_context(s, "matmul_epilogue");
    if (out->dtype != KILN_DTYPE_FLOAT32 && out->dtype != KILN_DTYPE_FLOAT64)
        return kiln_error(KILN_ERR_TYPE, "matmul_epilogue: the product must be float32 or float64, got %s",
                          kiln_dtype_name(out->dtype));
    for (int k = 0; k < d.nsteps; k++) {
        kiln_tensor *x = d.step[k].operand >= 0 ? in[d.step[k].operand] : NULL;
        kiln_meta step;
        kiln_tensor shadow = {.meta = *out};
        kiln_tensor *ins[2] = {&shadow, x};
        if (x && d.step[k].product == 1) ins[0] = x, ins[1] = &shadow;
        s = kiln_op_table[d.step[k].op].infer(ins, x ? 2 : 1, &no_attrs, &step);
        if (s != KILN_OK) return kiln_error_context(s, "matmul_epilogue step %d (%s)", k, kiln_op_table[d.step[k].op].name);
        if (step.dtype != out->dtype || step.ndim != out->ndim ||
            memcmp(step.shape, out->shape, sizeof(int64_t) * (size_t)out->ndim) != 0) {
            char b1[160], b2[160];
            return kiln_error(KILN_ERR_VALUE, "matmul_epilogue: step %d (%s) turns the %s %s product into %s %s", k,
                              kiln_op_table[d.step[k].op].name, kiln_dtype_name(out->dtype),
                              kiln_shape_str(out, b1, sizeof b1), kiln_dtype_name(step.dtype),
                              kiln_shape_str(&step, b2, sizeof b2));
        }
    }
    return KILN_OK;
}

/* ---- applying the steps to a block -------------------------------------------------------- */

typedef struct {
    const epi_desc *d;
    kiln_tensor *const *in;
    kiln_tensor *out;
    int64_t N, M;                                /* output viewed as (rows / M, M, N) */
    int64_t bstrides[KILN_MATMUL_EPILOGUE_MAX_STEPS][KILN_MAX_DIMS]; /* operands broadcast to out */
    kiln_inner_fn loop[KILN_MATMUL_EPILOGUE_MAX_STEPS];              /* each step's inner loop */
    int64_t isz;                                                      /* the product's item size */
    bool fast;                                   /* apply_fast, else the reference path */
    int failed;                                  /* a step failed (atomic flag) */
} epi_ctx;

static bool use_reference;

void kiln_matmul_epilogue_set_reference(bool on) { use_reference = on; }

/* Element offset in an operand with broadcast strides bs of the output's element `flat`. */
static int64_t operand_offset(const kiln_meta *m, const int64_t *bs, int64_t flat) {
    int64_t off = 0;
    for (int d = m->ndim - 1; d >= 0; d--) {
        off += (flat % m->shape[d]) * bs[d];
        flat /= m->shape[d];
    }
    return off;
}

/* Steps on rows [row0, row0 + rows) of one (M, N) matrix of the output: within it, the output
 * and every operand are 2-D strided views. */
static kiln_status run_segment(epi_ctx *c, int64_t row0, int64_t rows, int64_t col0, int64_t cols) {
    const kiln_meta *m = &c->out->meta;
    int64_t flat = row0 * c->N + col0, shape[2] = {rows, cols}, ostr[2] = {c->N, 1};
    kiln_tensor *ov = NULL, *xv = NULL;
    kiln_status s = kiln_tensor_view(c->out, 2, shape, ostr, c->out->offset + flat, &ov);
    for (int k = 0; k < c->d->nsteps && s == KILN_OK; k++) {
        int operand = c->d->step[k].operand;
        kiln_tensor *ins[2] = {ov, NULL};
        if (operand >= 0) {
            kiln_tensor *x = c->in[operand];
            const int64_t *bs = c->bstrides[k];
            int64_t o0 = operand_offset(m, bs, flat);
            int64_t xstr[2] = {rows > 1 ? operand_offset(m, bs, flat + c->N) - o0 : 0,
                               cols > 1 ? operand_offset(m, bs, flat + 1) - o0 : 0};
            s = kiln_tensor_view(x, 2, shape, xstr, x->offset + o0, &xv);
            if (s != KILN_OK) break;
            ins[c->d->step[k].product] = ov;
            ins[1 - c->d->step[k].product] = xv;
        }
        kiln_tensor *res[KILN_MAX_OUTPUTS] = {ov};
        s = kiln_op_table[c->d->step[k].op].kernel(ins, operand >= 0 ? 2 : 1, &no_attrs, res);
        kiln_tensor_release(xv);
        xv = NULL;
    }
    kiln_tensor_release(ov);
    return s;
}

/* Elements of a row the steps run on at a time: with an operand's chunk beside it, a few KiB of L1. */
enum { EPI_CHUNK = 256 };

/* The fast path on rows [row0, row0 + rows) x columns [col0, col0 + cols) of one (M, N) matrix of
 * the output: each row in chunks, every step on a chunk before the next chunk. The output is
 * contiguous (the GEMM wrote it with row stride N); within the matrix an operand's offset is
 * affine in the row and the column (its broadcast strides; 0 along a broadcast dimension). */
static void fast_segment(epi_ctx *c, int64_t row0, int64_t rows, int64_t col0, int64_t cols) {
    const kiln_meta *m = &c->out->meta;
    const epi_desc *d = c->d;
    int64_t isz = c->isz, flat = row0 * c->N + col0;
    if (c->N == 1) cols = rows, rows = 1; /* one column (b a vector): its elements are contiguous */
    char *xrow[KILN_MATMUL_EPILOGUE_MAX_STEPS];
    int64_t xcol[KILN_MATMUL_EPILOGUE_MAX_STEPS], xnext[KILN_MATMUL_EPILOGUE_MAX_STEPS]; /* bytes */
    for (int k = 0; k < d->nsteps; k++) {
        if (d->step[k].operand < 0) continue;
        const int64_t *bs = c->bstrides[k];
        int64_t o0 = operand_offset(m, bs, flat);
        xrow[k] = (char *)c->in[d->step[k].operand]->data + o0 * isz;
        xnext[k] = rows > 1 ? (operand_offset(m, bs, flat + c->N) - o0) * isz : 0;
        xcol[k] = cols > 1 ? (operand_offset(m, bs, flat + 1) - o0) * isz : 0;
    }
    char *orow = (char *)c->out->data + flat * isz;
    for (int64_t r = 0; r < rows; r++, orow += c->N * isz) {
        for (int64_t j = 0; j < cols; j += EPI_CHUNK) {
            int64_t n = cols - j < EPI_CHUNK ? cols - j : EPI_CHUNK;
            char *o = orow + j * isz;
            for (int k = 0; k < d->nsteps; k++) {
                char *p[3] = {o, o, NULL};
                int64_t st[3] = {isz, isz, isz};
                if (d->step[k].operand >= 0) {
                    int x = 2 - d->step[k].product; /* the operand's slot: 1 or 2 */
                    p[x] = xrow[k] + r * xnext[k] + j * xcol[k];
                    p[3 - x] = o;
                    st[x] = xcol[k];
                }
                c->loop[k]((void *)kiln_elementwise_no_attrs, n, p, st);
            }
        }
    }
}

static void apply_block(void *vctx, int64_t row0, int64_t rows, int64_t col0, int64_t cols) {
    epi_ctx *c = vctx;
    /* one segment per (M, N) matrix the rows cross */
    for (int64_t r = row0, end = row0 + rows; r < end;) {
        int64_t stop = (r / c->M + 1) * c->M;
        if (stop > end) stop = end;
        if (c->fast) {
            fast_segment(c, r, stop - r, col0, cols);
        } else if (run_segment(c, r, stop - r, col0, cols) != KILN_OK) {
#pragma omp atomic write
            c->failed = 1;
            return;
        }
        r = stop;
    }
}

KILN_KERNEL(matmul_epilogue) {
    epi_desc d;
    KILN_TRY(decode(a, nin, &d));
    kiln_tensor *o = out[0];
    const kiln_meta *m = &o->meta;
    epi_ctx c = {.d = &d, .in = in, .out = o, .fast = !use_reference};
    /* N: the product's columns (1 when b is a vector); M: rows of the output along which
     * every operand's offset is affine (its last dimension over the rows) */
    bool b_vec = d.base == 0 && in[1]->meta.ndim == 1;
    c.N = b_vec || m->ndim == 0 ? 1 : m->shape[m->ndim - 1];
    int row_dim = m->ndim - (b_vec ? 1 : 2);
    c.M = row_dim >= 0 && m->shape[row_dim] > 0 ? m->shape[row_dim] : 1;
    c.isz = (int64_t)kiln_dtype_size(m->dtype);
    for (int k = 0; k < d.nsteps; k++) {
        if (d.step[k].operand >= 0) kiln_broadcast_strides(in[d.step[k].operand], m->ndim, m->shape, c.bstrides[k]);
        c.loop[k] = kiln_elementwise_loop(d.step[k].op, m->dtype);
        /* an operand of another dtype (promoted by the op's kernel) takes the reference path */
        if (!c.loop[k] || (d.step[k].operand >= 0 && in[d.step[k].operand]->meta.dtype != m->dtype)) c.fast = false;
    }
    kiln_mm_epilogue epi = {apply_block, &c};
    kiln_status s = d.base ? kiln_linear_into(in[0], in[1], d.nbase == 3 ? in[2] : NULL, o, &epi)
                           : kiln_matmul_into(in[0], in[1], o, &epi);
    if (s == KILN_OK && c.failed)
        s = kiln_error(KILN_ERR_MEMORY, "matmul_epilogue: a step failed (out of memory)");
    return s;
}
