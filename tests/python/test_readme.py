"""The README's commands are what works (issue 19 part 1): its Set-up section names the test
command, kiln's main job and the per-issue micro-benchmarks, in that order, each a script of the
repository; CI runs the README's test command; and the main job runs as written, in its fastest
form (tiny shapes, no peers passed through), printing the tutorial's tables."""
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def setup_commands():
    """The commands of the README's Set-up section: its indented lines that run a script."""
    text = (ROOT / "README.md").read_text()
    section = re.search(r"^## Set-up.*?(?=^## )", text, re.S | re.M)
    assert section, "README.md has no '## Set-up' section"
    return [line.strip() for line in section.group(0).splitlines()
            if line.startswith("    ") and line.strip().startswith("bash ./scripts/")]


def script_of(command):
    words = shlex.split(command)
    assert words[0] == "bash" and len(words) == 2, command  # the command runs one script, no arguments
    return ROOT / words[1]


def test_three_commands_naming_scripts_that_exist():
    commands = setup_commands()
    assert [script_of(c).name for c in commands] == ["test.sh", "bench.sh", "bench_issues.sh"], commands
    for c in commands:
        path = script_of(c)
        assert path.is_file(), f"{c}: {path} does not exist"
        check = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
        assert check.returncode == 0, f"{c}: {check.stderr}"


def test_ci_runs_the_readme_test_command():
    test_command = setup_commands()[0]
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()
          if line.strip() and not line.strip().startswith("#")]
    assert test_command in ci, f".ci/run does not run the README's test command {test_command!r}: {ci}"


def test_main_job_command_runs():
    """The README's second command, with --smallest --peers none passed through to kiln.bench."""
    main_job = setup_commands()[1]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the script sets its own
    proc = subprocess.run(shlex.split(main_job) + ["--smallest", "--peers", "none", "--repeat", "2"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert out.startswith("kiln.bench: the just-in-time compilation tutorial's tables"), out[:500]
    for title in ("## simple function", "## conv: ResNet BasicBlock, forward", "## attention: Llama attention"):
        assert title in out, title
    assert "--full for the tutorial's shapes" in out  # the one line on peers and --full
    assert "all results agree with kiln eager" in out


@pytest.mark.parametrize("module", ["kiln.bench", "kiln"])
def test_documented_python_commands_take_help(module):
    """`python -m kiln.bench` and `python -m kiln`, which the README documents, start."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, (str(ROOT / "python"),
                                                                     os.environ.get("PYTHONPATH")))))
    proc = subprocess.run([sys.executable, "-m", module, "--help"], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "usage:" in proc.stdout, proc.stderr
