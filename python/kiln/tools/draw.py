"""Graph pictures: a compiled function's graph as Graphviz DOT, or drawn by Graphviz's dot."""
import os
import shutil
import subprocess


def draw(f, path, *args, **kwargs):
    """Writes the graph of f (a kiln.jit function, a kiln.trace, or an Executable) to path: DOT text
    for ".dot" / ".gv", else the picture Graphviz's `dot` program draws in the format the suffix
    names (".svg", ".png", ".pdf"). args/kwargs pick the compiled signature (default: the last
    call's). Returns path."""
    if not hasattr(f, "graph_dot"):
        raise TypeError(f"draw: expected a kiln.jit function, a kiln.trace or an Executable, got {type(f).__name__}")
    text = f.graph_dot(*args, **kwargs)
    path = os.fspath(path)
    fmt = os.path.splitext(path)[1].lstrip(".").lower()
    if fmt in ("dot", "gv"):
        with open(path, "w", encoding="utf-8") as out:
            out.write(text)
        return path
    if not fmt:
        raise ValueError(f"draw: {path!r} has no suffix naming a format (.dot, .svg, .png, .pdf)")
    dot = shutil.which("dot")
    if dot is None:
        raise RuntimeError(f"draw: writing {path!r} needs Graphviz's `dot` program, which is not installed; "
                           "write a .dot file instead (or install graphviz)")
    done = subprocess.run([dot, f"-T{fmt}", "-o", path], input=text.encode(), capture_output=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"draw: dot -T{fmt} failed: {done.stderr.decode(errors='replace').strip()}")
    return path
