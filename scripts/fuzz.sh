#!/usr/bin/env bash
# Builds the libFuzzer harnesses of tests/fuzz with clang, AddressSanitizer (leak detection on) and
# UndefinedBehaviorSanitizer, and runs each for as many seconds as asked (default 60): the graph
# text parser's from the seed corpus tests/fuzz/corpus, the model file loader's from
# tests/fuzz/corpus_model. Inputs it finds go to a
# temporary directory (the committed corpus is not changed); a crash, leak or failed check leaves
# its input in build-fuzz/ (crash-*, leak-*, ...) and fails the script.
#   bash scripts/fuzz.sh [seconds]
# KILN_FUZZ_SEED=N fixes libFuzzer's random seed (default 0: a new one each run); scripts/test.sh
# fixes it, so CI replays the same mutations and fails only on what the tree changed.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
jobs=$(nproc)

cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DKILN_FUZZ=ON -DKILN_SANITIZE=ON -DKILN_PYTHON=OFF \
  -DKILN_TESTS=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build-fuzz -j "$jobs" --target fuzz_graph_parse fuzz_model_load

# a dictionary of the text form's tokens: the keywords and every op name of the op table
dict=build-fuzz/graph_text.dict
{
  for t in graph subgraph return constant captured parameter float32 float64 float16 bfloat16 int32 int64 \
           int8 uint8 bool '%0' '%1' ': ' ' = ' ' {' '}' '(' ')' '[' ']' ', ' '; ' '  # ' '\x0A' \
           'graph<' ' >= ' '>(' s0 s1 '//' '*' '+' '-'; do
    printf '"%s"\n' "$t"
  done
  sed -n 's/^KILN_OP([A-Z0-9_]*, *"\([a-z0-9_]*\)".*/"\1("/p' src/ops/ops.def
} >"$dict"

found=$(mktemp -d)
found_model=$(mktemp -d)
trap 'rm -rf "$found" "$found_model"' EXIT
# both harnesses run even when the first fails; the script fails when either did
status=0
# the two fuzzers run side by side when there are two cores (each is one thread): a minute, not two
fuzz_parse() {
  ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 \
  LSAN_OPTIONS=suppressions=$PWD/tests/c/lsan.supp \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    build-fuzz/tests/fuzz/fuzz_graph_parse -max_total_time="$seconds" -seed="${KILN_FUZZ_SEED:-0}" ${KILN_FUZZ_RUNS:+-runs=$KILN_FUZZ_RUNS} -timeout=20 -rss_limit_mb=4096 \
    -dict="$dict" -artifact_prefix=build-fuzz/ -print_final_stats=1 "$found" tests/fuzz/corpus
}
fuzz_model() {
  ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 \
  LSAN_OPTIONS=suppressions=$PWD/tests/c/lsan.supp \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    build-fuzz/tests/fuzz/fuzz_model_load -max_total_time="$seconds" -seed="${KILN_FUZZ_SEED:-0}" ${KILN_FUZZ_RUNS:+-runs=$KILN_FUZZ_RUNS} -timeout=20 -rss_limit_mb=4096 \
    -artifact_prefix=build-fuzz/model- -print_final_stats=1 "$found_model" tests/fuzz/corpus_model
}
if [ "$jobs" -ge 2 ]; then
  logs=$(mktemp -d)
  trap 'rm -rf "$found" "$found_model" "$logs"' EXIT
  fuzz_parse >"$logs/parse.txt" 2>&1 &
  parse_pid=$!
  fuzz_model >"$logs/model.txt" 2>&1 || status=1
  wait "$parse_pid" || status=1
  echo "---- fuzz_graph_parse"; cat "$logs/parse.txt"
  echo "---- fuzz_model_load"; cat "$logs/model.txt"
else
  fuzz_parse || status=1
  fuzz_model || status=1
fi
exit $status
