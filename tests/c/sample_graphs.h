/* Graph texts several C tests run. */
#ifndef KILN_TEST_SAMPLE_GRAPHS_H
#define KILN_TEST_SAMPLE_GRAPHS_H

/* a * b + c on 2x3 float32 */
#define SAMPLE_ABC                                                        \
    "graph(%0: float32[2, 3], %1: float32[2, 3], %2: float32[2, 3]) {\n" \
    "  %3: float32[2, 3] = mul(%0, %1)\n"                                \
    "  %4: float32[2, 3] = add(%3, %2)\n"                                \
    "  return (%4)\n"                                                    \
    "}\n"

/* x counts up by one while x < limit: with limit = inf it never ends (x stops growing at 2^24) */
#define SAMPLE_COUNTING_LOOP                                  \
    "graph(%0: float32[], %1: float32[]) {\n"                \
    "  %2: float32[] = while(%0, %1) {0, 1, 1}\n"            \
    "  return (%2)\n"                                        \
    "}\n"                                                    \
    "subgraph 0: graph(%0: float32[], %1: float32[]) {\n"    \
    "  %2: bool[] = lt(%0, %1)\n"                            \
    "  return (%2)\n"                                        \
    "}\n"                                                    \
    "subgraph 1: graph(%0: float32[], %1: float32[]) {\n"    \
    "  %2: float32[] = constant(1)\n"                        \
    "  %3: float32[] = add(%0, %2)\n"                        \
    "  return (%3)\n"                                        \
    "}\n"

#endif
