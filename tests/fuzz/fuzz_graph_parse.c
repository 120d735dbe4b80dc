/* libFuzzer harness for the graph text parser (kiln_graph_parse, src/ir/parse.c): any text either
 * parses or fails with KILN_ERR_VALUE (KILN_ERR_MEMORY when an allocation fails), leaving nothing
 * allocated. A graph that parses is printed, and the printed text must parse again to the same
 * graph: the same ops, wiring, captures and outputs (kiln_graph_diff_*, which compare values by
 * what they are, not by number: the printer lists captures before the nodes, so a text that
 * declares a constant after a node is numbered anew), and from then on the text is a fixed point. Built and run by scripts/fuzz.sh, with AddressSanitizer (leaks too) and
 * UndefinedBehaviorSanitizer. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ir/compare.h"
#include "kiln/kiln.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = malloc(size + 1); /* the parser reads a NUL-terminated string */
    if (!text) return 0;
    memcpy(text, data, size);
    text[size] = '\0';
    kiln_graph *g = NULL;
    kiln_status s = kiln_graph_parse(text, &g);
    free(text);
    if (s != KILN_OK) {
        if ((s != KILN_ERR_VALUE && s != KILN_ERR_MEMORY) || g != NULL) {
            fprintf(stderr, "kiln_graph_parse: status %d (graph %p): %s\n", (int)s, (void *)g, kiln_last_error());
            abort();
        }
        return 0;
    }
    char *printed = kiln_graph_to_string(g);
    if (!printed) abort();
    kiln_graph *again = NULL;
    if (kiln_graph_parse(printed, &again) != KILN_OK) {
        fprintf(stderr, "the printed graph does not parse: %s\n%s\n", kiln_last_error(), printed);
        abort();
    }
    kiln_graph_diff d;
    if (kiln_graph_diff_ops(g, again, &d) || kiln_graph_diff_outputs(g, again, &d)) {
        char *why = kiln_graph_diff_message(&d, 0, NULL);
        fprintf(stderr, "the printed graph parses to another graph (%s):\n%s\n", why ? why : "?", printed);
        abort();
    }
    char *reprinted = kiln_graph_to_string(again);
    kiln_graph *third = NULL;
    if (!reprinted || kiln_graph_parse(reprinted, &third) != KILN_OK) abort();
    char *third_text = kiln_graph_to_string(third);
    if (!third_text || strcmp(reprinted, third_text) != 0) {
        fprintf(stderr, "the printed graph does not round trip:\n%s\n---\n%s\n", reprinted,
                third_text ? third_text : "(null)");
        abort();
    }
    free(third_text);
    kiln_graph_free(third);
    free(reprinted);
    free(printed);
    kiln_graph_free(again);
    kiln_graph_free(g);
    return 0;
}
