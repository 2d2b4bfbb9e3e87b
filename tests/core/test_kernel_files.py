"""The one reader of sysfs and proc files: regular files only, a size cap, a timeout (issue 28, item 8)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from tuner.core import kernel_files


def test_real_proc_files_read_though_they_report_size_0():
    """procfs files are regular files of size 0; the size says nothing about what a read returns."""
    path = Path("/proc/sys/kernel/random/boot_id")
    assert os.stat(path).st_size == 0
    text = kernel_files.read_text(path)
    assert len(text.strip()) == 36 and text.count("-") == 4


def test_a_real_sysfs_attribute_reads_though_it_reports_size_4096():
    candidates = [*Path("/sys/class/net").glob("*/address"), Path("/sys/kernel/profiling")]
    path = next((p for p in candidates if p.exists()), None)
    if path is None:
        pytest.skip("no readable sysfs attribute on this machine")
    assert os.stat(path).st_size == 4096
    assert kernel_files.read_text(path).strip()


def test_a_fifo_a_device_node_and_a_directory_are_refused_before_any_read(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    link = tmp_path / "zero"
    link.symlink_to("/dev/zero")
    for path, kind in ((fifo, "a FIFO"), (link, "a device node"), (tmp_path, "a directory")):
        with pytest.raises(kernel_files.NotAKernelFile, match=kind):
            kernel_files.read_bytes(path)


def test_more_than_the_cap_is_refused(tmp_path):
    big = tmp_path / "big"
    big.write_bytes(b"x" * 100)
    assert kernel_files.read_bytes(big, max_bytes=100) == b"x" * 100
    with pytest.raises(kernel_files.TooLarge):
        kernel_files.read_bytes(big, max_bytes=99)


def test_a_read_that_never_returns_times_out(tmp_path, monkeypatch):
    """A driver `show` that never answers (a hung GPU) or a blocking network file: given up after the timeout."""
    path = tmp_path / "attr"
    path.write_text("1\n")
    release = threading.Event()
    real_read = os.read

    def stuck_read(fd: int, n: int) -> bytes:
        release.wait(30)
        return real_read(fd, n)

    monkeypatch.setattr(kernel_files.os, "read", stuck_read)
    try:
        with pytest.raises(TimeoutError, match=r"no answer within 0\.2 s"):
            kernel_files.read_bytes(path, timeout_s=0.2)
    finally:
        release.set()


def test_the_boot_id_is_none_when_it_is_not_a_small_regular_file(boot):
    assert kernel_files.boot_id() == "boot-a"
    path = boot.root / kernel_files.BOOT_ID_PATH
    path.write_text("x" * 1000)
    assert kernel_files.boot_id() is None
    path.unlink()
    os.mkfifo(path)
    assert kernel_files.boot_id() is None


def test_a_process_start_time_is_field_22_of_its_stat_line(boot):
    # the command name (field 2) may hold spaces and parentheses: the fields are counted after its last ')'
    real = Path(f"/proc/{os.getpid()}/stat").read_text()
    fields = real.rpartition(")")[2]
    stat = boot.root / "proc/4242/stat"
    stat.parent.mkdir(parents=True)
    stat.write_text("4242 (a) b (c d)" + fields)
    assert kernel_files.process_start_ticks(4242) == int(fields.split()[19])
    assert kernel_files.process_start_ticks(4243) is None  # no such process
    for damaged in ("", "4242 (tuner) S 1 2 3", "4242 (tuner)" + fields.replace(fields.split()[19], "x", 1)):
        stat.write_text(damaged)
        assert kernel_files.process_start_ticks(4242) is None, damaged


def test_the_real_proc_gives_this_process_a_start_time_that_does_not_change(monkeypatch):
    monkeypatch.delenv("TUNER_SYSFS_ROOT", raising=False)
    first = kernel_files.process_start_ticks(os.getpid())
    assert first is not None and first >= 0 and kernel_files.process_start_ticks(os.getpid()) == first
