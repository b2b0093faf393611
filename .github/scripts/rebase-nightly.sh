#!/usr/bin/env bash
# The nightly rebase job's logic, outside the workflow YAML so tests can run it
# (tests/test_nightly_workflow.py runs it against real temporary repositories).
#
# Run from the toolkit's root. Calls the smla CLI directly: `make rebase` cannot
# report a conflict (make exits 2 whenever a recipe fails, whatever its code).
#
# Environment:
#   ONTO_INPUT   target given by hand (workflow_dispatch); empty = tip of the pin repo's main
#   SMLA         the smla command (default .venv/bin/smla; the workflow runs `make venv` first)
#   SMLA_NIGHTLY_TEST_CMD   CPU tests after a clean rebase (default: make test)
#   REPORT_DIR   where smla writes rebase-report.{json,md,txt} (default reports/nightly)
#   GITHUB_OUTPUT, RUNNER_TEMP   as on GitHub Actions
# Outputs (to $GITHUB_OUTPUT): onto, rc (smla's exit code: 0 clean, 11 conflict),
#   tests (passed|failed|skipped), draft (true|false), title, body (path of the PR body).
# Exit status: 0 when a report for a pull request was produced (clean or conflict,
#   tests passed or not); smla's code for any other failure, 2 for a bad target.
set -uo pipefail

SMLA=${SMLA:-.venv/bin/smla}
TEST_CMD=${SMLA_NIGHTLY_TEST_CMD:-make test}
REPORT_DIR=${REPORT_DIR:-reports/nightly}
: "${GITHUB_OUTPUT:?GITHUB_OUTPUT must name a file}"
: "${RUNNER_TEMP:?RUNNER_TEMP must name a directory}"

out() { printf '%s=%s\n' "$1" "$2" >> "$GITHUB_OUTPUT"; }

# 1. the target: a 40-hex commit or a release version, nothing else
onto=${ONTO_INPUT:-}
if [ -z "$onto" ]; then
  repo=$(sed -n 's/^repo *= *//p' vllm-pin.txt)
  onto=$(git ls-remote -- "$repo" refs/heads/main | cut -f1)
fi
if ! printf '%s' "$onto" | grep -Eq '^([0-9a-f]{40}|[0-9]+(\.[0-9]+)+)$'; then
  echo "not a commit id or version: '$onto'" >&2
  exit 2
fi
out onto "$onto"

# 2. the rebase (the exit code matters: 0 clean, 11 conflict)
$SMLA rebase --onto "$onto" --source git --report-dir "$REPORT_DIR"
rc=$?
out rc "$rc"
if [ "$rc" != 0 ] && [ "$rc" != 11 ]; then
  echo "smla rebase failed with exit code $rc (not a conflict)" >&2
  exit "$rc"
fi

# 3. CPU tests on a clean rebase
tests=skipped
if [ "$rc" = 0 ]; then
  if bash -c "$TEST_CMD"; then tests=passed; else tests=failed; fi
fi
out tests "$tests"

# 4. the pull request: title, draft flag, body
if [ "$rc" = 0 ] && [ "$tests" = passed ]; then draft=false; else draft=true; fi
if [ "$rc" = 0 ]; then title="Rebase the series onto vLLM $onto"; else title="Rebase CONFLICT against vLLM $onto"; fi
body="$RUNNER_TEMP/pr-body.md"
{
  cat "$REPORT_DIR/rebase-report.md"
  echo
  if [ "$rc" = 0 ]; then
    echo "### CPU tests (\`$TEST_CMD\`): $tests"
  else
    echo "Conflict: pin and patches/ unchanged. Reproduce locally with"
    echo "\`smla rebase --onto $onto\`, resolve, then \`smla rebase --continue\`."
  fi
} > "$body"
mkdir -p reports
cp "$REPORT_DIR/rebase-report.md" reports/rebase-nightly.md
out draft "$draft"
out title "$title"
out body "$body"
exit 0
