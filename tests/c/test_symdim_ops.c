/* The symbolic-size algebra's operations beyond + and * (src/core/symdim.c): % and floor division
 * by constants of either sign against Python's integer semantics at many bindings, division and
 * modulo by zero refused, text with the caller's symbol names, expressions copied between tables
 * with symbols fixed (kiln_sym_subst), and each limit (terms, factors, table entries) reported as
 * KILN_ERR_LIMIT, which a caller can tell from a bad value and fall back on. */
#include "check.h"
#include "core/internal.h"
#include "core/symdim.h"

static uint64_t rng = 0x2545f4914f6cdd1dull;
static uint64_t next_rand(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return rng;
}
static int64_t rand_in(int64_t lo, int64_t hi) { return lo + (int64_t)(next_rand() % (uint64_t)(hi - lo + 1)); }

/* Python's a // c and a % c */
static int64_t py_floordiv(int64_t a, int64_t c) {
    int64_t q = a / c;
    return (a % c != 0 && ((a < 0) != (c < 0))) ? q - 1 : q;
}
static int64_t py_mod(int64_t a, int64_t c) { return a - c * py_floordiv(a, c); }

static bool text_is(const kiln_symtab *t, kiln_sdim a, const char *const *names, const char *want) {
    kiln_strbuf b = {0};
    kiln_sym_print_named(&b, t, a, names);
    bool ok = b.buf && strcmp(b.buf, want) == 0;
    if (!ok) fprintf(stderr, "  expression printed %s, expected %s\n", b.buf ? b.buf : "(nothing)", want);
    free(b.buf);
    return ok;
}

static void test_mod_and_signed_floordiv_match_python(void) {
    kiln_symtab *t = NULL;
    CHECK_OK(kiln_symtab_new(&t));
    kiln_sdim s0, s1, base[4];
    CHECK_OK(kiln_sym_new(t, 2, 9, &s0));
    CHECK_OK(kiln_sym_new(t, 2, 4, &s1));
    base[0] = s0; /* s0, s0*3 - s1, s1 - s0*2 + 1, s0*s1 - 7 */
    CHECK_OK(kiln_sym_mul(t, s0, kiln_sdim_const(3), &base[1]));
    CHECK_OK(kiln_sym_sub(t, base[1], s1, &base[1]));
    CHECK_OK(kiln_sym_mul(t, s0, kiln_sdim_const(-2), &base[2]));
    CHECK_OK(kiln_sym_add(t, base[2], s1, &base[2]));
    CHECK_OK(kiln_sym_add(t, base[2], kiln_sdim_const(1), &base[2]));
    CHECK_OK(kiln_sym_mul(t, s0, s1, &base[3]));
    CHECK_OK(kiln_sym_add(t, base[3], kiln_sdim_const(-7), &base[3]));
    const int64_t divisors[] = {-7, -3, -2, -1, 1, 2, 3, 5};
    for (int i = 0; i < 4; i++)
        for (size_t j = 0; j < sizeof divisors / sizeof *divisors; j++) {
            int64_t c = divisors[j];
            kiln_sdim q, r;
            CHECK_OK(kiln_sym_floordiv(t, base[i], c, &q));
            CHECK_OK(kiln_sym_mod(t, base[i], c, &r));
            for (int trial = 0; trial < 30; trial++) {
                int64_t bind[2] = {rand_in(2, 40), rand_in(2, 40)}, x = 0, gq = 0, gr = 0;
                CHECK_OK(kiln_sym_eval(t, base[i], bind, &x));
                CHECK_OK(kiln_sym_eval(t, q, bind, &gq));
                CHECK_OK(kiln_sym_eval(t, r, bind, &gr));
                if (gq != py_floordiv(x, c) || gr != py_mod(x, c)) {
                    fprintf(stderr, "  base %d at (%lld, %lld) = %lld, c %lld: // %lld %% %lld, expected %lld %lld\n", i,
                            (long long)bind[0], (long long)bind[1], (long long)x, (long long)c, (long long)gq,
                            (long long)gr, (long long)py_floordiv(x, c), (long long)py_mod(x, c));
                    CHECK(false);
                    trial = 30;
                }
            }
            /* the hint is the value at the symbols' hints */
            int64_t x = 0;
            CHECK_OK(kiln_sym_eval(t, base[i], NULL, &x));
            CHECK(q.v == py_floordiv(x, c) && r.v == py_mod(x, c));
        }
    /* constants follow Python too */
    kiln_sdim a;
    CHECK_OK(kiln_sym_mod(t, kiln_sdim_const(-7), 3, &a));
    CHECK(kiln_sdim_is_const(a) && a.v == 2);
    CHECK_OK(kiln_sym_mod(t, kiln_sdim_const(7), -3, &a));
    CHECK(kiln_sdim_is_const(a) && a.v == -2);
    CHECK_OK(kiln_sym_floordiv(t, kiln_sdim_const(7), -2, &a));
    CHECK(kiln_sdim_is_const(a) && a.v == -4);
    /* canonical: (s0 * 6) % 3 is 0, (s0 * 6 + 4) % 3 is 1, s0 // -1 is -s0 */
    kiln_sdim six;
    CHECK_OK(kiln_sym_mul(t, s0, kiln_sdim_const(6), &six));
    CHECK_OK(kiln_sym_mod(t, six, 3, &a));
    CHECK(kiln_sdim_is_const(a) && a.v == 0);
    CHECK_OK(kiln_sym_add(t, six, kiln_sdim_const(4), &a));
    CHECK_OK(kiln_sym_mod(t, a, 3, &a));
    CHECK(kiln_sdim_is_const(a) && a.v == 1);
    kiln_sdim neg;
    CHECK_OK(kiln_sym_floordiv(t, s0, -1, &a));
    CHECK_OK(kiln_sym_mul(t, s0, kiln_sdim_const(-1), &neg));
    CHECK(kiln_sdim_same(a, neg));
    kiln_symtab_free(t);
}

static void test_zero_divisor_is_refused(void) {
    kiln_symtab *t = NULL;
    CHECK_OK(kiln_symtab_new(&t));
    kiln_sdim s0, a;
    CHECK_OK(kiln_sym_new(t, 2, 5, &s0));
    int32_t before = kiln_symtab_entries(t);
    CHECK_STATUS(kiln_sym_floordiv(t, s0, 0, &a), KILN_ERR_VALUE);
    CHECK(strstr(kiln_last_error(), "zero") != NULL);
    CHECK_STATUS(kiln_sym_mod(t, s0, 0, &a), KILN_ERR_VALUE);
    CHECK(strstr(kiln_last_error(), "zero") != NULL);
    CHECK_STATUS(kiln_sym_mod(t, kiln_sdim_const(4), 0, &a), KILN_ERR_VALUE);
    CHECK(kiln_symtab_entries(t) == before);
    kiln_clear_error();
    kiln_symtab_free(t);
}

static void test_text_with_names(void) {
    kiln_symtab *t = NULL;
    CHECK_OK(kiln_symtab_new(&t));
    kiln_sdim s0, s1, a, b;
    CHECK_OK(kiln_sym_new(t, 2, 5, &s0));
    CHECK_OK(kiln_sym_new(t, 2, 3, &s1));
    CHECK_OK(kiln_sym_add(t, s0, kiln_sdim_const(1), &a));
    CHECK_OK(kiln_sym_floordiv(t, a, 2, &a));
    CHECK_OK(kiln_sym_mul(t, a, s1, &b));
    CHECK_OK(kiln_sym_add(t, b, kiln_sdim_const(-3), &b));
    const char *names[] = {"batch", "seq"};
    CHECK(text_is(t, b, names, "seq*((batch+1)//2)-3"));
    CHECK(text_is(t, b, NULL, "s1*((s0+1)//2)-3"));
    const char *partial[] = {NULL, "seq"};
    CHECK(text_is(t, b, partial, "seq*((s0+1)//2)-3"));
    CHECK(text_is(t, kiln_sdim_const(-4), names, "-4"));
    CHECK_OK(kiln_sym_mod(t, s0, 4, &a));
    CHECK(text_is(t, a, names, "batch-(batch//4)*4"));
    /* -(-s0 // 2): the minus outside the floor division's parentheses */
    CHECK_OK(kiln_sym_floordiv(t, s0, -2, &a));
    CHECK_OK(kiln_sym_mul(t, a, kiln_sdim_const(-1), &a));
    CHECK(text_is(t, a, names, "-((-batch)//2)"));
    CHECK_OK(kiln_sym_floordiv(t, s0, 2, &a));
    CHECK_OK(kiln_sym_sub(t, s1, a, &a));
    CHECK(text_is(t, a, NULL, "s1-(s0//2)"));
    kiln_symtab_free(t);
}

static void test_subst_copies_and_fixes(void) {
    kiln_symtab *src = NULL, *dst = NULL;
    CHECK_OK(kiln_symtab_new(&src));
    CHECK_OK(kiln_symtab_new(&dst));
    kiln_sdim s0, s1, d0, d1, a, got, want;
    CHECK_OK(kiln_sym_new(src, 2, 5, &s0));
    CHECK_OK(kiln_sym_new(src, 2, 3, &s1));
    CHECK_OK(kiln_sym_new(dst, 2, 5, &d0));
    CHECK_OK(kiln_sym_new(dst, 2, 3, &d1));
    CHECK(kiln_sym_symbol_of(src, s1) == 1 && kiln_sym_symbol_of(src, kiln_sdim_const(3)) == -1);
    /* a = (s0*s1 + 3) // 2 - s1 */
    CHECK_OK(kiln_sym_mul(src, s0, s1, &a));
    CHECK_OK(kiln_sym_add(src, a, kiln_sdim_const(3), &a));
    CHECK_OK(kiln_sym_floordiv(src, a, 2, &a));
    CHECK_OK(kiln_sym_sub(src, a, s1, &a));
    CHECK(kiln_sym_symbol_of(src, a) == -1);
    kiln_sdim same[2] = {d0, d1};
    CHECK_OK(kiln_sym_subst(dst, src, a, same, &got));
    CHECK_OK(kiln_sym_mul(dst, d0, d1, &want));
    CHECK_OK(kiln_sym_add(dst, want, kiln_sdim_const(3), &want));
    CHECK_OK(kiln_sym_floordiv(dst, want, 2, &want));
    CHECK_OK(kiln_sym_sub(dst, want, d1, &want));
    CHECK(kiln_sdim_same(got, want));
    /* s1 fixed at 3: (s0*3 + 3) // 2 - 3 */
    kiln_sdim fixed[2] = {d0, kiln_sdim_const(3)};
    CHECK_OK(kiln_sym_subst(dst, src, a, fixed, &got));
    CHECK(!kiln_sym_uses(dst, got, 1) && kiln_sym_uses(dst, got, 0));
    for (int64_t x = 2; x < 20; x++) {
        int64_t b[2] = {x, 99}, v = 0;
        CHECK_OK(kiln_sym_eval(dst, got, b, &v));
        CHECK(v == py_floordiv(x * 3 + 3, 2) - 3);
    }
    /* both fixed: a constant; a symbol with no value: refused */
    kiln_sdim consts[2] = {kiln_sdim_const(4), kiln_sdim_const(3)};
    CHECK_OK(kiln_sym_subst(dst, src, a, consts, &got));
    CHECK(kiln_sdim_is_const(got) && got.v == py_floordiv(15, 2) - 3);
    kiln_sdim missing[2] = {d0, {-1, 0}};
    CHECK_STATUS(kiln_sym_subst(dst, src, a, missing, &got), KILN_ERR_VALUE);
    kiln_clear_error();
    kiln_symtab_free(src);
    kiln_symtab_free(dst);
}

static void test_limits_are_reported_as_limits(void) {
    kiln_symtab *t = NULL;
    CHECK_OK(kiln_symtab_new(&t));
    kiln_sdim s[10], a, b;
    for (int k = 0; k < 10; k++) CHECK_OK(kiln_sym_new(t, 2, 2 + k, &s[k]));
    /* terms: s0 + ... + s7 fits, one more does not */
    a = s[0];
    for (int k = 1; k < KILN_SYM_MAX_TERMS; k++) CHECK_OK(kiln_sym_add(t, a, s[k], &a));
    int32_t before = kiln_symtab_entries(t);
    CHECK_STATUS(kiln_sym_add(t, a, s[8], &b), KILN_ERR_LIMIT);
    CHECK(kiln_symtab_entries(t) == before);
    /* a product of sums: (s0+1)*(s1+1)*(s2+1)*(s3+1) has 16 terms */
    kiln_sdim p = kiln_sdim_const(1);
    kiln_status st = KILN_OK;
    for (int k = 0; k < 4 && st == KILN_OK; k++) {
        kiln_sdim f;
        CHECK_OK(kiln_sym_add(t, s[k], kiln_sdim_const(1), &f));
        st = kiln_sym_mul(t, p, f, &p);
    }
    CHECK(st == KILN_ERR_LIMIT);
    /* factors: s0^8 fits, s0^9 does not */
    a = s[0];
    for (int k = 1; k < KILN_SYM_MAX_FACTORS; k++) CHECK_OK(kiln_sym_mul(t, a, s[0], &a));
    CHECK_STATUS(kiln_sym_mul(t, a, s[0], &b), KILN_ERR_LIMIT);
    /* a coefficient past int64 */
    CHECK_OK(kiln_sym_mul(t, s[0], kiln_sdim_const(INT64_MAX / 2), &a));
    CHECK_STATUS(kiln_sym_mul(t, a, kiln_sdim_const(4), &b), KILN_ERR_LIMIT);
    /* the value at the hints past int64: s0*(INT64_MAX/2 + 1) at s0 = 2 */
    CHECK_STATUS(kiln_sym_add(t, a, s[0], &b), KILN_ERR_LIMIT);
    /* entries: distinct expressions s1*k until the table is full */
    st = KILN_OK;
    for (int64_t k = 2; st == KILN_OK && k < 2 * KILN_SYM_MAX_ENTRIES; k++) st = kiln_sym_mul(t, s[1], kiln_sdim_const(k), &a);
    CHECK(st == KILN_ERR_LIMIT && kiln_symtab_entries(t) == KILN_SYM_MAX_ENTRIES);
    /* what the table holds still works */
    CHECK_OK(kiln_sym_mul(t, s[1], kiln_sdim_const(2), &a));
    int64_t v = 0;
    CHECK_OK(kiln_sym_eval(t, a, NULL, &v));
    CHECK(v == 6);
    kiln_clear_error();
    kiln_symtab_free(t);
}

int main(void) {
    test_mod_and_signed_floordiv_match_python();
    test_zero_divisor_is_refused();
    test_text_with_names();
    test_subst_copies_and_fixes();
    test_limits_are_reported_as_limits();
    if (check_failures) {
        fprintf(stderr, "%d check(s) failed\n", check_failures);
        return 1;
    }
    printf("test_symdim_ops: ok\n");
    return 0;
}
