"""kiln.tree: the older name of kiln.tree_util (pytree registration and flattening)."""
from .tree_util import *  # noqa: F401,F403
from .tree_util import __all__  # noqa: F401
