#!/usr/bin/env bash
# Builds kiln if needed and runs the benchmark (pass --quick for a shorter run).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$(nproc)" >/dev/null
PYTHONPATH=python python3 bench/bench_core.py "$@"
PYTHONPATH=python python3 bench/bench_jit.py "$@"
