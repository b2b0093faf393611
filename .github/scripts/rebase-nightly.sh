#!/usr/bin/env bash
# The nightly rebase job's logic, outside the workflow YAML so tests can run it
# (tests/test_nightly_workflow.py runs it against real temporary repositories).
#
# Run from the toolkit's root. It opens a new release line: the newest line
# (lines/<release>/) rebased onto the newest vLLM release on the package index
# that no line has yet (`smla lines --newer-releases`), or onto ONTO_INPUT.
# `smla rebase` checks the result itself (imports, selector, the CPU suite on
# the new line). Calls the smla CLI directly: `make rebase` cannot report a
# conflict (make exits 2 whenever a recipe fails, whatever its code).
#
# Environment:
#   ONTO_INPUT   a release version given by hand (workflow_dispatch); empty = the newest new release
#   SMLA         the smla command (default .venv/bin/smla; the workflow runs `make venv` first)
#   REPORT_DIR   where smla writes rebase-report.{json,md,txt} (default reports/nightly)
#   GITHUB_OUTPUT, RUNNER_TEMP   as on GitHub Actions
# Outputs (to $GITHUB_OUTPUT): onto (empty: no new release), from (the line rebased), rc (smla's
#   exit code: 0 clean, 11 conflict, 13 replayed but semantically broken), draft (true|false),
#   title, body (path of the PR body).
# Exit status: 0 for a clean, checked new line or no new release; otherwise non-zero, loudly:
#   11 (conflict) and 13 (broken) after the draft PR's body is written (the workflow still opens
#   the draft), smla's code for any other failure, 2 for a bad target.
set -uo pipefail

SMLA=${SMLA:-.venv/bin/smla}
REPORT_DIR=${REPORT_DIR:-reports/nightly}
: "${GITHUB_OUTPUT:?GITHUB_OUTPUT must name a file}"
: "${RUNNER_TEMP:?RUNNER_TEMP must name a directory}"

out() { printf '%s=%s\n' "$1" "$2" >> "$GITHUB_OUTPUT"; }

# 1. the target: a release version, nothing else; none given: the newest release newer than every line
onto=${ONTO_INPUT:-}
if [ -z "$onto" ]; then
  releases=$($SMLA lines --newer-releases) || { rc=$?; echo "cannot list vLLM releases (exit $rc)" >&2; exit "$rc"; }
  onto=$(printf '%s\n' "$releases" | tail -n 1)
  if [ -z "$onto" ]; then
    echo "no vLLM release newer than every line: nothing to do"
    out onto ""
    exit 0
  fi
fi
if ! printf '%s' "$onto" | grep -Eq '^[0-9]+(\.[0-9]+)+$'; then
  echo "not a release version: '$onto'" >&2
  exit 2
fi
out onto "$onto"
from=$(ls lines | grep -E '^[0-9]' | sort -V | tail -n 1)
out from "$from"

# 2. the rebase: opens lines/$onto/ from the newest line and checks it (0 clean, 11 conflict, 13 broken)
$SMLA --line "$from" rebase --onto "$onto" --report-dir "$REPORT_DIR"
rc=$?
out rc "$rc"
if [ "$rc" != 0 ] && [ "$rc" != 11 ] && [ "$rc" != 13 ]; then
  echo "smla rebase failed with exit code $rc (not a conflict, not a broken result)" >&2
  exit "$rc"
fi

# 3. the pull request: title, draft flag, body
case "$rc" in
  0) draft=false; title="Open the vLLM $onto line (from $from)" ;;
  11) draft=true; title="Rebase CONFLICT: vLLM $from line onto $onto" ;;
  13) draft=true; title="Rebase BROKEN: vLLM $from line onto $onto replays but fails its checks" ;;
esac
body="$RUNNER_TEMP/pr-body.md"
{
  cat "$REPORT_DIR/rebase-report.md"
  echo
  case "$rc" in
    11) echo "Conflict: no line opened. Reproduce locally with"
        echo "\`smla --line $from rebase --onto $onto\`, resolve, then \`smla rebase --continue\`." ;;
    13) echo "The new line lines/$onto/ replays but is broken (see the semantic check above):"
        echo "fix the series in work/$onto/vllm, \`smla --line $onto export\`, then \`make test VLLM=$onto\`." ;;
  esac
} > "$body"
mkdir -p reports
cp "$REPORT_DIR/rebase-report.md" reports/rebase-nightly.md
if [ "$rc" = 11 ]; then  # no half-opened line in the PR: undo the stopped rebase (its report is kept above)
  $SMLA --line "$onto" rebase --abort --report-dir "$RUNNER_TEMP/abort" > /dev/null || exit $?
fi
out draft "$draft"
out title "$title"
out body "$body"
if [ "$rc" != 0 ]; then
  echo "rebase of the $from line onto vLLM $onto: exit $rc (11 conflict, 13 broken); draft PR body written" >&2
fi
exit "$rc"
