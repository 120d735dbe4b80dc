#!/usr/bin/env bash
# kiln's main job (README's second command): installs what it needs, builds kiln if needed and
# prints the tables of MindSpore's jit tutorial (python -m kiln.bench) for kiln eager, every
# kiln.jit variant and the peers that are installed. Arguments go to kiln.bench: --full for the
# tutorial's shapes, --smallest --peers none for a smoke test, --plot FILE.png, --help.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
python3 -c "import matplotlib" 2>/dev/null || python3 -m pip install -q --root-user-action=ignore matplotlib  # for --plot
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$(nproc)" >/dev/null
PYTHONPATH=python${PYTHONPATH:+:$PYTHONPATH} exec python3 scripts/kiln_bench.py "$@"  # = python3 -m kiln.bench
