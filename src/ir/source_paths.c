/* Source locations without the user's directories: model files are shipped, and a "file:line"
 * with a path would carry the producer's directories (a home directory, a user name) along.
 * kiln_graph_base_name_locs keeps each location's file base name and line ("/home/u/net.py:12"
 * becomes "net.py:12"), in the graph and its subgraphs; locations that become equal are merged.
 * A path relative to the files' common directory would still hold the user's name whenever the
 * traced code and a library lie in different trees (/home/u/... and /usr/...). */
#include "../core/internal.h"
#include "kiln/graph.h"

/* The length of loc's directory part: up to the last '/' before the line's ':'. */
static size_t dir_len(const char *loc) {
    const char *colon = strrchr(loc, ':');
    size_t n = colon ? (size_t)(colon - loc) : strlen(loc), d = 0;
    for (size_t i = 0; i < n; i++)
        if (loc[i] == '/') d = i + 1;
    return d;
}

kiln_status kiln_graph_base_name_locs(kiln_graph *g) {
    for (int32_t k = 0; k < g->nsubgraphs; k++) KILN_TRY(kiln_graph_base_name_locs(g->subgraphs[k]));
    if (!g->nlocs) return KILN_OK;
    int32_t *map = kiln_malloc(sizeof(int32_t) * (size_t)g->nlocs);
    if (!map) return kiln_error(KILN_ERR_MEMORY, "out of memory stripping source paths");
    int32_t n = 0;
    for (int32_t k = 0; k < g->nlocs; k++) {
        char *s = g->locs[k];
        size_t d = dir_len(s);
        memmove(s, s + d, strlen(s + d) + 1);
        map[k] = -1;
        for (int32_t j = 0; j < n && map[k] < 0; j++)
            if (strcmp(g->locs[j], s) == 0) map[k] = j;
        if (map[k] >= 0) {
            free(s);
        } else {
            g->locs[n] = s;
            map[k] = n++;
        }
    }
    g->nlocs = n;
    for (int32_t i = 0; i < g->nnodes; i++)
        if (g->nodes[i].loc >= 0) g->nodes[i].loc = map[g->nodes[i].loc];
    free(map);
    return KILN_OK;
}
