"""What kiln runs on: kiln.show_config() and `python -m kiln`. The facts come from kiln._C
(include/kiln/config.h, src/codegen/codegen_info.h); this module only gathers and prints them."""
import os
import platform
import sys

from . import _C, gemm_select
from .version import __version__


def _codegen_check():
    """Compiles and runs a tiny generated kernel: (works, how it went)."""
    before = _C.codegen_stats()
    try:
        _C.codegen_selftest()
    except (RuntimeError, NotImplementedError) as e:
        return False, str(e)
    after = _C.codegen_stats()
    if after["compiles"] > before["compiles"]:
        return True, f"a test kernel compiled in {after['compile_seconds'] - before['compile_seconds']:.2f} s and ran"
    if after["disk_hits"] > before["disk_hits"]:
        return True, "a test kernel loaded from the disk cache and ran"
    return True, "a test kernel ran (already loaded in this process)"


def facts():
    """Every fact show_config prints, as a dict (strings, numbers, bools)."""
    build = _C.build_info()
    cc = _C.codegen_info()
    works, how = _codegen_check()
    try:
        entries, size = _C.codegen_cache()
        cache_error = None
    except RuntimeError as e:
        entries = size = None
        cache_error = str(e)
    try:
        import numpy
        numpy_version = numpy.__version__
    except ImportError:
        numpy_version = None
    return {
        "version": __version__, "python": platform.python_version(), "numpy": numpy_version,
        **build,
        "cpu_count": os.cpu_count(), "threads": _C.get_num_threads(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "onednn_max_cpu_isa": os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA"),
        "conv_block": _C.conv_block_size(), "isa_kernels": _C.isa_kernels(),
        "amp_path": amp_kernel_path(build["dnnl_isa"])[0], "amp_path_why": amp_kernel_path(build["dnnl_isa"])[1],
        "cc_command": cc["command"], "cc_identity": cc["identity"], "cc_flags": cc["flags"],
        "cc_works": works, "cc_check": how,
        "cache_dir": cc["cache_dir"], "cache_usable": cc["cache_usable"], "cache_entries": entries,
        "cache_bytes": size, "cache_error": cache_error,
        "gemm_source": gemm_select.describe()[0], "gemm_classes": gemm_select.describe()[1],
    }


# oneDNN instruction sets with bfloat16 arithmetic (avx512_core_fp16 is named as bf16 by oneDNN 2.x)
LOW_PRECISION_ISAS = ("avx512_core_bf16", "avx512_core_amx")


def amp_kernel_path(dnnl_isa=None):
    """How bfloat16/float16 products (kiln.amp: matmul, linear, bmm, conv2d and their gradients) run
    here: ("bf16", why) when bfloat16 products run oneDNN's bfloat16 matmul and convolution primitives
    (src/ops/gemm_bf16.h, conv_dnnl.c: bfloat16 operands, float32 sums, one rounding), else ("fp32",
    why): the fp32-compute fallback
    (operands converted to float32, float32 GEMM, results rounded once). float16 always takes the
    fallback: oneDNN 2.6 makes no float16 matmul on CPUs. oneDNN's instruction set (which
    KILN_MAX_CPU_ISA / ONEDNN_MAX_CPU_ISA cap) says whether the hardware path exists; where it does,
    KILN_BF16_GEMM=onednn|fallback or a measurement at the first bfloat16 product chooses."""
    isa = dnnl_isa or _C.build_info()["dnnl_isa"]
    info = _C.gemm_bf16_info()
    fp16 = "fp16: fp32-compute fallback (oneDNN 2.6 makes no float16 matmul on CPUs)"
    if info["path"]:
        convs = "convolutions too" if _C.amp_native()["bf16"] else "not convolutions (amp_native_allow(False))"
        return "bf16", (f"bf16: {info['path']} (bfloat16 operands, float32 sums, one rounding; {info['why']}; "
                        f"{convs}); {fp16}")
    if info["hardware"]:
        return "fp32", (f"bf16: fp32-compute fallback, oneDNN's instruction set {isa} has bf16 arithmetic but its "
                        f"bfloat16 matmul is not used ({info['why']}); {fp16}")
    return "fp32", (f"bf16: fp32-compute fallback: oneDNN's instruction set {isa} has no bf16/fp16 arithmetic: operands "
                    f"are converted to float32 and run the float32 kernels; {fp16}")


def plural(n, one, many):
    return f"{n} {one if n == 1 else many}"


def size_text(n):
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024


def show_config(file=None):
    """Prints what kiln runs on: version, build options, the CPU and its vector extensions,
    the instruction set kiln uses (KILN_MAX_CPU_ISA caps it) and the kernel variants it chose,
    threads, BLAS and oneDNN and what they chose, the GEMM provider per shape class, the C compiler of generated code (compiling a
    tiny kernel to see that it works) and the compile cache."""
    f = facts()
    cpu_only = sorted(set(f["cpu_isa"].split()) - set(f["build_isa"].split()))
    lines = [
        f"kiln {f['version']} (Python {f['python']}, NumPy {f['numpy'] or 'not installed'})",
        f"build:           {f['options']}",
        f"kernels use:     {f['build_isa'] or 'no vector extension'}",
        f"CPU:             {f['cpu_model'] or platform.machine()}, {f['cpu_count']} logical cores",
        f"CPU has:         {f['cpu_isa'] or '-'}"
        + (f" (not used by kiln's kernels: {' '.join(cpu_only)})" if cpu_only else ""),
        f"kiln uses:       instruction set {f['isa']}"
        + (f" (KILN_MAX_CPU_ISA={f['max_cpu_isa']}; the CPU's: {f['cpu_isa_level']})" if f["max_cpu_isa"] else "")
        + "; kernel variants " + ", ".join(f"{k} {v}" for k, v in sorted(f["isa_kernels"].items())),
        f"threads:         {f['threads']} (kiln.set_num_threads"
        + (f"; OMP_NUM_THREADS={f['omp_num_threads']}" if f["omp_num_threads"] else "") + ")",
        f"BLAS:            {f['blas_config']}; kernels for {f['blas_core']}",
        f"oneDNN:          {f['dnnl_version']}; instruction set {f['dnnl_isa']}"
        + (f" (ONEDNN_MAX_CPU_ISA={f['onednn_max_cpu_isa']})" if f["onednn_max_cpu_isa"] else "")
        + (f"; convolution layouts blocked by {f['conv_block']} channels" if f["conv_block"] else ""),
        f"float32 GEMM:    {f['gemm_source']}",
        *(f"  {c}" for c in f["gemm_classes"]),
        f"mixed precision: {f['amp_path']} path; {f['amp_path_why']}",
        f"generated code:  {f['cc_command']} = {f['cc_identity'] or 'does not run'}: "
        + ("works, " if f["cc_works"] else "FAILS: ") + f["cc_check"],
        f"  flags:         {f['cc_flags']}",
    ]
    if not f["cache_usable"]:
        lines.append(f"compile cache:   {f['cache_dir'] or '-'}: not usable, objects are built in a temporary "
                     "directory each time (it must be a directory of this user's that others cannot write)")
    elif f["cache_error"]:
        lines.append(f"compile cache:   {f['cache_error']}")
    else:
        entries = plural(f["cache_entries"], "entry", "entries")
        lines.append(f"compile cache:   {f['cache_dir']}: {entries}, {size_text(f['cache_bytes'])} "
                     "(python -m kiln --clear-cache empties it; KILN_CACHE_DIR moves it)")
    print("\n".join(lines), file=file or sys.stdout)


def clear_cache():
    """Deletes every entry of the compile cache; returns (entries, bytes) deleted."""
    return _C.codegen_cache(clear=True)
