"""GraphCell: a loaded model file as a Cell (MindSpore's nn.GraphCell(mindspore.load(path)))."""
from .cell import Cell


class GraphCell(Cell):
    """Runs a graph kiln.load returned; calling the cell calls the graph. params_init and
    obf_random_seed (MindSpore's, for changing parameters and obfuscated models) must be None:
    a kiln file's parameters are fixed."""

    def __init__(self, graph, params_init=None, obf_random_seed=None):
        super().__init__()
        from ..jit.deploy import LoadedGraph

        if not isinstance(graph, LoadedGraph):
            raise TypeError(f"GraphCell: expected a graph from kiln.load, got {type(graph).__name__}")
        if params_init is not None or obf_random_seed is not None:
            raise ValueError("GraphCell: params_init and obf_random_seed are not supported (a kiln file's parameters "
                             "are fixed)")
        self.graph = graph

    def construct(self, *inputs):
        return self.graph(*inputs)
