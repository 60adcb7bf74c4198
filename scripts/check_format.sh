#!/usr/bin/env bash
# Checks that every C, C++ and CUDA file git tracks is as clang-format
# (.clang-format) writes it. Fix with: scripts/check_format.sh --fix
set -euo pipefail
cd "$(dirname "$0")/.."

command -v clang-format >/dev/null 2>&1 || {
  echo "check_format: clang-format not found (scripts/setup.sh installs it)" >&2
  exit 1
}
mapfile -t files < <(git ls-files '*.c' '*.cc' '*.h' '*.cu' '*.cuh')
if [[ ${1:-} == --fix ]]; then
  clang-format -i "${files[@]}"
  echo "check_format: formatted ${#files[@]} files"
  exit 0
fi
unformatted=()
for f in "${files[@]}"; do
  clang-format --dry-run --Werror "$f" >/dev/null 2>&1 || unformatted+=("$f")
done
if ((${#unformatted[@]})); then
  printf 'check_format: not as clang-format writes it (%s): run scripts/check_format.sh --fix\n' "$(clang-format --version)" >&2
  printf '  %s\n' "${unformatted[@]}" >&2
  exit 1
fi
echo "check_format: ${#files[@]} files as clang-format writes them"
