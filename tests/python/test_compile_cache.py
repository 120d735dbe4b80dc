"""The disk cache of compiled kernels is safe (issue 18, items 6-9), each test the issue's reproducer
run in fresh interpreters sharing a cache directory: the key covers the whole compiler command (an
object built with CC="cc -ffast-math" is not loaded for plain cc); an entry with a valid footer but
without its symbol is closed and rebuilt, and the rebuild loads; a cache directory swapped during a
compile is neither written nor loaded from; a killed compile and a failed one leave no temporaries
(a killed one's are swept by the next process, as are the <key>.tmp.<pid>.*.so files older versions
left)."""
import json
import os
import signal
import subprocess
import textwrap
import time

import pytest

from conftest import python_command, python_env

# a sunk graph (one generated function) whose result shows NaN handling: maximum(nan, 0) is nan
SCRIPT = """
    import json, numpy as np, kiln
    from kiln import ops
    f = kiln.jit(lambda x, y: ops.maximum(x, y) * 2.0 + 1.0, backend="sink")
    x = kiln.Tensor(np.array([np.nan, 1, -2], np.float32))
    y = kiln.Tensor(np.zeros(3, np.float32))
    r = f(x, y)
    print(json.dumps({"result": [repr(v) for v in r.asnumpy().tolist()], "native": f._last.executable.native,
                      "stats": kiln._C.codegen_stats()}))
    """
EXPECTED = [repr(v) for v in [float("nan"), 3.0, 1.0]]


def run(cache, **env):
    """SCRIPT with KILN_CACHE_DIR=cache: (its report, its stderr)."""
    p = subprocess.run(python_command(SCRIPT), capture_output=True, text=True, timeout=300,
                       env=python_env(KILN_CACHE_DIR=str(cache), **env))
    assert p.returncode == 0, p.stdout + p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1]), p.stderr


def entries(cache):
    return sorted(os.listdir(cache))


def temporaries(folder):
    return [n for n in os.listdir(folder) if n.startswith("kiln-tmp-") or ".tmp." in n]


def wrapper(tmp_path, body):
    """A $CC: a shell script that answers --version as cc does and runs `body` to compile."""
    path = tmp_path / "cc-wrapper.sh"
    path.write_text('#!/bin/sh\ncase "$1" in --version) exec cc "$@";; esac\n' + textwrap.dedent(body))
    return f"sh {path}"


# ---- 6. the key covers the compiler command ---------------------------------------------------

def test_extra_compiler_words_are_part_of_the_key(tmp_path):
    cache = tmp_path / "cache"
    fast, _ = run(cache, CC="cc -ffast-math")
    assert fast["stats"]["compiles"] == 1
    built = entries(cache)
    plain, _ = run(cache, CC="cc")
    assert plain["stats"]["disk_hits"] == 0 and plain["stats"]["compiles"] == 1, plain  # not the -ffast-math object
    assert plain["result"] == EXPECTED and plain["native"]
    assert len(entries(cache)) == 2 * len(built)
    again, _ = run(cache, CC="cc -ffast-math")  # the same command finds its own entry
    assert again["stats"]["compiles"] == 0 and again["stats"]["disk_hits"] >= 1, again
    spaced, _ = run(cache, CC="  cc   -ffast-math ")  # the same words
    assert spaced["stats"]["compiles"] == 0, spaced


# ---- 7. an entry without its symbol ------------------------------------------------------------

_M = (1 << 64) - 1


def _mix64(x):
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & _M
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & _M
    return x ^ (x >> 31)


def codegen_hash(data, seed):
    """kiln_codegen_hash (src/codegen/compiler.c), to seal a forged entry."""
    n = len(data)
    h = _mix64((seed ^ (0x9E3779B97F4A7C15 * (n + 1))) & _M)
    whole = n - n % 8
    for i in range(0, whole, 8):
        h = (_mix64(h ^ int.from_bytes(data[i:i + 8], "little")) * 0x100000001B3 + 0x9E3779B97F4A7C15) & _M
    return _mix64(h ^ int.from_bytes(data[whole:], "little") ^ (((n - whole) << 59) & _M))


def sealed(payload, key):
    """payload with the footer of a valid entry for key."""
    digest = codegen_hash(payload, codegen_hash(key.encode(), 3))
    return payload + b"KILNSO\x01\x00" + len(payload).to_bytes(8, "little") + digest.to_bytes(8, "little")


def test_entry_lacking_its_symbol_is_rebuilt_and_loaded(tmp_path):
    cache = tmp_path / "cache"
    first, _ = run(cache)
    built = entries(cache)
    assert first["native"] and built
    # every entry becomes a valid, loadable object that lacks the kernels
    (tmp_path / "stub.c").write_text("int kiln_test_unrelated(void) { return 1; }\n")
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(tmp_path / "stub.so"), str(tmp_path / "stub.c")], check=True)
    stub = (tmp_path / "stub.so").read_bytes()
    for name in built:
        real = (cache / name).read_bytes()
        assert sealed(real[:-24], name[:-len(".so")]) == real, "codegen_hash differs from the library's"
        (cache / name).write_bytes(sealed(stub, name[:-len(".so")]))
    second, err = run(cache)
    assert second["native"] and second["result"] == EXPECTED, (second, err)
    assert "kiln: warning" not in err, err
    assert second["stats"]["rebuilt"] == len(built) and second["stats"]["compiles"] >= 1, second
    third, _ = run(cache)  # the rebuilt entries were stored
    assert third["stats"]["compiles"] == 0 and third["stats"]["disk_hits"] == len(built), third
    assert third["native"] and third["result"] == EXPECTED


# ---- 8. a directory swapped during a compile ------------------------------------------------------

def test_cache_directory_swapped_during_a_compile_is_not_written(tmp_path):
    cache = tmp_path / "cache"
    cc = wrapper(tmp_path, """
        if [ ! -e "$SWAP.orig" ]; then mv "$SWAP" "$SWAP.orig" && mkdir -m 700 "$SWAP"; fi
        exec cc "$@"
        """)
    report, err = run(cache, CC=cc, SWAP=str(cache))
    assert os.path.isdir(str(cache) + ".orig"), "the wrapper did not swap the directory"
    assert report["native"] and report["result"] == EXPECTED, (report, err)
    assert entries(cache) == []  # the directory swapped in is never written
    assert temporaries(str(cache) + ".orig") == []  # nor is anything left in the original


# ---- 9. temporaries of killed and failed compiles ----------------------------------------------------

def test_killed_compile_leaves_no_temporaries_behind(tmp_path):
    cache = tmp_path / "cache"
    mark = tmp_path / "compiling"
    cc = wrapper(tmp_path, """
        touch "$MARK"
        sleep 120
        exec cc "$@"
        """)
    p = subprocess.Popen(python_command(SCRIPT), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         env=python_env(KILN_CACHE_DIR=str(cache), CC=cc, MARK=str(mark)), start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not mark.exists() and p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert mark.exists(), "the compile never started"
    finally:
        os.killpg(p.pid, signal.SIGKILL)  # Python, the wrapper and its sleep, mid-compile
        p.wait()
    left = temporaries(cache)
    assert left, "the killed compile left nothing to sweep: the test would prove nothing"
    # a temporary of an older kiln, named after a process that has ended
    ended = subprocess.Popen(["true"])
    ended.wait()
    legacy = f"{'0' * 32}.tmp.{ended.pid}.0.so"
    (cache / legacy).write_bytes(b"partial")
    report, _ = run(cache)
    assert report["native"] and report["result"] == EXPECTED
    assert temporaries(cache) == [], entries(cache)
    assert all(n.endswith(".so") and len(n) == 35 for n in entries(cache)), entries(cache)


def test_running_compile_keeps_its_temporaries(tmp_path):
    """Another process's sweep spares the work directory of a compile that is running."""
    cache = tmp_path / "cache"
    mark, go = tmp_path / "compiling", tmp_path / "go"
    cc = wrapper(tmp_path, """
        touch "$MARK"
        while [ ! -e "$GO" ]; do sleep 0.05; done
        exec cc "$@"
        """)
    p = subprocess.Popen(python_command(SCRIPT), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=python_env(KILN_CACHE_DIR=str(cache), CC=cc, MARK=str(mark), GO=str(go)))
    try:
        deadline = time.monotonic() + 120
        while not mark.exists() and p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert mark.exists(), "the compile never started"
        running = temporaries(cache)
        other, _ = run(cache)  # sweeps the directory while the first compile waits
        assert other["native"]
        assert set(running) <= set(temporaries(cache)), (running, entries(cache))
    finally:
        go.touch()
        out, err = p.communicate(timeout=300)
    assert p.returncode == 0, err
    report = json.loads(out.strip().splitlines()[-1])
    assert report["native"] and report["result"] == EXPECTED, (report, err)
    assert temporaries(cache) == []


@pytest.mark.parametrize("usable_cache", [True, False], ids=["cache", "no-cache"])
def test_failed_compile_leaves_no_temporaries_behind(tmp_path, usable_cache):
    cache, tmp = tmp_path / "cache", tmp_path / "tmp"
    tmp.mkdir()
    if not usable_cache:
        cache.mkdir(mode=0o700)
        os.chmod(cache, 0o777)  # writable by others: not used
    cc = wrapper(tmp_path, """
        out=""; prev=""
        for a in "$@"; do [ "$prev" = "-o" ] && out="$a"; prev="$a"; done
        echo partial > "$out"
        exit 1
        """)
    report, err = run(cache, CC=cc, TMPDIR=str(tmp))
    assert "kiln: warning: generated code unavailable" in err, err
    assert not report["native"] and report["result"] == EXPECTED  # interpreted
    assert entries(cache) == [] and entries(tmp) == [], (entries(cache), entries(tmp))
