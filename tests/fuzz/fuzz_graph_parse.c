/* libFuzzer harness for the graph text parser (kiln_graph_parse, src/ir/parse.c): any text either
 * parses or fails with KILN_ERR_VALUE (KILN_ERR_MEMORY when an allocation fails), leaving nothing
 * allocated. A graph that parses is printed,
 * and the printed text must parse again to a graph that prints the same (the text form round
 * trips). Built and run by scripts/fuzz.sh, with AddressSanitizer (leaks too) and
 * UndefinedBehaviorSanitizer. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    char *reprinted = kiln_graph_to_string(again);
    if (!reprinted || strcmp(printed, reprinted) != 0) {
        fprintf(stderr, "the printed graph does not round trip:\n%s\n---\n%s\n", printed, reprinted ? reprinted : "(null)");
        abort();
    }
    free(reprinted);
    free(printed);
    kiln_graph_free(again);
    kiln_graph_free(g);
    return 0;
}
