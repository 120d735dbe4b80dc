#!/usr/bin/env bash
# Builds everything and runs all the tests: the C tests (also under AddressSanitizer and
# UndefinedBehaviorSanitizer), the graph text parser's fuzzer for 60 seconds and the Python tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
python3 tools/check_layers.py  # layers include only downward, no folder or import cycles (ARCHITECTURE.md)

jobs=$(nproc)
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$jobs"
(cd build && ctest --output-on-failure -j "$jobs")

# the C tests again under the sanitizers (no Python extension in this build)
cmake -S . -B build-sanitize -DKILN_SANITIZE=ON -DKILN_PYTHON=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build-sanitize -j "$jobs"
(cd build-sanitize && ASAN_OPTIONS=detect_leaks=1 LSAN_OPTIONS=suppressions=$PWD/../tests/c/lsan.supp \
  UBSAN_OPTIONS=print_stacktrace=1 ctest --output-on-failure -j "$jobs")

# the graph text parser under libFuzzer (clang, ASan + UBSan, leak detection) for a minute; the
# fixed seed replays the same mutations (how far it gets depends on the machine's speed)
KILN_FUZZ_SEED=1 bash scripts/fuzz.sh 60

PYTHONPATH=python python3 -m pytest -q tests/python
