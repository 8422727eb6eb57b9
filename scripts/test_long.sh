#!/usr/bin/env bash
# make test-long: what is too long for make test (RELIABILITY.md records the results).
# 1. the tests marked `long` (pytest -m long); 2. many-round verifies of every sink and source,
# each into build/long/<name> (report.html, report.json), and of a user-style pipeline
# (verify --pipeline) per sink; 3. the Spark versions smoke suite (scripts/spark_versions.sh). PostgreSQL sinks run when
# ONCEFLOW_PG_DSN names a database verify may create schemas in. Exit 1 at the first failure.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=build/long
mkdir -p "$OUT"
step() { echo "== $*"; }
step "pytest -m long"
"$PY" -m pytest -q -p no:cacheprovider -m long tests || [[ $? == 5 ]]   # 5: none selected
verify() {
  local name=$1; shift
  step "onceflow verify $* --report $OUT/$name"
  rm -rf "${OUT:?}/$name"
  .venv/bin/onceflow verify "$@" --report "$OUT/$name"
}
verify sqlite --rounds 40 --seed 16 --sink sqlite
verify delta --rounds 40 --seed 16 --sink delta
verify sqlite-tasks --rounds 40 --seed 16 --sink sqlite-tasks   # every batch through Spark's tasks
verify delta-tasks --rounds 20 --seed 16 --sink delta-tasks
verify http --rounds 20 --seed 17 --sink http
verify http-tasks --rounds 20 --seed 17 --sink http-tasks   # every batch's calls from Spark's tasks
verify kafka --rounds 20 --seed 18 --source kafka
verify kafka-sink --rounds 20 --seed 22 --sink kafka
verify kafka-tasks --rounds 40 --seed 16 --sink kafka-tasks  # every batch produced by Spark's tasks
verify kafka-kafka --rounds 12 --seed 23 --source kafka --sink kafka
verify ingest --ingest --rounds 16 --seed 15 --faults all
# a user-style pipeline (tests/verify/pipelines/orders.py, judged by the pipeline oracle) per sink
rm -rf "$OUT/orders-sample"
"$PY" -c "from pathlib import Path; from tests.verify.pipelines import sample; \
sample.write(Path('$OUT/orders-sample'), files=8, per_file=1500, seed=21)"
ORDERS=(--pipeline tests/verify/pipelines/orders.py:build --input "$OUT/orders-sample" --rounds 40 --seed 21)
verify orders-sqlite "${ORDERS[@]}" --sink sqlite
verify orders-delta "${ORDERS[@]}" --sink delta
# a pipeline of two sinks (sums in a database, orders in a lake): one source, one checkpoint
TWO=(--pipeline tests/verify/pipelines/orders_two_sinks.py:build --input "$OUT/orders-sample" --rounds 20
     --seed 25)
verify two-sinks-sqlite-iceberg "${TWO[@]}" --sink sqlite+iceberg
# the payments example with every fault kind, and its negative control (must exit 1)
rm -rf "$OUT/payments-sample"
"$PY" -m onceflow.examples.payments generate --out "$OUT/payments-sample" --payments 30000 >/dev/null
PAYMENTS=(--pipeline src/onceflow/examples/payments.py:build --input "$OUT/payments-sample" --seed 22)
verify payments-sqlite "${PAYMENTS[@]}" --rounds 9 --sink sqlite
step "onceflow verify ${PAYMENTS[*]} --rounds 2 --faults crash_after_sink_commit --sink naive (must fail)"
if .venv/bin/onceflow verify "${PAYMENTS[@]}" --rounds 2 --faults crash_after_sink_commit --sink naive \
    --report "$OUT/payments-naive"; then
  echo "== the negative control passed: verify missed its duplicates"; exit 1
fi
if [[ -n "${ONCEFLOW_PG_DSN:-}" ]]; then
  verify orders-postgres "${ORDERS[@]}" --sink postgres
  verify two-sinks-postgres-delta "${TWO[@]}" --sink postgres+delta-tasks
  for sink in postgres postgres-tasks postgres-staged postgres-2pc; do
    verify "$sink" --rounds 40 --seed 16 --sink "$sink"
  done
  # a Real-Time Mode pipeline (tests/verify/pipelines/auths.py: onceflow.write_realtime)
  "$PY" -c "from pathlib import Path; from tests.verify.pipelines import auths; \
auths.write_records(Path('$OUT/auths.jsonl'), 6000, seed=24)"
  verify realtime --pipeline tests/verify/pipelines/auths.py:build --input "$OUT/auths.jsonl" \
    --source kafka --sink realtime --rounds 40 --seed 24
else
  echo "== ONCEFLOW_PG_DSN not set: the PostgreSQL sinks' long verifies are left out"
fi
# the smoke suite on the other PySpark versions onceflow supports (docs/install.md)
step "bash scripts/spark_versions.sh 4.1.4 4.2.1"
bash scripts/spark_versions.sh 4.1.4 4.2.1
echo "== test-long: every run OK"
