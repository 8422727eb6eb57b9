#!/usr/bin/env bash
# The Spark version smoke suite (make test-long; RELIABILITY.md records its results).
# For each PySpark VERSION given (default: 4.1.4 4.2.1 — 4.3 is make test's own), in a venv of its
# own (build/pyspark-VERSION/venv: pyspark==VERSION and onceflow built from this tree's files):
#   1. onceflow demo                       Example 5-1 into SQLite, checked by a plain Spark batch job
#   2. scripts/smoke_pipeline.py           the README's pipeline, SIGKILLed after a commit, restarted, exact
#   3. onceflow verify --rounds 1 --faults crash_after_sink_commit, one run per sink (sqlite, delta,
#      iceberg, kafka, http; postgres when ONCEFLOW_PG_DSN is set)
#   4. onceflow's id state store compiled for that Spark (else a session falls back to Spark's store)
#   5. Spark's own lake readers on the tables step 3 left: Iceberg's Spark runtime 4.1 on 4.1.x,
#      delta-spark 4.4.0 on 4.2.x (scripts/lake_readers.py: the same rows as pyiceberg / deltalake)
# Exit 1 at the first failure; every step's output in build/pyspark-VERSION/<step>.log.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
PYTHON=${PYTHON:-python3}
export SPARK_LOCAL_IP=${SPARK_LOCAL_IP:-127.0.0.1}
VERSIONS=("$@")
[[ ${#VERSIONS[@]} -gt 0 ]] || VERSIONS=(4.1.4 4.2.1)
SINKS=(sqlite delta iceberg kafka http)
[[ -n "${ONCEFLOW_PG_DSN:-}" ]] && SINKS+=(postgres)

step() { echo "== pyspark $1: $2"; }
for v in "${VERSIONS[@]}"; do
  dir="$ROOT/build/pyspark-$v"
  rm -rf "$dir"
  mkdir -p "$dir/src"
  git ls-files -z | xargs -0 tar -c | tar -x -C "$dir/src"   # this tree's files, as committed or edited
  step "$v" "install (log: $dir/install.log)"
  "$PYTHON" -m venv "$dir/venv" > "$dir/install.log" 2>&1
  "$dir/venv/bin/pip" install -q "pyspark[connect]==$v" >> "$dir/install.log" 2>&1
  "$dir/venv/bin/pip" install -q "$dir/src[postgres,delta,iceberg,kafka]" "pyspark[connect]==$v" \
    >> "$dir/install.log" 2>&1
  py="$dir/venv/bin/python"
  "$py" -c "import pyspark, sys; assert pyspark.__version__ == '$v', pyspark.__version__"
  step "$v" "onceflow's id state store compiles for this Spark"
  (cd "$dir" && "$py" -c "from onceflow.runtime import idstore; print(idstore.build())") > "$dir/idstore.log" 2>&1 \
    || { cat "$dir/idstore.log"; exit 1; }
  step "$v" "onceflow demo"
  (cd "$dir" && "$dir/venv/bin/onceflow" demo) > "$dir/demo.log" 2>&1 || { tail -40 "$dir/demo.log"; exit 1; }
  grep -q "user_counts: EXACT" "$dir/demo.log" && grep -q "global_counts: EXACT" "$dir/demo.log" \
    || { tail -20 "$dir/demo.log"; exit 1; }
  if grep -q "using Spark's state store" "$dir/demo.log"; then
    echo "== the demo fell back to Spark's state store:"; grep "using Spark's state store" "$dir/demo.log"; exit 1
  fi
  step "$v" "the README's pipeline, SIGKILLed after a commit and restarted"
  "$py" scripts/smoke_pipeline.py "$dir/smoke" > "$dir/smoke.log" 2>&1 || { tail -40 "$dir/smoke.log"; exit 1; }
  tail -1 "$dir/smoke.log"
  for sink in "${SINKS[@]}"; do
    step "$v" "onceflow verify --sink $sink --rounds 1 --faults crash_after_sink_commit"
    "$dir/venv/bin/onceflow" verify --sink "$sink" --rounds 1 --seed 1 --faults crash_after_sink_commit \
      --events-per-round 2000 --report "$dir/verify-$sink" > "$dir/verify-$sink.log" 2>&1 \
      || { tail -30 "$dir/verify-$sink.log"; exit 1; }
    grep "^OK" "$dir/verify-$sink.log"
  done
  case "$v" in  # 5. Spark's own lake readers on the tables the verify rounds left
    4.1.*)
      step "$v" "Iceberg's Spark runtime (iceberg-spark-runtime-4.1) reads onceflow's Iceberg tables"
      "$py" scripts/lake_readers.py iceberg "$dir/verify-iceberg/work/iceberg" > "$dir/readers.log" 2>&1 \
        || { tail -30 "$dir/readers.log"; exit 1; }
      tail -1 "$dir/readers.log";;
    4.2.*)
      step "$v" "delta-spark 4.4.0 reads onceflow's Delta tables (it pins pyspark 4.2.0: installed last)"
      "$dir/venv/bin/pip" install -q "delta-spark==4.4.0" >> "$dir/install.log" 2>&1
      "$py" scripts/lake_readers.py delta "$dir/verify-delta/work/delta" > "$dir/readers.log" 2>&1 \
        || { tail -30 "$dir/readers.log"; exit 1; }
      tail -1 "$dir/readers.log";;
  esac
done
echo "== spark versions: ${VERSIONS[*]} OK"
