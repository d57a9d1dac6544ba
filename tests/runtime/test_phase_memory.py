"""Each phase's memory in a worker (harness/runtime/workers/phase_memory.py), measured for real on CPU."""

from __future__ import annotations

import resource

import torch

from harness.runtime.workers.phase_memory import GIB, PhaseMemory

MIB = 1024**2


def test_a_phase_reports_its_peak_and_what_it_left():
    memory = PhaseMemory("cpu", cpu_peaks=True)
    kept = []
    with memory.phase("train"):
        transient = torch.ones(256 * MIB // 4)  # 256 MiB, freed before the phase ends
        kept.append(torch.ones(64 * MIB // 4))  # 64 MiB, kept
        del transient
    report = memory.report()
    peak, after = report["perf/memory/train_peak_gib"] * GIB / MIB, report["perf/memory/train_after_gib"] * GIB / MIB
    assert peak >= 256 + 64 - 8, report  # both were alive at once (RSS pages: a few MiB of slack)
    assert 56 <= after <= peak - 200, report  # the transient went back, the kept tensor stayed
    assert memory.report() == {}  # reported once


def test_a_repeated_phase_keeps_its_largest_peak_and_its_last_after():
    memory = PhaseMemory("cpu", cpu_peaks=True)
    with memory.phase("sync"):
        big = torch.ones(192 * MIB // 4)
        del big
    with memory.phase("sync"):
        small = torch.ones(16 * MIB // 4)
        del small
    report = memory.report()
    assert report["perf/memory/sync_peak_gib"] * GIB / MIB >= 184, report
    assert report["perf/memory/sync_after_gib"] * GIB / MIB < 100, report


def test_a_run_leaves_the_process_peak_alone_on_cpu():
    """By default (as a run measures) no CPU peak is reset: getrusage's and /usr/bin/time's peak RSS of a
    process that ran phases still counts what it held before them (bench/bench_trl.py reads it)."""
    big = torch.ones(256 * MIB // 4)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB
    del big
    memory = PhaseMemory("cpu")
    with memory.phase("train"):
        torch.ones(MIB)
    report = memory.report()
    assert set(report) == {"perf/memory/train_after_gib"}  # no peak on CPU in a run
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss >= before
