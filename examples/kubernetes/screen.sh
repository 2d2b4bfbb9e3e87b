#!/usr/bin/env bash
# The command of the Kubernetes Job in tuner-screen-job.yaml: screen every GPU the pod was given against the fleet's
# reference, print the verdict document on stdout (collected with `kubectl logs`) and, when a results volume is
# mounted, write it there as NODE.json; exit with tuner screen's code (0 pass, 1 fail, 10 retest, 11
# incomparable; docs/screen.md), which the Job's podFailurePolicy reads. With TUNER_CORDON=1 and kubectl in the
# image (and RBAC to patch nodes), a node whose cards did not pass is cordoned.
#
# Environment: NODE_NAME (the Job sets it from spec.nodeName), TUNER_REFERENCE (/reference/fleet.ref), TUNER_TIER
# (quick), TUNER (tuner), TUNER_GLOBAL_ARGS ("--simulate" on a machine without GPUs), TUNER_SCREEN_ARGS,
# TUNER_RESULTS (/results), KUBECTL (kubectl).
set -u

REFERENCE=${TUNER_REFERENCE:-/reference/fleet.ref}
TIER=${TUNER_TIER:-quick}
TUNER=${TUNER:-tuner}
NODE=${NODE_NAME:-$(hostname)}
RESULTS=${TUNER_RESULTS:-/results}

out=$(mktemp)
trap 'rm -f "$out"' EXIT
# shellcheck disable=SC2086
$TUNER ${TUNER_GLOBAL_ARGS:-} screen --reference "$REFERENCE" --device all --tier "$TIER" \
  ${TUNER_SCREEN_ARGS:-} --json --out "$out" > /dev/null
rc=$?

if [ -s "$out" ]; then
  cat "$out"
  if [ -d "$RESULTS" ]; then
    cp "$out" "$RESULTS/$NODE.json"
  fi
fi

if [ "$rc" -ne 0 ] && [ "${TUNER_CORDON:-0}" = 1 ]; then
  "${KUBECTL:-kubectl}" cordon "$NODE" >&2 || echo "screen.sh: could not cordon $NODE" >&2
fi
echo "screen.sh: node $NODE: tuner screen exit $rc" >&2
exit "$rc"
