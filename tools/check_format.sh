#!/usr/bin/env bash
# Checks that the C++ files a change touched follow .clang-format.
#   tools/check_format.sh            files changed since the commit in .ci/format-base, with
#                                    what is staged, modified or untracked (not ignored) now
#   tools/check_format.sh BASE       files changed since BASE (a commit)
#   tools/check_format.sh --fix ...  rewrite them instead of checking
# Exit 0 when every file is formatted, 1 naming the files that are not (with the first
# differing lines), 2 on bad usage or a missing clang-format.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
fix=0
if [[ "${1:-}" == "--fix" ]]; then fix=1; shift; fi
base="${1:-$(cat .ci/format-base 2>/dev/null || true)}"
command -v clang-format >/dev/null || { echo "check_format: clang-format is not installed (tools/setup.sh installs it)" >&2; exit 2; }
if [[ -z "$base" ]]; then echo "check_format: no base commit (give one, or write it to .ci/format-base)" >&2; exit 2; fi
if git cat-file -e "$base^{commit}" 2>/dev/null; then
  mapfile -t files < <(git diff --name-only --diff-filter=ACMR "$base" HEAD -- '*.cpp' '*.hpp' '*.cu' '*.cuh'
                       git diff --name-only --diff-filter=ACMR HEAD -- '*.cpp' '*.hpp' '*.cu' '*.cuh'
                       git ls-files --others --exclude-standard -- '*.cpp' '*.hpp' '*.cu' '*.cuh')
  what="changed since $(git rev-parse --short "$base")"
else
  # A shallow clone without the base: the last commit's files, said so.
  mapfile -t files < <(git diff-tree --no-commit-id --name-only --diff-filter=ACMR -r HEAD -- '*.cpp' '*.hpp' '*.cu' '*.cuh')
  what="of the last commit (base $base is not in this clone)"
fi
mapfile -t files < <(printf '%s\n' "${files[@]}" | sort -u | while read -r f; do [[ -n "$f" && -f "$f" ]] && echo "$f"; done)
if ((${#files[@]} == 0)); then echo "check_format: no C++ files $what"; exit 0; fi
if ((fix)); then
  clang-format -i "${files[@]}"
  echo "check_format: formatted ${#files[@]} file(s) $what"
  exit 0
fi
bad=()
for f in "${files[@]}"; do
  if ! diff -q "$f" <(clang-format "$f") >/dev/null; then
    bad+=("$f")
    { diff -u "$f" <(clang-format "$f") || true; } | sed -n '3,12p' | sed "s|^|  $f: |" >&2
  fi
done
if ((${#bad[@]})); then
  echo "check_format: ${#bad[@]} of ${#files[@]} C++ file(s) $what do not follow .clang-format: ${bad[*]}" >&2
  echo "check_format: run tools/check_format.sh --fix" >&2
  exit 1
fi
echo "check_format: ${#files[@]} C++ file(s) $what follow .clang-format"
