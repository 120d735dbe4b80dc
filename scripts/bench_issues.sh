#!/usr/bin/env bash
# The per-issue micro-benchmarks (README's third command): builds kiln if needed and runs the
# benchmarks of every issue's targets (pass --quick for a shorter run). Each script prints its
# figures as ratios against references measured in the same run. kiln's main job, the
# tutorial's tables, is scripts/bench.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$(nproc)" >/dev/null
status=0  # a missed target does not stop the other benchmarks; the script exits 1 at the end
for b in core jit guards fusion attention flash infer basic_block_levels sink ast control_flow dynamic profile bytecode compile_time interrupt deploy memory fp_contract gemm_fusion kv_decode data zoo distributed; do
  PYTHONPATH=python python3 "bench/bench_$b.py" "$@" || status=1
done
# LlamaAttention at the seed's full size against PyTorch eager (about a minute; not with --quick)
if [[ " $* " != *" --quick "* ]]; then
  PYTHONPATH=python python3 bench/bench_attention_full.py || status=1
fi
exit $status
