#!/usr/bin/env bash
# Builds everything and runs all the tests: the C tests (also under AddressSanitizer and
# UndefinedBehaviorSanitizer, and the bad-input sweep against the extension built so), the fuzzers of the graph text parser and the model loader (60 seconds
# each) and the Python tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh

jobs=$(nproc)
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$jobs"
# layers include, call (the linked symbols of the objects just built) and import only downward, no cycles
# (ARCHITECTURE.md)
python3 tools/check_layers.py --build build
(cd build && ctest --output-on-failure -j "$jobs")

# the C tests again under the sanitizers; the same build makes a second kiln._C beside a copy of the
# Python sources in build-sanitize/python, against which the bad-input sweep runs (ASan's runtime
# preloaded into Python, leaks not checked there; undefined behaviour and memory errors crash the
# case, which the sweep names)
rm -rf build-sanitize/python && mkdir -p build-sanitize/python && cp -r python/kiln build-sanitize/python/
rm -f build-sanitize/python/kiln/_C*.so && find build-sanitize/python -name __pycache__ -prune -exec rm -rf {} +
cmake -S . -B build-sanitize -DKILN_SANITIZE=ON -DKILN_PYTHON=ON -DKILN_PYTHON_OUTPUT_DIR="$PWD/build-sanitize/python/kiln" \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build-sanitize -j "$jobs"
(cd build-sanitize && ASAN_OPTIONS=detect_leaks=1 LSAN_OPTIONS=suppressions=$PWD/../tests/c/lsan.supp \
  UBSAN_OPTIONS=print_stacktrace=1 ctest --output-on-failure -j "$jobs")
LD_PRELOAD="$(gcc -print-file-name=libasan.so)" ASAN_OPTIONS=detect_leaks=0 \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 PYTHONPATH=build-sanitize/python \
  python3 -m pytest -q -p no:cacheprovider tests/python/test_bad_input_sweep.py

# the graph text parser and the model loader under libFuzzer (clang, ASan + UBSan, leak detection),
# a minute each; the fixed seed replays the same mutations (how far it gets depends on the machine's speed)
KILN_FUZZ_SEED=1 bash scripts/fuzz.sh 60

PYTHONPATH=python python3 -m pytest -q tests/python
