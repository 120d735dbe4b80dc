"""The documentation is what works (issue 29 item 9): every ```python block of README.md and
docs/**/*.md runs, as written, in a fresh interpreter with PYTHONPATH=python, and every link of
these pages resolves to a file (and heading) of the repository; none leaves it.

A block that is not meant to run is fenced ```text or ```console, so there is no skip list: a
python block that fails here is a wrong example or a broken feature."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BLOCK_TIMEOUT_S = 60
FENCE = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`\s]*)")


def doc_pages():
    return [ROOT / "README.md"] + sorted((ROOT / "docs").rglob("*.md"))


def where(path, line):
    return f"{path.relative_to(ROOT)}:{line}"


def split_fences(text):
    """(prose lines with their numbers, [(info string, first line number, code)]) of a Markdown
    text: fenced blocks apart from the prose around them."""
    prose, blocks = [], []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            prose.append((i + 1, lines[i]))
            i += 1
            continue
        fence, start, body = m.group("fence"), i + 1, []
        i += 1
        while i < len(lines) and not re.match(rf"^ {{0,3}}{re.escape(fence[0])}{{{len(fence)},}}\s*$", lines[i]):
            body.append(lines[i])
            i += 1
        if i == len(lines):
            raise AssertionError(f"line {start}: code block opened with {fence} is never closed")
        blocks.append((m.group("info").lower(), start, "\n".join(body) + "\n"))
        i += 1  # the closing fence
    return prose, blocks


def python_blocks():
    out = []
    for page in doc_pages():
        _, blocks = split_fences(page.read_text())
        out += [(where(page, line), code) for info, line, code in blocks if info in ("python", "py", "python3")]
    return out


BLOCKS = python_blocks()


def test_the_readme_has_a_runnable_example():
    assert any(name.startswith("README.md:") for name, _ in BLOCKS), "README.md has no ```python block"


def test_fences_parse():
    """Fences are found, closed, and an unclosed one is an error (else a page's rest would vanish)."""
    prose, blocks = split_fences("a\n```python\nx = 1\n```\nb\n````text\n```\n````\n")
    assert [line for line, _ in prose] == [1, 5]
    assert blocks == [("python", 2, "x = 1\n"), ("text", 6, "```\n")]
    with pytest.raises(AssertionError, match="never closed"):
        split_fences("```python\nx = 1\n")


def block_failure(name, code, workdir, timeout=BLOCK_TIMEOUT_S):
    """Runs one block as a script in workdir (files it writes stay out of the tree); None when it
    succeeds, else why it failed, naming the block's file and line."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, (str(ROOT / "python"),
                                                                     os.environ.get("PYTHONPATH")))))
    env.setdefault("MPLBACKEND", "Agg")
    script = Path(workdir) / "block.py"
    script.write_text(code)
    try:
        proc = subprocess.run([sys.executable, str(script)], cwd=workdir, env=env, capture_output=True,
                              text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"{name}: the python block did not finish in {timeout} s"
    if proc.returncode != 0:
        return (f"{name}: the python block exits with status {proc.returncode} "
                f"(fence it as text or console if it is not meant to run)\n"
                f"{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    return None


@pytest.mark.parametrize("name,code", BLOCKS, ids=[name for name, _ in BLOCKS])
def test_python_block_runs(name, code, tmp_path):
    failure = block_failure(name, code, tmp_path)
    assert failure is None, failure


def test_a_failing_block_is_named(tmp_path):
    """The runner fails a block that raises, exits non-zero or hangs, naming where it is."""
    assert block_failure("a.md:3", "import kiln\nprint(kiln.__version__)\n", tmp_path) is None
    failure = block_failure("a.md:3", "import kiln\nkiln.ops.no_such_op()\n", tmp_path)
    assert failure.startswith("a.md:3: the python block exits with status 1") and "AttributeError" in failure
    assert block_failure("b.md:7", "import time\ntime.sleep(30)\n", tmp_path, timeout=1) == \
        "b.md:7: the python block did not finish in 1 s"


def test_the_readme_is_short_with_a_short_example():
    """Issue 29 item 9: a README a newcomer reads, under 250 lines, its example at most 20."""
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) < 250
    _, blocks = split_fences(text)
    first = next(code for info, _, code in blocks if info == "python")
    assert len(first.splitlines()) <= 20, first


# ---- links ---------------------------------------------------------------------------------------

LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?(?P<target>[^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
REF_DEF = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(?P<target>\S+?)>?(?:\s+.*)?$")
CODE_SPAN = re.compile(r"(`+).*?\1")


def slug(heading):
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"`|\*\*?|__?", "", heading.strip().lower())
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page):
    prose, _ = split_fences(page.read_text())
    seen, out = {}, set()
    for _, line in prose:
        m = re.match(r"^ {0,3}#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            base = slug(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(page):
    """(line, target) of every inline link, image and link definition outside code."""
    prose, _ = split_fences(page.read_text())
    out = []
    for line, text in prose:
        text = CODE_SPAN.sub("", text)
        out += [(line, m.group("target")) for m in LINK.finditer(text)]
        m = REF_DEF.match(text)
        if m:
            out.append((line, m.group("target")))
    return out


def link_problem(page, target):
    """Why a link of page is wrong, or None."""
    if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target) or target.startswith("//"):
        return "leaves the repository (a URL)"
    path_part, _, fragment = target.partition("#")
    dest = (page.parent / path_part).resolve() if path_part else page.resolve()
    try:
        dest.relative_to(ROOT)
    except ValueError:
        return "points outside the repository"
    if not dest.exists():
        return f"{dest.relative_to(ROOT)} does not exist"
    if fragment and dest.suffix == ".md" and fragment not in anchors(dest):
        return f"{dest.relative_to(ROOT)} has no heading with the anchor #{fragment}"
    return None


def test_every_link_resolves_inside_the_repository():
    problems = [f"{where(page, line)}: ({target}) {why}"
                for page in doc_pages() for line, target in links(page)
                for why in [link_problem(page, target)] if why]
    assert not problems, "\n".join(problems)


def test_no_page_names_a_path_outside_the_repository():
    """Not even as text: a clone has nothing above its root (the old README pointed at ../shared)."""
    problems = []
    for page in doc_pages():
        prose, blocks = split_fences(page.read_text())
        texts = [(line, text) for line, text in prose]
        texts += [(start + 1 + k, text) for _, start, code in blocks for k, text in enumerate(code.splitlines())]
        for line, text in texts:
            for m in re.finditer(r"(?<![\w./-])((?:\.\./)+[\w.*-]+)", text):
                dest = (page.parent / m.group(1)).resolve()
                if not dest.is_relative_to(ROOT):
                    problems.append(f"{where(page, line)}: {m.group(1)} is outside the repository")
    assert not problems, "\n".join(problems)


def test_the_link_checks_catch_bad_links(tmp_path):
    """The checks above fail on what they are for: a URL, a path out of the tree, a missing file or
    heading; and pass a good link with its anchor."""
    page = ROOT / "docs" / "README.md"
    assert link_problem(page, "https://example.com/x") == "leaves the repository (a URL)"
    assert link_problem(page, "../../shared/DESIGN.md") == "points outside the repository"
    assert "does not exist" in link_problem(page, "guide/no-such-page.md")
    assert "no heading" in link_problem(page, "guide/jit.md#no-such-heading")
    assert link_problem(page, "guide/jit.md#what-jit-assumes") is None
    assert slug("The main job: `kiln.bench`") == "the-main-job-kilnbench"
    assert slug("MindSpore's context") == "mindspores-context"
    md = tmp_path / "x.md"
    md.write_text("[a](b.md) `[not](a-link.md)` ![img](c.png \"title\")\n```text\n[no](d.md)\n```\n[r]: e.md\n")
    assert links(md) == [(1, "b.md"), (1, "c.png"), (5, "e.md")]
