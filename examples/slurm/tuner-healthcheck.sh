#!/usr/bin/env bash
# Screen every GPU of this node against the fleet's portable reference; drain the node unless every card passes.
#
# As a Slurm HealthCheckProgram (slurm.conf):
#   HealthCheckProgram=/etc/slurm/tuner-healthcheck.sh
#   HealthCheckInterval=3600
#   HealthCheckNodeState=IDLE        # screen idle nodes only: a screen loads every GPU for the tier's time
# Slurm ignores a health check's exit code, so in that mode this script drains the node itself (scontrol), as NHC
# does. As a Prolog (Prolog=/etc/slurm/tuner-healthcheck.sh), a non-zero exit drains the node and requeues the job:
# the script only exits with the code (use the quick tier there: it delays every job by ~30 s per GPU run).
#
# tuner screen exit codes (the worst card decides; docs/screen.md):
#   0  pass          every card matched the reference bit for bit     -> node stays up
#   1  fail          a difference that repeated, or a hang             -> drain
#   10 retest        a difference that did not repeat                  -> screened once more here; drain if again
#   11 incomparable  driver, torch, model ... differ from the reference -> drain (the node left the fleet's stack)
#   2..9, 130        usage, permission, busy (another tuner on a card), disk full, interrupted -> drain
#
# Settings (environment): TUNER_REFERENCE (default /etc/tuner/fleet.ref), TUNER_TIER (quick), TUNER (the tuner
# command), TUNER_GLOBAL_ARGS (e.g. "--simulate" to try it on a simulated card), TUNER_SCREEN_ARGS (more screen
# options), TUNER_VERDICT_DIR (/var/lib/tuner/verdicts), SCONTROL (scontrol). Slurm sets SLURMD_NODENAME and, in a
# prolog, SLURM_JOB_ID / SLURM_SCRIPT_CONTEXT.
set -u

REFERENCE=${TUNER_REFERENCE:-/etc/tuner/fleet.ref}
TIER=${TUNER_TIER:-quick}
TUNER=${TUNER:-tuner}
SCONTROL=${SCONTROL:-scontrol}
NODE=${SLURMD_NODENAME:-$(hostname -s)}
DIR=${TUNER_VERDICT_DIR:-/var/lib/tuner/verdicts}
OUT="$DIR/screen-$NODE.json"

case "${SLURM_SCRIPT_CONTEXT:-}" in
  prolog*) MODE=prolog ;;
  *) if [ -n "${SLURM_JOB_ID:-}" ]; then MODE=prolog; else MODE=healthcheck; fi ;;
esac

mkdir -p "$DIR" || exit 1

screen() {
  # shellcheck disable=SC2086  # the global and extra arguments are words on purpose
  $TUNER ${TUNER_GLOBAL_ARGS:-} screen --reference "$REFERENCE" --device all --tier "$TIER" \
    ${TUNER_SCREEN_ARGS:-} --json --out "$OUT" > /dev/null 2>> "$DIR/screen-$NODE.log"
}

screen
rc=$?
if [ "$rc" -eq 10 ]; then  # retest: a fault that did not repeat gets one more screen before the node is drained
  screen
  rc=$?
fi

if [ "$rc" -eq 0 ]; then
  exit 0
fi

# one line for the drain reason: the summary and the first card that did not pass, from the verdict document
reason=$(python3 - "$OUT" "$rc" <<'PY' 2>/dev/null
import json, sys
try:
    doc = json.load(open(sys.argv[1]))
except (OSError, ValueError):
    print(f"tuner screen exit {sys.argv[2]} (no verdict written)")
    raise SystemExit
bad = next((c for c in doc["verdicts"] if c["verdict"] != "pass"), None)
text = f"tuner screen: {doc['summary']}"
if bad:
    text += f"; {bad['card']['id']} {bad['verdict']} ({bad['action']})"
    if bad["incomparable"]:
        text += ": " + ", ".join(d["field"] for d in bad["incomparable"])
print(text[:200])
PY
)
[ -n "$reason" ] || reason="tuner screen exit $rc"

if [ "$MODE" = healthcheck ]; then
  "$SCONTROL" update NodeName="$NODE" State=DRAIN Reason="$reason"
fi
echo "$reason" >&2
exit "$rc"
