#!/usr/bin/env bash
# Install undervolt-tuner system-wide, root-owned and not editable (docs/install.md):
#   - a venv in /opt/undervolt-tuner with this checkout's tuner (built as a wheel, not linked to the checkout) and
#     the torch build this machine's GPUs need (tuner/core/torch_build.py: NVIDIA -> CUDA, AMD -> ROCm, none ->
#     CPU; TUNER_TORCH=cpu|cuda|rocm|keep overrides, TUNER_TORCH_INDEX the index);
#   - the `tuner` group (who may use the root helper), /etc/tuner/profiles, /usr/local/bin/tuner (so `sudo tuner`
#     is found despite sudo's secure_path);
#   - the root helper's socket and service, the boot unit and the resume unit (tuner/core/system_units.py), enabled.
# Running it twice updates in place. --uninstall stops the helper, resets the cards and removes all of it (the
# profiles in /etc/tuner and the safety state in /var/lib/tuner are kept; --purge removes them too); it refuses
# while a bisect runs. --dry-run prints every file it would write and the torch build, and changes nothing.
#
# usage: sudo bash scripts/install-system.sh [--dry-run] [--uninstall [--purge]]
# exit codes: 0 done; 2 bad usage, no single torch build fits, or BIN_DIR/tuner is another program's;
#             3 not root; 4 no Python 3.11;
#             6 a bisect is in progress (--uninstall); 5 the cards could not be reset (--uninstall; nothing removed)
set -euo pipefail
umask 022

src="$(cd "$(dirname "$0")/.." && pwd)"
prefix="${TUNER_PREFIX:-/opt/undervolt-tuner}"
systemd_dir="${TUNER_SYSTEMD_DIR:-/etc/systemd/system}"
bin_link="${TUNER_BIN_DIR:-/usr/local/bin}/tuner"
profiles_dir="${TUNER_SYSTEM_PROFILES:-/etc/tuner/profiles}"
state_dir="/var/lib/tuner"
group="${TUNER_GROUP:-tuner}"
python="${PYTHON:-python3}"
units=(tuner-helper.socket tuner-helper.service tuner-apply.service tuner-resume.service)

mode=install dry=0 purge=0
for arg in "$@"; do
  case "$arg" in
    --dry-run) dry=1 ;;
    --uninstall) mode=uninstall ;;
    --purge) purge=1 ;;
    -h|--help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "install-system.sh: error: unknown option $arg (see --help)" >&2; exit 2 ;;
  esac
done
[ "$purge" = 0 ] || [ "$mode" = uninstall ] || { echo "install-system.sh: error: --purge goes with --uninstall" >&2; exit 2; }

say() { echo "install-system.sh: $*"; }
die() { echo "install-system.sh: error: $1" >&2; exit "$2"; }
run() { if [ "$dry" = 1 ]; then say "would run: $*"; else "$@"; fi; }
systemd_run_dir="${TUNER_SYSTEMD_RUN_DIR:-/run/systemd/system}"  # where a running systemd says so (sd_booted)
systemd_live() { [ -d "$systemd_run_dir" ] && command -v systemctl >/dev/null; }

"$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null \
  || die "needs Python 3.11 or newer as '$python' (set PYTHON=/path/to/python3.11)" 4
if [ "$dry" = 0 ] && [ "$(id -u)" != 0 ]; then
  die "needs root: run it with sudo (or --dry-run to see what it would do)" 3
fi

# --- uninstall --------------------------------------------------------------------------------------------------
if [ "$mode" = uninstall ]; then
  [ "$dry" = 0 ] || say "dry run: nothing is removed"
  if [ -x "$prefix/bin/python" ]; then
    "$prefix/bin/python" -P -m tuner.actions.system_install --check-idle || exit $?
  else
    say "no venv in $prefix (a half-installed system): no bisect can be running from it; cards are not reset here (a reboot puts them at stock)"
  fi
  # stopped (the helper gives the cards back) but still enabled: a reset that fails below removes nothing, so the
  # boot and resume units must still be there and enabled, and the helper listening again
  if systemd_live; then
    run systemctl stop "${units[@]}" || true
  fi
  if [ -x "$prefix/bin/tuner" ]; then
    if [ "$dry" = 1 ]; then
      say "would run: $prefix/bin/tuner reset --all"
    else
      rc=0
      "$prefix/bin/tuner" reset --all || rc=$?
      case "$rc" in
        0) say "every card is back at stock" ;;
        4) say "no supported GPU here: no card to reset" ;;
        *) ! systemd_live || systemctl start tuner-helper.socket || true
           die "could not reset the cards (exit $rc, above); nothing was removed: fix that and run --uninstall again" 5 ;;
      esac
    fi
  fi
  if systemd_live; then
    run systemctl disable "${units[@]}" || true
  fi
  for unit in "${units[@]}"; do
    [ ! -e "$systemd_dir/$unit" ] || run rm -f "$systemd_dir/$unit"
  done
  ! systemd_live || run systemctl daemon-reload
  if [ -L "$bin_link" ] && [ "$(readlink "$bin_link")" = "$prefix/bin/tuner" ]; then
    run rm -f "$bin_link"  # the link the install wrote (ln -sfn), dangling or not
  elif [ -L "$bin_link" ] || [ -e "$bin_link" ]; then
    say "kept $bin_link: not the link to $prefix/bin/tuner this installer writes (another program's)"
  fi
  created_group=0
  [ ! -f "$prefix/.created-group" ] || created_group=1
  [ ! -e "$prefix" ] || run rm -rf "$prefix"
  if [ "$created_group" = 1 ] && getent group "$group" >/dev/null; then run groupdel "$group"; fi
  if [ "$purge" = 1 ]; then
    run rm -rf "$profiles_dir" "$state_dir"
  else
    say "kept $profiles_dir (system profiles) and $state_dir (the machine's unsafe list): --purge removes them"
  fi
  say "uninstalled"
  exit 0
fi

# --- install ----------------------------------------------------------------------------------------------------
# BIN_DIR/tuner is this installer's link (ln -sfn replaces it on an update); another program's is never replaced
if { [ -L "$bin_link" ] || [ -e "$bin_link" ]; } && \
   ! { [ -L "$bin_link" ] && [ "$(readlink "$bin_link")" = "$prefix/bin/tuner" ]; }; then
  die "$bin_link is not the link to $prefix/bin/tuner this installer writes (another program's); nothing was changed: move it aside or set TUNER_BIN_DIR" 2
fi
choice="$(PYTHONPATH="$src" "$python" -S -m tuner.core.torch_build)" || exit 2
eval "$choice"  # build=, why=, index= (tuner/core/torch_build.py)
torch_from="${index:-PyPI}"

if [ "$dry" = 1 ]; then
  say "dry run: nothing is written"
  say "torch build: $build ($why) from $torch_from"
  if getent group "$group" >/dev/null; then say "group $group: exists"; else say "would create group: $group (groupadd --system $group)"; fi
  say "would write: $prefix/ (a venv, root-owned: $python -m venv; torch ($build); pip install $src[engine], not editable)"
  say "would write: $prefix/bin/tuner, $prefix/bin/tuner-helper (console scripts in that venv)"
  say "would write: $bin_link -> $prefix/bin/tuner"
  say "would write: $profiles_dir/ (directory, mode 0755)"
  for unit in "${units[@]}"; do say "would write: $systemd_dir/$unit"; done
  say "would run: systemctl daemon-reload; systemctl enable --now tuner-helper.socket; systemctl enable tuner-apply.service tuner-resume.service"
  echo
  PYTHONPATH="$src" "$python" -S -m tuner.core.system_units --print --dir "$systemd_dir" --prefix "$prefix" --group "$group"
  exit 0
fi

say "torch build: $build ($why) from $torch_from"
if [ ! -x "$prefix/bin/python" ]; then
  "$python" -m venv "$prefix"  # also repairs a half-installed prefix (a directory without its venv)
  say "created the venv $prefix"
fi
# the group after the venv, marked at once: --uninstall removes only a group marked as this install's, so a run
# that failed between the two must not leave one unmarked (the next run would find it and never mark it)
if ! getent group "$group" >/dev/null; then
  groupadd --system "$group"
  touch "$prefix/.created-group"
  say "created group $group"
fi
pip() { "$prefix/bin/python" -m pip --disable-pip-version-check -q "$@"; }
installed_build="$("$prefix/bin/python" -c 'import torch; print("rocm" if torch.version.hip else "cuda" if torch.version.cuda else "cpu")' 2>/dev/null || true)"
if [ "$build" != keep ] && [ "$installed_build" != "$build" ]; then
  args=("torch>=2.4")
  [ -z "$index" ] || args+=(--index-url "$index")
  [ -z "$installed_build" ] || args+=(--force-reinstall)  # another build is there: replace it
  pip install "${args[@]}"
  say "installed torch ($build)"
fi
pip install --upgrade "$src[engine]"
pip install --force-reinstall --no-deps "$src"  # this checkout's code even when its version did not change
chown -R root:root "$prefix"
chmod -R go-w "$prefix"
found="$("$prefix/bin/python" -P -c 'from tuner.core import root_owned as r; c, p = r.import_code(); f = r.first_writable(c, recursive=p); print(f"{f[0]} is {f[1]}" if f else "")')"
[ -z "$found" ] || die "$found after installing: the units would run it as root; check the directories above $prefix" 2

mkdir -p "$(dirname "$bin_link")" "$profiles_dir"
chmod 0755 "$profiles_dir"
ln -sfn "$prefix/bin/tuner" "$bin_link"
mkdir -p "$systemd_dir"
"$prefix/bin/python" -P -m tuner.core.system_units --write "$systemd_dir" --prefix "$prefix" --group "$group" >/dev/null
say "wrote ${units[*]} in $systemd_dir"
if systemd_live; then
  systemctl daemon-reload
  systemctl enable --now tuner-helper.socket
  systemctl enable tuner-apply.service tuner-resume.service
  say "enabled the helper's socket, the boot unit and the resume unit"
else
  say "systemd is not running here: enable them later with systemctl enable --now tuner-helper.socket; systemctl enable tuner-apply.service tuner-resume.service"
fi
say "installed $("$prefix/bin/tuner" --version) in $prefix; \`sudo tuner doctor\` checks the rest"
say "to tune as yourself: sudo usermod -aG $group ${SUDO_USER:-USER} (then log in again)"
