"""Which library runs kiln's float32 GEMMs, per shape class: OpenBLAS's sgemm (the default) or
oneDNN's, chosen by a short measurement once per machine, and which OpenBLAS kernels (its AVX-512
or AVX2 core type) kiln loads. The C side (src/ops/gemm_select.c) keeps the table every kernel's
GEMM reads; this module fills it at import: from the calibration file (kiln._gemm_cache) when it is
valid for this machine, else by measuring (about a second) and writing the file.

Environment: KILN_GEMM_CALIBRATION=off skips all of it (OpenBLAS everywhere, nothing read or
written); KILN_GEMM_PROVIDER=openblas|onednn runs every class on that provider.
kiln.set_deterministic(True) runs every class on OpenBLAS while it is on.
"""
import json
import os
import subprocess
import sys
import time
import warnings

from . import _C
from . import _gemm_cache

# One product per shape class for the measurement (each of its class, see gemm_select.h)
SHAPES = {
    "small": (24, 24, 24), "small_m": (8, 512, 512), "small_n": (512, 8, 512), "deep": (64, 64, 1024),
    "tall": (1024, 128, 256), "wide": (128, 1024, 256), "square": (256, 256, 256),
}
# Another provider (or core type) replaces the default only when it is this much faster (noise)
MARGIN = 1.03
CORE_SHAPE = (512, 512, 512)

_state = {"source": "default", "coretype_set": None, "calibration": None}


def providers():
    return _C.gemm_providers()


def classes():
    return _C.gemm_classes()


def table(used=False):
    """{shape class: provider} as set, or (used=True) as run now (OpenBLAS everywhere while
    set_deterministic(True) is on)."""
    return _C.gemm_table(used)


def set_provider(cls, provider):
    """Runs every GEMM of shape class `cls` on `provider` from now on (both by name)."""
    _C.gemm_set_provider(cls, provider)


def class_of(m, n, k):
    """The shape class of an (m x k) @ (k x n) product."""
    return _C.gemm_class_of(m, n, k)


def source():
    """Where the table came from: "default", "env", "file", "measured"."""
    return _state["source"]


def coretype_set():
    """The OPENBLAS_CORETYPE kiln set before loading OpenBLAS (from the calibration), or None."""
    return _state["coretype_set"]


def calibration():
    """The calibration in effect (the file's content), or None."""
    return _state["calibration"]


def library_key():
    """The calibration file's key: the CPU, kiln, and the OpenBLAS and oneDNN builds."""
    info = _C.build_info()
    # OpenBLAS's configuration names the core type it loaded: left out, it is the file's choice
    blas = " ".join(w for w in info["blas_config"].split() if w != info["blas_core"])
    return {**_gemm_cache.cpu_key(), "blas": blas[:1000], "onednn": info["dnnl_version"][:1000]}


def _core_rate_child(coretype):
    """OpenBLAS's single-threaded GFLOP/s on CORE_SHAPE in a fresh process whose OPENBLAS_CORETYPE
    is `coretype` (None: unset), as (core name, GFLOP/s), or None when that fails."""
    if not sys.executable:
        return None
    env = dict(os.environ, KILN_GEMM_CALIBRATION="off", OMP_NUM_THREADS="1")
    env.pop("OPENBLAS_CORETYPE", None)
    if coretype:
        env["OPENBLAS_CORETYPE"] = coretype
    code = ("import importlib.util, json, sys\n"
            "spec = importlib.util.spec_from_file_location('kiln._C', sys.argv[1])\n"
            "C = importlib.util.module_from_spec(spec); spec.loader.exec_module(C)\n"
            "print(json.dumps([C.build_info()['blas_core'], C.gemm_rate('openblas', *map(int, sys.argv[2:5]), 1, "
            "int(sys.argv[5]), float(sys.argv[6]))]))\n")
    rounds, min_s = _core_rounds()
    try:
        r = subprocess.run([sys.executable, "-c", code, _C.__file__, *map(str, CORE_SHAPE), str(rounds), str(min_s)],
                           env=env, capture_output=True, text=True, timeout=60)
        core, rate = json.loads(r.stdout.strip().splitlines()[-1])
        return (str(core)[:100], float(rate)) if r.returncode == 0 and rate > 0 else None
    except (OSError, ValueError, IndexError, TypeError, subprocess.SubprocessError):
        return None


def _core_rounds():
    return 3, 0.02


def _measure_coretype():
    """(OPENBLAS_CORETYPE to set or None, {core name: GFLOP/s}): this process's core against
    the other choice (AVX2's Haswell when the library picked an AVX-512 one; the library's own
    choice when kiln set Haswell), on CPUs with AVX-512 only, and never when the user set
    OPENBLAS_CORETYPE."""
    here = _C.build_info()["blas_core"]
    user_set = "OPENBLAS_CORETYPE" in os.environ and _state["coretype_set"] is None
    if user_set or "avx512f" not in _C.build_info()["cpu_isa"].split():
        return None, {}
    if _gemm_cache.isa_cap_coretype():  # KILN_MAX_CPU_ISA chose it: nothing to measure
        return _gemm_cache.isa_cap_coretype(), {}
    rounds, min_s = _core_rounds()
    mine = _C.gemm_rate("openblas", *CORE_SHAPE, 1, rounds, min_s)
    other = _core_rate_child(None if _state["coretype_set"] else "Haswell")
    rates = {here: mine}
    if not other:
        return _state["coretype_set"], rates
    rates[other[0]] = other[1]
    if _state["coretype_set"]:  # running Haswell now: keep it unless the default beats it
        return (None if other[1] > mine * MARGIN else "Haswell"), rates
    return ("Haswell" if other[0] == "Haswell" and other[1] > mine * MARGIN else None), rates


def measure():
    """Times every provider on each class's product (single-threaded, as kiln runs GEMMs) and
    the OpenBLAS core types; returns the calibration (the file's content) without applying it."""
    cl = {}
    for name in classes():
        m, n, k = SHAPES[name]
        rates = {p: _C.gemm_rate(p, m, n, k, 1, 3, 0.004) for p in providers()}
        best = max(rates, key=rates.get)
        default = providers()[0]
        cl[name] = {"provider": best if rates[best] > rates[default] * MARGIN else default, "gflops": rates}
    coretype, core_rates = _measure_coretype()
    return {"format": _gemm_cache.FORMAT, "key": library_key(), "coretype": coretype,
            "coretype_gflops": core_rates, "classes": cl}


def apply(calib):
    """Sets the table from a calibration."""
    for name, entry in calib["classes"].items():
        _C.gemm_set_provider(name, entry["provider"])
    _state["calibration"] = calib


def reset():
    """OpenBLAS for every class (the table before any calibration)."""
    for name in classes():
        _C.gemm_set_provider(name, providers()[0])
    _state["source"], _state["calibration"] = "default", None


def calibrate(force=False, write=True):
    """Fills the table: the file's calibration when valid for this machine (unless force), else a
    new measurement, written to the file. Returns the calibration."""
    calib = None if force else _gemm_cache.read(library_key(), classes(), providers())
    _state["source"] = "file"
    if calib is None:
        t0 = time.perf_counter()
        calib = measure()
        calib["key"]["measured_s"] = f"{time.perf_counter() - t0:.3f}"
        if write and not _gemm_cache.write(calib):
            warnings.warn(f"kiln.gemm_select: cannot write {_gemm_cache.path()}: the GEMM providers will be measured "
                          "again at each start (set KILN_CACHE_DIR to a writable directory, or "
                          "KILN_GEMM_CALIBRATION=off)", _gemm_cache.GemmCalibrationWarning, stacklevel=2)
        _state["source"] = "measured"
    apply(calib)
    return calib


def startup(coretype_set):
    """At import (kiln/__init__.py): the environment's override, or the calibration. coretype_set:
    the OPENBLAS_CORETYPE value kiln set before loading the extension (None: none)."""
    _state["coretype_set"] = coretype_set
    forced = os.environ.get("KILN_GEMM_PROVIDER")
    if forced:
        if forced not in providers():
            raise ValueError(f"KILN_GEMM_PROVIDER={forced!r}: expected one of {', '.join(providers())}")
        for name in classes():
            _C.gemm_set_provider(name, forced)
        _state["source"] = "env"
        return
    if _gemm_cache.enabled():
        calibrate()


def describe():
    """Lines for `python -m kiln`: the provider per shape class, and where the table came from."""
    used, calib = table(used=True), calibration()
    lines = []
    for name in classes():
        text = f"{name} {used[name]}"
        if calib and name in calib["classes"]:
            rates = calib["classes"][name]["gflops"]
            text += " (" + ", ".join(f"{p} {g:.1f}" for p, g in sorted(rates.items())) + " GFLOP/s)"
        lines.append(text)
    how = {"default": "not calibrated (KILN_GEMM_CALIBRATION=off)", "env": "KILN_GEMM_PROVIDER",
           "file": f"calibration read from {_gemm_cache.path()}", "measured": f"measured, written to {_gemm_cache.path()}"}
    head = how[source()] + ("; pinned to OpenBLAS by set_deterministic(True)" if _C.gemm_pinned() else "")
    core = os.environ.get("OPENBLAS_CORETYPE")
    if calib and calib["coretype_gflops"]:
        head += "; OpenBLAS cores " + ", ".join(f"{c} {g:.1f}" for c, g in sorted(calib["coretype_gflops"].items())) \
            + " GFLOP/s" + (f", OPENBLAS_CORETYPE={core} set by kiln" if _state["coretype_set"] else "")
    return head, lines
