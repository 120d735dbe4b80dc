/* The plan is plain data: kiln_plan_build of a graph with a fused group generates, compiles and
 * looks up no code (the backends make fused groups' kernels in their prepare), and its text is the
 * text every backend's executable of the graph prints. */
#include "check.h"
#include "codegen/codegen.h"
#include "core/internal.h"
#include "plan/plan.h"

static const char *fused_text = /* a constant of its own: no other test's group has this code */
    "graph(%0: float32[16, 9], %1: float32[9]) {\n"
    "  %2: float32[] = constant(0.8125)\n"
    "  %3: float32[16, 9] = mul(%0, %1)\n"
    "  %4: float32[16, 9] = add(%3, %2)\n"
    "  %5: float32[16, 9] = tanh(%4)\n"
    "  %6: float32[16] = sum(%5) {2, 0}\n"
    "  return (%6)\n"
    "}\n";

static kiln_codegen_stats stats(void) {
    kiln_codegen_stats st;
    kiln_codegen_get_stats(&st);
    return st;
}

static bool same_counts(kiln_codegen_stats a, kiln_codegen_stats b) {
    return a.compiles == b.compiles && a.disk_hits == b.disk_hits && a.memory_hits == b.memory_hits;
}

int main(void) {
    kiln_graph *g = NULL;
    CHECK_OK(kiln_graph_parse(fused_text, &g));
    kiln_pass_options popt = {KILN_LEVEL_O1, false, false, KILN_CONV_FUSE_ALL, false};
    CHECK_OK(kiln_optimize(&g, &popt));
    char *gtext = kiln_graph_to_string(g);
    CHECK(gtext && strstr(gtext, "= fused("));
    free(gtext);
    kiln_codegen_stats before = stats();
    kiln_plan *p = NULL;
    CHECK_OK(kiln_plan_build(g, NULL, &p));
    CHECK(same_counts(before, stats())); /* nothing generated, compiled or looked up */
    char *text = p ? kiln_plan_to_string(p) : NULL;
    CHECK(text && strstr(text, "= fused(") && strstr(text, "{subgraph 0}"));
    const char *backends[] = {"kbk", "sink", "reference"};
    for (int b = 0; b < 3; b++) {
        kiln_executable *e = NULL;
        CHECK_OK(kiln_compile(g, &(kiln_compile_options){.backend = backends[b]}, &e));
        char *shown = e ? kiln_executable_plan_string(e) : NULL;
        CHECK(text && shown && strcmp(text, shown) == 0);
        free(shown);
        kiln_executable_free(e);
    }
    /* kbk made the group's kernel: code generated (compiled, from the disk cache, or found loaded) */
    if (kiln_codegen_available()) CHECK(!same_counts(before, stats()));
    free(text);
    kiln_plan_free(p);
    kiln_graph_free(g);
    CHECK_DONE();
}
