"""The kernel-log watcher on a fed log, and the telemetry sampler's summary."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

from tuner.backends.simulated import SimulatedBackend
from tuner.core.models import Telemetry
from tuner.tuning import kernel_log
from tuner.tuning.sampler import TelemetrySampler, summarize

LOG = """\
[  100.000001] amdgpu 0000:03:00.0: amdgpu: SMU is initialized successfully!
[  201.123456] amdgpu 0000:03:00.0: amdgpu: ring gfx_0.0.0 timeout, signaled seq=7292300, emitted seq=7292304
[  201.123500] amdgpu 0000:03:00.0: amdgpu:  Process python pid 4242 thread python pid 4242
[  201.200000] amdgpu 0000:03:00.0: amdgpu: GPU reset begin!
[  202.000000] amdgpu 0000:03:00.0: amdgpu: VRAM is lost due to GPU reset!
[  202.100000] amdgpu 0000:04:00.0: amdgpu: MES failed to respond to msg=RESET
[  203.000000] amdgpu: [gfxhub] page fault (src_id:0 ring:24 vmid:3 pasid:32772)
[  204.000000] NVRM: Xid (PCI:0000:2b:00): 13, pid=1234, name=python, Graphics Exception
[  205.000000] usb 1-1: new high-speed USB device number 3 using xhci_hcd
"""


def fed_source(lines, started: threading.Event, release: threading.Event):
    def source():
        def gen():
            started.set()
            release.wait(5)
            yield from lines
        return gen(), lambda: None
    return source


def test_watcher_counts_only_gpu_failures_of_the_watched_card():
    started, release = threading.Event(), threading.Event()
    seen = []
    watcher = kernel_log.KernelLogWatcher("0000:03:00.0", on_event=seen.append,
                                          source=fed_source(LOG.splitlines(), started, release)).start()
    assert watcher.available
    release.set()
    deadline = time.monotonic() + 5
    while len(watcher.events) < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    events = watcher.stop()
    kinds = [e.kind for e in events]
    # other cards' messages (04:00.0, the NVIDIA 2b:00) are ignored; lines without a PCI address count
    assert kinds == ["ring-timeout", "gpu-reset", "vram-lost", "page-fault"]
    assert [e.edge for e in events] == [False, True, True, False]
    assert seen == events
    assert "ring-timeout" in kernel_log.summarize(events)


def test_xid_79_is_an_edge_and_other_nvidia_cards_are_ignored():
    line = "NVRM: Xid (PCI:0000:2b:00): 79, pid=0, GPU has fallen off the bus."
    assert kernel_log.classify_line(line, "00000000:2B:00.0").kind == "fallen-off-bus"
    assert kernel_log.classify_line(line, "00000000:2C:00.0") is None
    assert kernel_log.classify_line(LOG.splitlines()[7]).xid == 13


def test_unreadable_log_degrades_with_one_warning():
    warnings = []
    watcher = kernel_log.KernelLogWatcher(warn=warnings.append, source=lambda: None).start()
    assert not watcher.available and len(warnings) == 1 and "kernel log" in warnings[0]
    assert watcher.stop() == []


def test_messages_before_start_do_not_count():
    watcher = kernel_log.KernelLogWatcher(source=lambda: None)
    assert watcher.events == []
    watcher.feed("[ 1.0] amdgpu 0000:03:00.0: amdgpu: GPU reset begin!")
    assert [e.kind for e in watcher.events] == ["gpu-reset"]


def test_previous_boot_reader_filters_failures_and_handles_no_journal(monkeypatch):
    monkeypatch.setattr(kernel_log.shutil, "which", lambda exe: "/usr/bin/journalctl")
    ok = SimpleNamespace(returncode=0, stdout=LOG)
    lines = kernel_log.previous_boot_events("0000:03:00.0", run=lambda *a, **k: ok)
    assert len(lines) == 4 and "ring gfx_0.0.0 timeout" in lines[0]
    missing = SimpleNamespace(returncode=1, stdout="")
    assert kernel_log.previous_boot_events(run=lambda *a, **k: missing) is None


def test_sampler_summary_energy_and_temperatures():
    backend = SimulatedBackend(vmin_mv=-52)
    sampler = TelemetrySampler(backend, "sim0", interval_s=0.01)
    for _ in range(3):
        sampler.sample_once()
    summary = sampler.stop()  # never started: the summary of the samples taken by hand
    assert len(sampler.samples) == 3 and summary.mean_power_w > 0 and summary.max_temp_c >= summary.max_temp_edge_c
    samples = [Telemetry(time_s=t, power_w=100.0, temp_edge_c=50.0 + t) for t in range(5)]
    s = summarize(samples)
    assert s.energy_j == 400.0 and s.max_temp_edge_c == 54.0 and s.mean_power_w == 100.0
    sampler2 = TelemetrySampler(backend, "sim0", interval_s=0.01).start()
    time.sleep(0.05)
    sampler2.stop()
    assert len(sampler2.samples) >= 1


def test_kmsg_lines_reads_records_as_dev_kmsg_gives_them(monkeypatch):
    """/dev/kmsg as linux Documentation/ABI/testing/dev-kmsg describes it: one record per read(),
    `pri,seq,usec,flags;text` then indented key=value continuation lines; records overwritten while it was open make
    the next read() fail with EPIPE and reading goes on at the next record. Any other error ends the stream."""
    import errno
    import os

    r, w = os.pipe()
    os.write(w, b"x")  # always readable: select() says the fd is ready, the fake read below answers
    answers = [
        b"3,1201,5120391,-;amdgpu 0000:03:00.0: amdgpu: GPU reset begin!\n SUBSYSTEM=pci\n DEVICE=+pci:0000:03:00.0\n",
        OSError(errno.EPIPE, "Broken pipe"),
        b"4,1209,5120400,c;NVRM: Xid (PCI:0000:01:00): 79, GPU has fallen off the bus.\n",
        OSError(errno.EIO, "Input/output error"),
    ]
    real_read = os.read

    def kmsg_read(fd, n):
        if fd != r:
            return real_read(fd, n)
        answer = answers.pop(0)
        if isinstance(answer, OSError):
            raise answer
        return answer

    monkeypatch.setattr(kernel_log.os, "read", kmsg_read)
    lines = []
    try:
        for line in kernel_log.kmsg_lines(r, threading.Event()):
            lines.append(line)
        raise AssertionError("EIO did not end the stream")
    except OSError as e:
        assert e.errno == errno.EIO
    finally:
        os.close(r)
        os.close(w)
    assert lines == ["amdgpu 0000:03:00.0: amdgpu: GPU reset begin!",
                     "NVRM: Xid (PCI:0000:01:00): 79, GPU has fallen off the bus."]
