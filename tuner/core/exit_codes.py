"""Process exit codes, shared by every command and documented in `tuner --help` and the README."""

OK = 0
TEST_FAILED = 1  # a stability test (stress, bisect baseline, --verify) found the setting unstable
USAGE = 2  # bad input: unknown device, bad number, invalid profile; nothing was changed
PERMISSION = 3  # the OS refused (not root, file not writable, a read-only file system)
UNSUPPORTED = 4  # no supported GPU, or the feature is off/unsupported on this card or driver
HARDWARE = 5  # the device did not take the setting, or was lost; it was reset to stock where possible
BUSY = 6  # another tuner process is changing this card, or another tool that writes it runs; nothing was changed
DISK_FULL = 7  # a state or profile file could not be written (ENOSPC, EDQUOT); the card was reset where it was touched
NOT_CONFIRMED = 8  # a change was applied but not confirmed in time, so it was reverted
HELPER_UNREACHABLE = 9  # a write needs the root helper (docs/helper.md) and none answers, or it refuses this user
SCREEN_RETEST = 10  # tuner screen: a fault that did not repeat (or a screen that could not finish): run it again
SCREEN_INCOMPARABLE = 11  # tuner screen: a must-match field differs from the reference's; no bits were compared
INTERRUPTED = 130  # Ctrl-C / SIGTERM / SIGHUP; any unconfirmed change was reverted
CLOSED_PIPE = 141  # the reader of the output left (`| head`): 128 + SIGPIPE, as the shell reports it

EXIT_CODE_HELP = """\
exit codes:
  0    success
  1    stability test failed (stress, bisect baseline, apply --verify)
  2    bad input or usage; nothing was changed
  3    permission denied (writes need root), or a read-only or unwritable file
  4    unsupported hardware, driver or kernel setting (also: doctor found a failing check)
  5    the device did not take the setting or was lost (it was reset to stock where possible)
  6    the card is busy: another tuner process is changing it, or another tool that writes the same settings runs
       (LACT's lactd, CoreCtrl's helper, nvidia-powerd: bisect refuses beside it unless --ignore-other-tools);
       nothing was changed
  7    disk full: a state or profile file could not be written (free space, then resume or retry)
  8    not confirmed: the change was reverted (no yes within the keep-or-revert timeout)
  9    no helper: writes need the root helper (tuner-helper, docs/helper.md) or root; nothing was changed
  10   screen: retest (a fault that did not repeat, or the screen could not finish)
  11   screen: incomparable (the card or its software differs from the reference's; nothing compared)
  130  interrupted; any unconfirmed change was reverted
  141  the reader of the output left (e.g. `| head`); quiet, as for any command killed by SIGPIPE"""
