/* Whether generated code works on this machine: a tiny kernel through the ordinary path of
 * compiler.c (kiln.show_config, `python -m kiln`). */
#include "codegen_info.h"

kiln_status kiln_codegen_selftest(void) {
    static const char source[] = "long kiln_selftest_axpb(long x) { return 3 * x + 1; }\n";
    void *fn = NULL;
    kiln_status s = kiln_codegen_load(source, "kiln_selftest_axpb", &fn);
    if (s != KILN_OK) return s;
    long (*axpb)(long) = (long (*)(long))fn;
    long got = axpb(14);
    if (got != 43)
        return kiln_error(KILN_ERR_RUNTIME, "codegen: the test kernel computed 3 * 14 + 1 = %ld", got);
    return KILN_OK;
}
