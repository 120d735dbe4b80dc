/* The join_slice_writes pass as "input text -> expected output text": gradients written into
 * disjoint slices of zeros and summed become one concat (pieces tiling an axis) or one full with
 * a slice_assign per piece, each rewritten graph computing what the original does on random
 * inputs; and the canvases it must leave alone. */
#include "rewrite_check.h"

static int same_results(const kiln_graph *a, const kiln_graph *b) { return rc_same_results(a, b, 2); }

static const kiln_pass_options o1 = {KILN_LEVEL_O1, false, false, KILN_CONV_FUSE_ALL, false};

#define expect_joined(input, want) rc_expect_rewrite_at(__LINE__, "join_slice_writes", &o1, input, want, same_results)

#define S(a, b, la, lb) "{0, " #b ", 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, " #la ", " #lb ", 0, 0, 0, 0, 0, 0}"
#define S2(a, b, la, lb) "{" #a ", " #b ", 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, " #la ", " #lb ", 0, 0, 0, 0, 0, 0}"

static void test_joined(void) {
    /* three pieces tiling axis 1, summed in two adds, given out of order: one concat */
    expect_joined("graph(%0: float32[2, 4], %1: float32[2, 3], %2: float32[2, 5]) {\n"
                  "  %3: float32[2, 12] = full() {6, 2, 2, 12; 0}\n"
                  "  %4: float32[2, 12] = slice_assign(%3, %1) " S2(0, 4, 2, 3) "\n"
                  "  %5: float32[2, 12] = full() {6, 2, 2, 12; 0}\n"
                  "  %6: float32[2, 12] = slice_assign(%5, %0) " S2(0, 0, 2, 4) "\n"
                  "  %7: float32[2, 12] = add(%4, %6)\n"
                  "  %8: float32[2, 12] = full() {6, 2, 2, 12; 0}\n"
                  "  %9: float32[2, 12] = slice_assign(%8, %2) " S2(0, 7, 2, 5) "\n"
                  "  %10: float32[2, 12] = add(%9, %7)\n"
                  "  return (%10)\n"
                  "}\n",
                  "graph(%0: float32[2, 4], %1: float32[2, 3], %2: float32[2, 5]) {\n"
                  "  %3: float32[2, 12] = concat(%0, %1, %2) {1}\n"
                  "  return (%3)\n"
                  "}\n");
    /* two pieces leaving a gap (and along axis 0): one full, two slice_assigns */
    expect_joined("graph(%0: float32[1, 3], %1: float32[2, 3]) {\n"
                  "  %2: float32[5, 3] = full() {6, 2, 5, 3; 0}\n"
                  "  %3: float32[5, 3] = slice_assign(%2, %0) " S2(0, 0, 1, 3) "\n"
                  "  %4: float32[5, 3] = full() {6, 2, 5, 3; 0}\n"
                  "  %5: float32[5, 3] = slice_assign(%4, %1) " S2(3, 0, 2, 3) "\n"
                  "  %6: float32[5, 3] = add(%3, %5)\n"
                  "  return (%6)\n"
                  "}\n",
                  "graph(%0: float32[1, 3], %1: float32[2, 3]) {\n"
                  "  %2: float32[5, 3] = full() {6, 2, 5, 3; 0}\n"
                  "  %3: float32[5, 3] = slice_assign(%2, %0) " S2(0, 0, 1, 3) "\n"
                  "  %4: float32[5, 3] = slice_assign(%3, %1) " S2(3, 0, 2, 3) "\n"
                  "  return (%4)\n"
                  "}\n");
}

/* two slices of zeros [4, 6] written with %0 and %1 by `body`: left as it is */
static void unchanged_case(const char *a, const char *b, const char *body) {
    char input[4096];
    snprintf(input, sizeof input, "graph(%%0: float32[%s], %%1: float32[%s]) {\n%s}\n", a, b, body);
    expect_joined(input, NULL);
}

static void test_left_alone(void) {
    /* overlapping boxes: the sum is not a write */
    unchanged_case("4, 3", "4, 3",
                   "  %2: float32[4, 6] = full() {6, 2, 4, 6; 0}\n"
                   "  %3: float32[4, 6] = slice_assign(%2, %0) " S(0, 0, 4, 3) "\n"
                   "  %4: float32[4, 6] = full() {6, 2, 4, 6; 0}\n"
                   "  %5: float32[4, 6] = slice_assign(%4, %1) " S(0, 2, 4, 3) "\n"
                   "  %6: float32[4, 6] = add(%3, %5)\n"
                   "  return (%6)\n");
    /* a canvas also read elsewhere (a graph output) */
    unchanged_case("4, 3", "4, 3",
                   "  %2: float32[4, 6] = full() {6, 2, 4, 6; 0}\n"
                   "  %3: float32[4, 6] = slice_assign(%2, %0) " S(0, 0, 4, 3) "\n"
                   "  %4: float32[4, 6] = full() {6, 2, 4, 6; 0}\n"
                   "  %5: float32[4, 6] = slice_assign(%4, %1) " S(0, 3, 4, 3) "\n"
                   "  %6: float32[4, 6] = add(%3, %5)\n"
                   "  return (%6, %3)\n");
    /* zeros that are not zeros */
    unchanged_case("4, 3", "4, 3",
                   "  %2: float32[4, 6] = full() {6, 2, 4, 6; 1}\n"
                   "  %3: float32[4, 6] = slice_assign(%2, %0) " S(0, 0, 4, 3) "\n"
                   "  %4: float32[4, 6] = full() {6, 2, 4, 6; 0}\n"
                   "  %5: float32[4, 6] = slice_assign(%4, %1) " S(0, 3, 4, 3) "\n"
                   "  %6: float32[4, 6] = add(%3, %5)\n"
                   "  return (%6)\n");
    /* a piece broadcast into its box */
    unchanged_case("1, 3", "4, 3",
                   "  %2: float32[4, 6] = full() {6, 2, 4, 6; 0}\n"
                   "  %3: float32[4, 6] = slice_assign(%2, %0) " S(0, 0, 4, 3) "\n"
                   "  %4: float32[4, 6] = full() {6, 2, 4, 6; 0}\n"
                   "  %5: float32[4, 6] = slice_assign(%4, %1) " S(0, 3, 4, 3) "\n"
                   "  %6: float32[4, 6] = add(%3, %5)\n"
                   "  return (%6)\n");
    /* a piece written in place after it was written into the canvas: its read may not move */
    unchanged_case("4, 3", "4, 3",
                   "  %2: float32[4, 3] = neg(%0)\n"
                   "  %3: float32[4, 6] = full() {6, 2, 4, 6; 0}\n"
                   "  %4: float32[4, 6] = slice_assign(%3, %2) " S(0, 0, 4, 3) "\n"
                   "  %5: float32[4, 6] = full() {6, 2, 4, 6; 0}\n"
                   "  %6: float32[4, 6] = slice_assign(%5, %1) " S(0, 3, 4, 3) "\n"
                   "  %7: float32[4, 3] = slice_assign(%2, %1) " S(0, 0, 4, 3) "\n"
                   "  %8: float32[4, 6] = add(%4, %6)\n"
                   "  return (%8, %7)\n");
    /* no add: one slice's gradient stays as it is */
    unchanged_case("4, 3", "4, 3",
                   "  %2: float32[4, 6] = full() {6, 2, 4, 6; 0}\n"
                   "  %3: float32[4, 6] = slice_assign(%2, %0) " S(0, 0, 4, 3) "\n"
                   "  %4: float32[4, 6] = slice_assign(%3, %1) " S(0, 3, 4, 3) "\n"
                   "  return (%4)\n");
}

int main(void) {
    test_joined();
    test_left_alone();
    CHECK_DONE();
}
