#!/usr/bin/env bash
# Checks two layout rules of the library code (docs/design.md): every source file
# stays at MAX_LINES lines or fewer, and only the settings readers call getenv.
set -euo pipefail
cd "$(dirname "$0")/.."

MAX_LINES=600
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

long=()
for f in "${files[@]}"; do
  n=$(wc -l <"$f")
  ((n > MAX_LINES)) && long+=("  $f: $n lines")
done

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
if ((${#reads[@]})); then
  echo "check_layout: getenv outside the settings readers (${GETENV_ALLOWED[*]}); read the setting there, into options:"
  printf '%s\n' "${reads[@]}"
  status=1
fi
if ((status == 0)); then
  echo "check_layout: ${#files[@]} library files, none over $MAX_LINES lines, getenv only in ${GETENV_ALLOWED[*]}"
fi
exit "$status"
