/* Symbolic sizes in a graph: its symbols, values whose dimensions are expressions of them, and
 * nodes whose size attributes are (src/ir/graph_sym.c; the table: src/core/symdim.h). A value's
 * meta keeps the hint, its size at the symbols' hints, so code that reads concrete sizes keeps
 * working on the recorded shapes; code that must hold for every binding reads the expressions.
 * The passes run on symbolic graphs (each keeps the expressions, or leaves alone what it could only
 * do for the hints; the pipeline checks that the outputs' sizes stay the same expressions), and
 * kiln_graph_instantiate gives the concrete graph of one binding. The planner plans a symbolic
 * graph once and binds that plan per binding (kiln_plan_build_symbolic, kiln_plan_bind in
 * src/plan/plan.h); kiln_plan_build, model files, rebinding and splitting take only concrete graphs:
 * they refuse symbolic ones (kiln_graph_require_concrete) rather than bake the hints in. */
#ifndef KILN_IR_SYMBOLIC_H
#define KILN_IR_SYMBOLIC_H

#include "../core/symdim.h"
#include "kiln/graph.h"

/* A new symbol of g (its table made on first use): sizes >= lower, hint its size here. */
kiln_status kiln_graph_add_symbol(kiln_graph *g, int64_t lower, int64_t hint, kiln_sdim *out);
/* Whether g has symbols. */
static inline bool kiln_graph_is_symbolic(const kiln_graph *g) { return g->syms && kiln_sym_count(g->syms) > 0; }
/* An input of g with the sizes `shape` (constants or g's expressions). */
kiln_status kiln_graph_add_input_sym(kiln_graph *g, kiln_dtype dtype, const kiln_sshape *shape, int32_t *value);
/* kiln_graph_add_node with the int attributes given as sizes too: attr_dims (attrs->ni of them, or
 * NULL: all constant) holds g's expressions where a size attribute is symbolic (attrs->i[k] is
 * then set to its hint). Outputs get symbolic shapes by the op's KILN_SYM rule when an input or
 * an attribute is symbolic. */
kiln_status kiln_graph_add_node_sym(kiln_graph *g, kiln_op op, int nin, const int32_t *in, const kiln_attrs *attrs,
                                    const kiln_sdim *attr_dims, int32_t loc, int32_t *out);
/* Value v's shape as sizes. */
void kiln_graph_value_sshape(const kiln_graph *g, int32_t v, kiln_sshape *out);
/* Node n's int attribute k as a size. */
static inline kiln_sdim kiln_graph_attr_dim(const kiln_node *n, int k) {
    return (kiln_sdim){n->attr_sym ? n->attr_sym[k] : 0, n->attrs.i[k]};
}
/* Value v's shape with symbol k bound to bindings[k] (kiln_sym_count(g->syms) of them). */
kiln_status kiln_graph_value_shape_at(const kiln_graph *g, int32_t v, const int64_t *bindings, int64_t *shape);
/* KILN_ERR_VALUE "<what>: graphs with symbolic sizes are not supported yet" when g (or a
 * subgraph) has symbols. */
kiln_status kiln_graph_require_concrete(const kiln_graph *g, const char *what);

/* Node n's int attributes as sizes (n->attrs.ni of them) into ai. */
void kiln_graph_attr_dims(const kiln_node *n, kiln_sdim *ai);
/* Whether values a and b of g have the same shape for every binding (the same sizes and
 * expressions). Also across two graphs whose tables are copies of one (a pass's input and output):
 * kiln_value_same_shape. */
bool kiln_value_same_shape(const kiln_value *a, const kiln_value *b);
static inline bool kiln_graph_same_shape(const kiln_graph *g, int32_t a, int32_t b) {
    return kiln_value_same_shape(&g->values[a], &g->values[b]);
}
/* Whether the size attributes of two nodes are the same expressions (their ints compared apart). */
bool kiln_node_same_attr_sym(const kiln_node *a, const kiln_node *b);
/* to (new, without symbols) gets a copy of from's table: the same entries, so the sizes of from's
 * values and attributes are valid in to. */
kiln_status kiln_graph_copy_symbols(const kiln_graph *from, kiln_graph *to);
/* The concrete graph of g at one binding (symbol k = bindings[k], at least its lower bound): every
 * size and size attribute evaluated, subgraphs too, then verified, so a binding the graph does
 * not hold for (a slice out of bounds, sizes that do not broadcast) fails with KILN_ERR_VALUE
 * naming the node. A graph without symbols gives a copy. */
kiln_status kiln_graph_instantiate(const kiln_graph *g, const int64_t *bindings, kiln_graph **out);

/* A size attribute of a recorded graph's node as a symbolic size (kiln_graph_symbolize): kind
 * KILN_ATTR_SET_VALUE, the size `value`; KILN_ATTR_SET_DIM, the size of dimension value.v of the
 * node's input 0; KILN_ATTR_SET_REST, input 0's element count divided by the node's other int
 * attributes (constants); KILN_ATTR_SET_FOLLOW (a backward pass's node), the sizes of the values
 * it was recorded from (src/ir/follow.h; a slice's, the earlier slices' with its attributes). */
typedef struct kiln_attr_sym_set {
    int32_t node, index;
    kiln_attr_set_kind kind;
    kiln_sdim value;
} kiln_attr_sym_set;

/* A copy of g, recorded with concrete sizes, whose inputs have the sizes `inputs` (expressions of
 * syms, which it takes, freed on failure too; their hints g's sizes) and whose size attributes are
 * `sets`; every node's outputs then get the expressions its KILN_SYM rule gives (an if's, while's
 * or while_grad's: its bodies made symbolic copies taking its inputs' sizes, see
 * kiln_graph_infer_sym). Followed sizes with several votes left are tried in turn (a bounded
 * search), and taken when exactly one choice makes the whole graph infer (two that both do:
 * refused, it cannot tell which the recording meant). KILN_ERR_VALUE naming the node where that
 * cannot be (an op
 * without a rule on symbolic sizes, a size the rule cannot show for every binding, a
 * KILN_OPF_SIZED node with symbolic inputs that no set names, whose sizes were taken from the
 * recorded shapes, as kiln_graph_rebind refuses it): the graph does not hold for every binding as
 * recorded. */
kiln_status kiln_graph_symbolize(const kiln_graph *g, kiln_symtab *syms, const kiln_sshape *inputs, int nset,
                                 const kiln_attr_sym_set *sets, kiln_graph **out);

/* ---- for graph.c ------------------------------------------------------------------------------ */

/* Whether node inputs `in` or attribute entries attr_sym (NULL: none) refer to symbols. */
bool kiln_graph_node_symbolic(const kiln_graph *g, int nin, const int32_t *in, int ni, const int32_t *attr_sym);
/* The symbolic shapes of a node's nout outputs (concrete: kiln_infer's at the hints): by the op's
 * KILN_SYM rule, or for if, while and while_grad from their bodies in g (symbolic copies sharing
 * g's symbols: each takes the node's inputs' expressions, if's branches return the same ones, a
 * loop body its loop values'). */
kiln_status kiln_graph_infer_sym(const kiln_graph *g, kiln_op op, int nin, const int32_t *in, const kiln_attrs *a,
                                 const int32_t *attr_sym, int nout, const kiln_meta *concrete, kiln_sshape *out);
/* The verifier's symbolic checks on g: entries in range, hints equal to the metas, captures
 * concrete, every node's outputs the expressions its rule gives. */
kiln_status kiln_graph_verify_sym(const kiln_graph *g);

#endif
