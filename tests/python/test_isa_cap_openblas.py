"""KILN_MAX_CPU_ISA caps OpenBLAS too: on an AVX-512 CPU, a cap to AVX2 or below loads OpenBLAS's
kernels of that level (OPENBLAS_CORETYPE set before the library loads), so the ISA switch tests
the AVX2 path of the whole GEMM stack, not only kiln's own kernels; a user's OPENBLAS_CORETYPE wins."""
import json
import os
import subprocess
import sys

import pytest

from kiln import _gemm_cache

HAS_AVX512 = "avx512f" in _gemm_cache._cpu_flags()
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def loaded_core(**env):
    code = "import json, kiln; print(json.dumps([kiln._C.build_info()['blas_core'], kiln.gemm_select.coretype_set()]))"
    full = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"), KILN_GEMM_CALIBRATION="off", **env)
    full.pop("OPENBLAS_CORETYPE", None) if "OPENBLAS_CORETYPE" not in env else None
    r = subprocess.run([sys.executable, "-c", code], env=full, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_cap_maps_to_openblas_cores(monkeypatch):
    monkeypatch.setattr(_gemm_cache, "_cpu_flags", lambda: {"avx2", "avx512f"})
    for cap, core in [("avx2", "Haswell"), ("AVX2_VNNI", "Haswell"), ("avx", "Sandybridge"), ("sse41", "Nehalem"),
                      ("avx512_core", None), ("", None)]:
        monkeypatch.setenv("KILN_MAX_CPU_ISA", cap)
        assert _gemm_cache.isa_cap_coretype() == core, cap
    monkeypatch.setattr(_gemm_cache, "_cpu_flags", lambda: {"avx2"})  # no AVX-512: OpenBLAS's own choice stands
    monkeypatch.setenv("KILN_MAX_CPU_ISA", "avx2")
    assert _gemm_cache.isa_cap_coretype() is None


@pytest.mark.skipif(not HAS_AVX512, reason="the cap changes OpenBLAS's kernels only on an AVX-512 CPU")
def test_avx2_cap_loads_haswell_kernels():
    assert loaded_core(KILN_MAX_CPU_ISA="avx2") == ["Haswell", "Haswell"]


@pytest.mark.skipif(not HAS_AVX512, reason="the cap changes OpenBLAS's kernels only on an AVX-512 CPU")
def test_users_coretype_wins_over_the_cap():
    core, set_by_kiln = loaded_core(KILN_MAX_CPU_ISA="avx2", OPENBLAS_CORETYPE="Sandybridge")
    assert core == "Sandybridge" and set_by_kiln is None
