/* The nodes of the autograd tape. */
#ifndef KILN_AUTOGRAD_NODE_H
#define KILN_AUTOGRAD_NODE_H

#include "../core/internal.h"
#include "kiln/autograd.h"

/* Where the gradient of one input of a node goes: the node that produced it (and which of its
 * outputs it was), or a leaf tensor that requires grad. Neither when the input needs none. */
typedef struct kiln_grad_edge {
    struct kiln_grad_node *node; /* owned reference */
    int32_t output_nr;
    kiln_tensor *leaf;           /* owned reference */
} kiln_grad_edge;

typedef struct kiln_grad_node {
    int64_t refcount;
    uint64_t seq; /* creation order: a node's inputs were made by nodes with smaller seq */
    kiln_op op;
    int32_t nin, nout;
    kiln_attrs attrs;
    kiln_meta *in_meta, *out_meta;
    kiln_tensor **saved_in, **saved_out; /* NULL entries when not saved */
    int64_t *saved_version;              /* nin + nout storage versions at save time */
    kiln_grad_edge *next;                /* nin */
    struct kiln_grad_node *dying;        /* while being freed: the next node of the list still to free */
    kiln_custom_grad *custom;            /* kiln_autograd_record_custom's rule (op unused), or NULL */
    uint64_t trace;                      /* the trace that recorded the forward op (0: none) and its */
    int32_t loc;                         /* source location there: the gradient's ops take it */
    kiln_grad_hook *hooks;               /* hooks on its outputs' gradients (Tensor.register_hook), or NULL */
} kiln_grad_node;

/* Called by kiln_apply after a differentiable op ran with inputs that require grad. */
kiln_status kiln_autograd_record(kiln_op op, int nin, kiln_tensor *const *in,
                                 const kiln_attrs *attrs, int nout, kiln_tensor **out);
void kiln_grad_node_release(kiln_grad_node *node);
/* The seq the next recorded node will get: nodes with a smaller seq were recorded before. */
uint64_t kiln_autograd_clock(void);
/* What the node computed: its op's name, or a custom node's. */
const char *kiln_grad_node_name(const kiln_grad_node *node);

#endif
