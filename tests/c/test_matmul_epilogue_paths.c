/* matmul_epilogue's two paths, the fast one (each step's inner loop on chunks of rows) and the
 * reference one (each step's kernel on views of a block), against the unfused ops run one by one:
 * all three bitwise equal, for every step code, chains of 1 to 4 steps, operands broadcast as a
 * bias row, a full residual, a scalar, a column or a transposed (non-contiguous) view, either
 * operand position, float32 and float64, odd shapes (M, N, K of 1, 3, 17, 129) and products
 * large enough to be split over the threads, matrix times vector, matmul and linear (with and
 * without bias). */
#include "check.h"
#include "core/internal.h"
#include "ops/matmul_epilogue.h"
#include "rewrite_check.h"

enum { NCODES = 12 };
static const kiln_op step_op[NCODES] = {
    KILN_OP_ADD,  KILN_OP_SUB,  KILN_OP_MUL,  KILN_OP_DIV,     KILN_OP_MAXIMUM, KILN_OP_MINIMUM,
    KILN_OP_RELU, KILN_OP_GELU, KILN_OP_SILU, KILN_OP_SIGMOID, KILN_OP_TANH,    KILN_OP_NEG,
};

static kiln_tensor *random_tensor(kiln_dtype dt, int nd, const int64_t *shape) {
    kiln_meta m = {.dtype = dt, .ndim = nd};
    memcpy(m.shape, shape, sizeof(int64_t) * (size_t)nd);
    return rc_random_tensor(&m);
}

/* An operand of kind `kind` for an M x N product: 0 bias row (N), 1 full (M, N), 2 scalar (),
 * 3 column (M, 1), 4 a transposed view (M, N) of an (N, M) tensor. */
static kiln_tensor *operand(kiln_dtype dt, int kind, int64_t M, int64_t N) {
    int64_t row[1] = {N}, full[2] = {M, N}, col[2] = {M, 1}, tr[2] = {N, M}, st[2] = {1, M};
    switch (kind) {
    case 0: return random_tensor(dt, 1, row);
    case 1: return random_tensor(dt, 2, full);
    case 2: return random_tensor(dt, 0, row);
    case 3: return random_tensor(dt, 2, col);
    default: {
        kiln_tensor *base = random_tensor(dt, 2, tr), *v = NULL;
        CHECK_OK(kiln_tensor_view(base, 2, full, st, base->offset, &v));
        kiln_tensor_release(base);
        return v;
    }
    }
}

static bool same_bits(const kiln_tensor *a, const kiln_tensor *b) {
    return a && b && a->numel == b->numel && a->meta.dtype == b->meta.dtype &&
           memcmp(a->data, b->data, (size_t)a->numel * kiln_dtype_size(a->meta.dtype)) == 0;
}

/* One case: base 0 (matmul) or 1 (linear, `bias` with a bias), codes[0..nsteps), each binary
 * step's operand kind and product position. */
static void check_case(kiln_dtype dt, int base, bool bias, int64_t M, int64_t N, int64_t K, int nsteps,
                       const int *codes, const int *kinds, const int *positions) {
    int64_t sa[2] = {M, K}, sb[2] = {K, N}, sw[2] = {N, K}, sbias[1] = {N};
    kiln_tensor *in[3 + KILN_MATMUL_EPILOGUE_MAX_STEPS] = {0};
    int nin = 0;
    bool bvec = N == 0; /* N = 0: b is a vector of K, the product a vector of M */
    in[nin++] = random_tensor(dt, 2, sa);
    in[nin++] = base ? random_tensor(dt, 2, sw) : random_tensor(dt, bvec ? 1 : 2, sb);
    if (base && bias) in[nin++] = random_tensor(dt, 1, sbias);
    int nbase = nin;
    kiln_attrs at = {0}, none = {0};
    kiln_attrs_push_int(&at, base);
    kiln_attrs_push_int(&at, nbase);
    kiln_attrs_push_int(&at, nsteps);
    kiln_tensor *ref = NULL;
    CHECK_OK(kiln_apply(base ? KILN_OP_LINEAR : KILN_OP_MATMUL, nbase, in, &none, &ref));
    for (int s = 0; s < nsteps && ref; s++) {
        kiln_op op = step_op[codes[s]];
        int binary = kiln_op_table[op].nin == 2;
        kiln_tensor *x = !binary ? NULL : (in[nin] = bvec ? operand(dt, kinds[s] % 2 ? 2 : 0, 1, M) : operand(dt, kinds[s], M, N));
        kiln_attrs_push_int(&at, codes[s]);
        kiln_attrs_push_int(&at, binary ? nin : -1);
        kiln_attrs_push_int(&at, binary ? positions[s] : 0);
        if (binary) nin++;
        kiln_tensor *args[2] = {ref, x}, *next = NULL;
        if (binary && positions[s]) args[0] = x, args[1] = ref;
        CHECK_OK(kiln_apply(op, binary ? 2 : 1, args, &none, &next));
        kiln_tensor_release(ref);
        ref = next;
    }
    kiln_tensor *fast = NULL, *plain = NULL;
    CHECK_OK(kiln_apply(KILN_OP_MATMUL_EPILOGUE, nin, in, &at, &fast));
    kiln_matmul_epilogue_set_reference(true);
    CHECK_OK(kiln_apply(KILN_OP_MATMUL_EPILOGUE, nin, in, &at, &plain));
    kiln_matmul_epilogue_set_reference(false);
    bool ok = same_bits(fast, ref) && same_bits(plain, ref);
    if (!ok) {
        fprintf(stderr, "%s base %d bias %d (%lld, %lld, %lld) steps", kiln_dtype_name(dt), base, (int)bias,
                (long long)M, (long long)N, (long long)K);
        for (int s = 0; s < nsteps; s++)
            fprintf(stderr, " %s(kind %d, pos %d)", kiln_op_table[step_op[codes[s]]].name, kinds[s], positions[s]);
        fprintf(stderr, ": fast %s, reference %s the unfused ops\n", same_bits(fast, ref) ? "equals" : "differs from",
                same_bits(plain, ref) ? "equals" : "differs from");
    }
    CHECK(ok);
    kiln_tensor_release(ref), kiln_tensor_release(fast), kiln_tensor_release(plain);
    kiln_release_all(in, nin);
}

/* Every step code alone, with every operand kind and position. */
static void test_every_code(void) {
    const int64_t dims[4] = {1, 3, 17, 129};
    for (int t = 0; t < 2; t++) {
        kiln_dtype dt = t ? KILN_DTYPE_FLOAT64 : KILN_DTYPE_FLOAT32;
        for (int c = 0; c < NCODES; c++)
            for (int kind = 0; kind < 5; kind++)
                for (int pos = 0; pos < 2; pos++) {
                    int64_t M = dims[(c + kind) % 4], N = dims[(c + pos + 1) % 4], K = dims[(kind + 2) % 4];
                    check_case(dt, 0, false, M, N, K, 1, &c, &kind, &pos);
                    if (kiln_op_table[step_op[c]].nin == 1) break;
                }
    }
}

/* Random chains of 1 to 4 steps on every (M, N, K) of the odd sizes, matmul and linear. */
static void test_random_chains(void) {
    const int64_t dims[4] = {1, 3, 17, 129};
    for (int t = 0; t < 2; t++) {
        kiln_dtype dt = t ? KILN_DTYPE_FLOAT64 : KILN_DTYPE_FLOAT32;
        for (int i = 0; i < 64; i++) {
            int codes[4], kinds[4], pos[4], n = 1 + rc_rnd_int(4);
            for (int s = 0; s < n; s++) codes[s] = rc_rnd_int(NCODES), kinds[s] = rc_rnd_int(5), pos[s] = rc_rnd_int(2);
            int base = rc_rnd_int(2);
            check_case(dt, base, base && rc_rnd_int(2), dims[i % 4], dims[(i / 4) % 4], dims[i / 16], n, codes, kinds, pos);
        }
    }
}

/* Products split over the threads (by rows and by columns), where each thread runs the steps on
 * its own blocks. */
static void test_split_products(void) {
    int codes[4] = {0, 7, 2, 10}, kinds[4] = {0, 0, 1, 0}, pos[4] = {0, 0, 1, 0};
    int codes2[3] = {1, 6, 4}, kinds2[3] = {4, 0, 2}, pos2[3] = {1, 0, 0};
    for (int t = 0; t < 2; t++) {
        kiln_dtype dt = t ? KILN_DTYPE_FLOAT64 : KILN_DTYPE_FLOAT32;
        check_case(dt, 0, false, 300, 129, 100, 4, codes, kinds, pos); /* rows */
        check_case(dt, 1, true, 129, 700, 64, 4, codes, kinds, pos);   /* columns */
        check_case(dt, 1, false, 517, 260, 33, 3, codes2, kinds2, pos2);
    }
}

/* A matrix times a vector: the product is one column, its steps run along it. */
static void test_vector_products(void) {
    int codes[3] = {2, 8, 0}, kinds[3] = {0, 0, 1}, pos[3] = {1, 0, 0};
    const int64_t dims[4] = {1, 3, 17, 129};
    for (int t = 0; t < 2; t++)
        for (int i = 0; i < 16; i++)
            check_case(t ? KILN_DTYPE_FLOAT64 : KILN_DTYPE_FLOAT32, 0, false, dims[i % 4] * (i < 4 ? 1 : 40), 0,
                       dims[i / 4], 1 + i % 3, codes, kinds, pos);
}

int main(void) {
    test_every_code();
    test_vector_products();
    test_random_chains();
    test_split_products();
    CHECK_DONE();
}
