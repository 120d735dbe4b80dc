#!/usr/bin/env bash
# Installs what kiln needs on a Debian machine; does nothing when it is already there.
set -euo pipefail

# clang, its sanitizer and libFuzzer runtimes and its OpenMP: the fuzz build (scripts/fuzz.sh);
# graphviz: SVG pictures of graphs (kiln.tools.draw), tested when dot is there
# openmpi-bin, libopenmpi-dev: the mpi communication backend (src/comm/mpi/, built when CMake finds
# MPI) and mpirun, which the distributed tests (tests/python/test_distributed_*.py) launch
apt_packages=(build-essential cmake libopenblas-dev libdnnl-dev clang libclang-rt-14-dev libomp-14-dev graphviz
              openmpi-bin libopenmpi-dev)
missing=()
for p in "${apt_packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing Debian packages: ${missing[*]}"
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${missing[@]}"
fi

python3 - <<'PY' || python3 -m pip install -q numpy pytest scikit-build-core
import importlib.util, sys
sys.exit(0 if all(importlib.util.find_spec(m) for m in ("numpy", "pytest", "scikit_build_core")) else 1)
PY

# scikit-learn: its bundled digits images train the LeNet5 example (examples/lenet_digits.py, tests/python/test_examples.py)
python3 - <<'PY' || python3 -m pip install -q scikit-learn
import importlib.util, sys
sys.exit(0 if importlib.util.find_spec("sklearn") else 1)
PY

# onnx and onnxruntime: the ONNX export is checked against ONNX Runtime (tests/python/test_onnx_export_values.py)
python3 - <<'PY' || python3 -m pip install -q onnx onnxruntime
import importlib.util, sys
sys.exit(0 if all(importlib.util.find_spec(m) for m in ("onnx", "onnxruntime")) else 1)
PY
