"""kiln.show_config() and `python -m kiln` (issue 19 part 4): the facts agree with what the
machine says independently (/proc/cpuinfo, environment caps on oneDNN, the compiler), the compile
check really compiles, and --clear-cache deletes the cache's entries and nothing else."""
import io
import os
import subprocess
import sys

import pytest

import kiln

PYTHON_DIR = os.path.dirname(os.path.dirname(os.path.abspath(kiln.__file__)))


def run_kiln(*args, **env):
    full = dict(os.environ, **env)
    full["PYTHONPATH"] = os.pathsep.join(filter(None, (PYTHON_DIR, os.environ.get("PYTHONPATH"))))
    return subprocess.run([sys.executable, "-m", "kiln", *args], env=full, capture_output=True, text=True,
                          timeout=120)


def cpuinfo_flags():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return None


def test_facts_agree_with_the_machine():
    f = kiln.config.facts()
    assert f["version"] == kiln.__version__
    assert f["threads"] == kiln.get_num_threads()
    cpu = set(f["cpu_isa"].split())
    # the kernels run here, so every extension they were compiled for is one the CPU has
    assert set(f["build_isa"].split()) <= cpu, (f["build_isa"], f["cpu_isa"])
    flags = cpuinfo_flags()
    if flags is not None:
        for ours, linux in (("avx", "avx"), ("avx2", "avx2"), ("fma", "fma"), ("avx512f", "avx512f"),
                            ("avx512bw", "avx512bw"), ("sse4.2", "sse4_2")):
            assert (ours in cpu) == (linux in flags), ours
    assert f["blas_config"].startswith("OpenBLAS") and f["blas_core"]
    assert f["dnnl_version"].count(".") >= 2
    # oneDNN's instruction set is what kiln's convolution layouts follow (8 channels with AVX2, 16 with AVX-512)
    assert {"avx2": 8, "avx512_core": 16}.get(f["dnnl_isa"], f["conv_block"]) == f["conv_block"], f


def test_onednn_isa_follows_its_cap():
    """The ISA shown is oneDNN's effective one: capped by ONEDNN_MAX_CPU_ISA in a new process."""
    proc = run_kiln(ONEDNN_MAX_CPU_ISA="SSE41")
    assert proc.returncode == 0, proc.stderr
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("oneDNN:"))
    assert "instruction set sse41" in line and "ONEDNN_MAX_CPU_ISA=SSE41" in line, line


def test_kiln_isa_follows_its_cap():
    """KILN_MAX_CPU_ISA caps kiln's level and, unless ONEDNN_MAX_CPU_ISA is set, oneDNN's."""
    proc = run_kiln(KILN_MAX_CPU_ISA="sse41")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    line = next(ln for ln in lines if ln.startswith("kiln uses:"))
    assert "instruction set sse41 (KILN_MAX_CPU_ISA=sse41" in line and "winograd baseline" in line, line
    line = next(ln for ln in lines if ln.startswith("oneDNN:"))
    assert "instruction set sse41" in line, line


def test_show_config_prints_every_part():
    out = io.StringIO()
    kiln.show_config(file=out)
    text = out.getvalue()
    f = kiln.config.facts()
    for part in (f"kiln {kiln.__version__}", "build:", f["build_isa"], "CPU:", "kiln uses:",
                 f"instruction set {f['isa']}", "threads:", "BLAS:", f["blas_core"], "oneDNN:", f["dnnl_isa"],
                 "generated code:", f["cc_flags"], "compile cache:"):
        assert part in text, (part, text)


def test_compile_check_and_cache(tmp_path):
    """With an empty cache directory the check compiles a kernel (one entry appears); the next
    process loads it from the disk; --clear-cache deletes entries and keeps other files."""
    cache = tmp_path / "cache"
    proc = run_kiln(KILN_CACHE_DIR=str(cache))
    assert proc.returncode == 0, proc.stderr
    assert "works, a test kernel compiled in" in proc.stdout, proc.stdout
    assert f"compile cache:   {cache}: 1 entry," in proc.stdout, proc.stdout
    proc = run_kiln(KILN_CACHE_DIR=str(cache))
    assert "works, a test kernel loaded from the disk cache" in proc.stdout, proc.stdout

    (cache / ("ab" * 16 + ".so")).write_bytes(b"x" * 1000)   # entry-shaped: counted and deleted
    (cache / "notes.txt").write_text("not kiln's")             # anything else stays
    (cache / ("ab" * 16 + ".so.bak")).write_text("not an entry")
    entries = [p for p in cache.iterdir() if p.name.endswith(".so")]
    size = sum(p.stat().st_size for p in entries)
    proc = run_kiln("--clear-cache", KILN_CACHE_DIR=str(cache))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"compile cache: deleted {len(entries)} entries ({kiln.config.size_text(size)})"
    assert sorted(p.name for p in cache.iterdir()) == sorted(["notes.txt", "ab" * 16 + ".so.bak"])
    proc = run_kiln("--clear-cache", KILN_CACHE_DIR=str(tmp_path / "never-made"))
    assert proc.returncode == 0 and "deleted 0 entries" in proc.stdout, proc.stdout + proc.stderr


def test_a_broken_compiler_is_reported(tmp_path):
    proc = run_kiln(CC="false", KILN_CACHE_DIR=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("generated code:"))
    assert "false = does not run: FAILS: codegen: no C compiler" in line, line
    # a compiler that runs but cannot build the kernel: its error is shown
    proc = run_kiln(CC="cc -fno-such-flag-kiln", KILN_CACHE_DIR=str(tmp_path))
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("generated code:"))
    assert "FAILS:" in line and "no-such-flag-kiln" in line, line


def test_unusable_cache_directory(tmp_path):
    cache = tmp_path / "shared"
    cache.mkdir()
    cache.chmod(0o777)  # writable by others: kiln refuses to load from it
    proc = run_kiln(KILN_CACHE_DIR=str(cache))
    assert proc.returncode == 0, proc.stderr
    assert "not usable" in proc.stdout, proc.stdout
    proc = run_kiln("--clear-cache", KILN_CACHE_DIR=str(cache))
    assert proc.returncode == 1 and "not a usable cache directory" in proc.stderr, proc.stdout + proc.stderr


@pytest.mark.parametrize("arg", ["--bogus"])
def test_bad_argument(arg):
    proc = run_kiln(arg)
    assert proc.returncode == 2 and "unrecognized arguments" in proc.stderr
