"""The GEMM calibration file: which provider runs each shape class of float32 GEMM on this machine
and which OpenBLAS core type (kiln.gemm_select measures both). Pure Python, no kiln._C: kiln's
__init__ reads it before the extension (and with it OpenBLAS) loads, to set OPENBLAS_CORETYPE.

The file lies beside the compile cache ($KILN_CACHE_DIR, default ~/.cache/kiln), named
<cache dir>-gemm.json, and is keyed by the CPU (model and instruction-set flags), kiln's version
and, once the extension is loaded, the OpenBLAS and oneDNN builds. It is read as a stranger's
input: anything but a small, well-formed file of the expected fields and values is ignored with a
GemmCalibrationWarning (the caller then measures again and rewrites it).
"""
import hashlib
import json
import math
import os
import platform
import stat
import tempfile
import warnings

from .version import __version__

FORMAT = 1
MAX_BYTES = 65536
# The OPENBLAS_CORETYPE values kiln may set: the AVX2 kernels (null: the library's own choice)
CORETYPES = ("Haswell",)
_TEXT_MAX = 1024
_ENV_OFF = ("0", "off", "no", "false")


class GemmCalibrationWarning(UserWarning):
    """The GEMM calibration file was unreadable or invalid and is ignored."""


def enabled():
    """False when KILN_GEMM_CALIBRATION is 0/off/no/false: no file read or written, no measuring,
    OpenBLAS for every class (CI's tests set it), or when KILN_GEMM_PROVIDER forces a provider."""
    return (os.environ.get("KILN_GEMM_CALIBRATION", "").strip().lower() not in _ENV_OFF
            and not os.environ.get("KILN_GEMM_PROVIDER"))


def path():
    """<compile cache dir>-gemm.json (-gemm-<cap>.json under an instruction-set cap), the compile
    cache's directory found as kiln._C finds it."""
    base = os.environ.get("KILN_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "kiln")
    # a capped instruction set times differently: its own file, so a capped run (the ISA tests)
    # does not make the next plain import measure again
    cap = "-".join(c for c in (os.environ.get(v, "").strip().lower()
                               for v in ("KILN_MAX_CPU_ISA", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA")) if c)
    cap = "".join(ch for ch in cap if ch.isalnum() or ch in "-_")[:64]
    return os.path.abspath(base).rstrip(os.sep) + "-gemm" + (f"-{cap}" if cap else "") + ".json"


def cpu_key():
    """{"cpu": model name, "cpu_flags": hash of the instruction-set flags, "kiln": version, "isa_cap":
    KILN_MAX_CPU_ISA / ONEDNN_MAX_CPU_ISA (a capped oneDNN times differently)}."""
    model = flags = None
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                k, _, v = line.partition(":")
                if k.strip() == "model name" and model is None:
                    model = v.strip()
                elif k.strip() == "flags" and flags is None:
                    flags = v.strip()
    except OSError:
        pass
    model = model or platform.processor() or platform.machine()
    flags = flags or ""
    digest = hashlib.sha256(" ".join(sorted(flags.split())).encode()).hexdigest()[:16]
    cap = "/".join(os.environ.get(v, "") for v in ("KILN_MAX_CPU_ISA", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA"))
    return {"cpu": model[:_TEXT_MAX], "cpu_flags": digest, "kiln": __version__, "isa_cap": cap[:_TEXT_MAX]}


def _bad(p, why):
    warnings.warn(f"GEMM calibration file {p}: {why}; ignored (measured again)", GemmCalibrationWarning,
                  stacklevel=3)
    return None


def _text(v):
    return isinstance(v, str) and len(v) <= _TEXT_MAX


def _rate(v):
    return type(v) in (int, float) and math.isfinite(v) and 0 < v < 1e7


def validate(data, key, classes=None, providers=None):
    """The reason `data` (a parsed file) is not a valid calibration for `key` (every field of key
    must match), or None when it is. With classes and providers (known once kiln._C is loaded), the
    table must name each class once with a known provider."""
    if not isinstance(data, dict):
        return "not a JSON object"
    if set(data) != {"format", "key", "coretype", "coretype_gflops", "classes"}:
        return f"fields {sorted(map(str, data))[:8]} are not format, key, coretype, coretype_gflops, classes"
    if data["format"] != FORMAT or type(data["format"]) is not int:
        return f"format {data['format']!r} is not {FORMAT}"
    k = data["key"]
    if not isinstance(k, dict) or not all(_text(x) and _text(y) for x, y in k.items()):
        return "key is not an object of short strings"
    for name, want in key.items():
        if k.get(name) != want:
            return f"made for another {name} ({str(k.get(name))[:80]!r}, here {want!r})"
    if data["coretype"] is not None and data["coretype"] not in CORETYPES:
        return f"coretype {str(data['coretype'])[:40]!r} is not one of {CORETYPES} or null"
    cg = data["coretype_gflops"]
    if not isinstance(cg, dict) or len(cg) > 8 or not all(_text(x) and _rate(y) for x, y in cg.items()):
        return "coretype_gflops is not an object of core type: GFLOP/s"
    cl = data["classes"]
    if not isinstance(cl, dict) or len(cl) > 64:
        return "classes is not an object"
    for name, entry in cl.items():
        if not _text(name) or not isinstance(entry, dict) or set(entry) != {"provider", "gflops"}:
            return f"class {str(name)[:40]!r} is not {{provider, gflops}}"
        if not _text(entry["provider"]) or not isinstance(entry["gflops"], dict) or len(entry["gflops"]) > 8:
            return f"class {name!r}: bad provider or gflops"
        if not all(_text(x) and _rate(y) for x, y in entry["gflops"].items()):
            return f"class {name!r}: gflops is not an object of provider: GFLOP/s"
        if providers is not None and (entry["provider"] not in providers
                                      or not set(entry["gflops"]) <= set(providers)):
            return f"class {name!r}: provider {entry['provider'][:40]!r} is not one of {tuple(providers)}"
    if classes is not None and set(cl) != set(classes):
        return f"classes {sorted(cl)[:8]} are not {sorted(classes)}"
    return None


def read(key, classes=None, providers=None, file=None):
    """The calibration in `file` (default path()) when valid for key, else None (a warning says
    why, unless the file does not exist)."""
    p = file or path()
    try:  # non-blocking: a FIFO put there must not hang the import
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        return None
    except OSError as e:
        return _bad(p, f"cannot be opened ({e.strerror})")
    try:
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                return _bad(p, "not a regular file")
            raw = f.read(MAX_BYTES + 1)
    except OSError as e:
        return _bad(p, f"cannot be read ({e.strerror})")
    if len(raw) > MAX_BYTES:
        return _bad(p, f"larger than {MAX_BYTES} bytes")
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        return _bad(p, f"not JSON ({str(e)[:80]})")
    why = validate(data, key, classes, providers)
    return _bad(p, why) if why else data


def write(data, file=None):
    """Writes data atomically (a temporary file renamed over it); False when that fails."""
    p = file or path()
    try:
        os.makedirs(os.path.dirname(p), mode=0o700, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".kiln-gemm-", dir=os.path.dirname(p))
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(data, f, indent=1, sort_keys=True)
            os.replace(tmp, p)
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError:
        return False
    return True


# OpenBLAS's core type for each KILN_MAX_CPU_ISA below AVX-512 (oneDNN's names, as src/core/cpu.c)
_CAP_CORES = {"sse41": "Nehalem", "avx": "Sandybridge", "avx2": "Haswell", "avx2_vnni": "Haswell"}


def _cpu_flags():
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                k, _, v = line.partition(":")
                if k.strip() == "flags":
                    return set(v.split())
    except OSError:
        pass
    return set()


def isa_cap_coretype():
    """The OpenBLAS core type KILN_MAX_CPU_ISA asks for: on an AVX-512 CPU (which OpenBLAS would
    run with its AVX-512 kernels) capped to AVX2 or below, the core of that level; else None."""
    cap = os.environ.get("KILN_MAX_CPU_ISA", "").strip().lower()
    return _CAP_CORES.get(cap) if cap in _CAP_CORES and "avx512f" in _cpu_flags() else None


def coretype_before_load():
    """The OPENBLAS_CORETYPE kiln sets before its extension loads: the core type KILN_MAX_CPU_ISA
    caps OpenBLAS to, else the cached choice for this CPU, or None (no file, another CPU,
    calibration off, or the user set OPENBLAS_CORETYPE)."""
    if "OPENBLAS_CORETYPE" in os.environ:
        return None
    capped = isa_cap_coretype()
    if capped or not enabled():
        return capped
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # warned about (and rewritten) once the extension is loaded
        data = read(cpu_key())
    return data["coretype"] if data else None
