#!/usr/bin/env bash
# Checks the layout rules of the library code (docs/design.md): every source
# file stays at MAX_LINES lines or fewer and every function (lambdas too) at
# MAX_FUNCTION_LINES, and only the settings readers call getenv.
set -euo pipefail
cd "$(dirname "$0")/.."

MAX_LINES=500
MAX_FUNCTION_LINES=80
# Known to exceed a limit until they are split; nothing else may join them.
OVERSIZED=(
)
LIBRARY_DIRS=(comm ring fusion compression paramserver trainer capi launch)
# The settings readers: the only library files that may read the environment.
GETENV_ALLOWED=(
  comm/rendezvous/bootstrap.cc
)

dirs=()
for d in "${LIBRARY_DIRS[@]}"; do
  [[ -d $d ]] && dirs+=("$d")
done
mapfile -t files < <(find "${dirs[@]}" -type f \( -name '*.cc' -o -name '*.h' -o -name '*.cu' \) | sort)

oversized() {
  local o
  for o in "${OVERSIZED[@]}"; do [[ $1 == "$o" ]] && return 0; done
  return 1
}
long=()
checked=()
for f in "${files[@]}"; do
  oversized "$f" && continue
  checked+=("$f")
  n=$(wc -l <"$f")
  ((n > MAX_LINES)) && long+=("  $f: $n lines")
done
mapfile -t long_functions < <(python3 scripts/long_functions.py "$MAX_FUNCTION_LINES" "${checked[@]}")

allowed() {
  local a
  for a in "${GETENV_ALLOWED[@]}"; do [[ $1 == "$a" ]] && return 0; done
  return 1
}
reads=()
for f in "${files[@]}"; do
  allowed "$f" && continue
  while IFS= read -r hit; do
    reads+=("  $f:$hit")
  done < <(grep -n 'getenv[[:space:]]*(' "$f" || true)
done

status=0
if ((${#long[@]})); then
  echo "check_layout: ${#long[@]} library file(s) over $MAX_LINES lines; split them along their seams:"
  printf '%s\n' "${long[@]}"
  status=1
fi
if ((${#long_functions[@]})); then
  echo "check_layout: ${#long_functions[@]} function(s) over $MAX_FUNCTION_LINES lines; split them into named steps:"
  printf '%s\n' "${long_functions[@]}"
  status=1
fi
if ((${#reads[@]})); then
  echo "check_layout: getenv outside the settings readers (${GETENV_ALLOWED[*]}); read the setting there, into options:"
  printf '%s\n' "${reads[@]}"
  status=1
fi
if ((status == 0)); then
  echo "check_layout: ${#files[@]} library files, none over $MAX_LINES lines or with a function over" \
    "$MAX_FUNCTION_LINES (but ${#OVERSIZED[@]} known: ${OVERSIZED[*]}), getenv only in ${GETENV_ALLOWED[*]}"
fi
exit "$status"
