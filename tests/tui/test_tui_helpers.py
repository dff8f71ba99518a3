"""The Textual-free helpers under the dashboard: bars, hand-offs, knobs, VRAM split."""

from __future__ import annotations

import threading
from dataclasses import replace

from tui_fakes import GIB, MIB, FakeHardware, fake_rtx_24gb, gpu_24gb_machine

from homelab.tui.bars import share_cells
from homelab.tui.format import human_tokens
from homelab.tui.handoff import Coalescer, Inbox, TextBuffer
from homelab.tui.hardware_source import live_from_report, vram_share
from homelab.tui.knobs import Knobs, cycle
from homelab.tui.status import status_document
from homelab.units import format_size


def test_bar_cells_are_proportional_and_fill_the_width() -> None:
    assert share_cells([1, 1, 2], 8) == [2, 2, 4]
    assert sum(share_cells([3, 5, 7], 37)) == 37
    assert share_cells([0, 0], 10) == [0, 0]


def test_a_small_share_stays_visible() -> None:
    cells = share_cells([1, 10_000], 20)
    assert cells[0] == 1 and sum(cells) == 20


def test_vram_split_separates_ours_from_other_processes() -> None:
    machine = gpu_24gb_machine().report
    share = vram_share(live_from_report(machine).gpus[0])
    assert not share.ours_known and share.ours_bytes == 0
    assert share.other_bytes == 1100 * MIB  # Xorg 800 MiB + 300 MiB the driver keeps
    with_us = replace(machine, gpus=(fake_rtx_24gb(ours_bytes=2 * GIB),))
    split = vram_share(live_from_report(with_us).gpus[0])
    assert split.ours_known and split.ours_bytes == 2 * GIB
    assert split.other_bytes == 1100 * MIB
    assert split.ours_bytes + split.other_bytes + split.free_bytes == 24 * GIB


def test_coalescer_wakes_once_per_burst_and_keeps_the_newest() -> None:
    wakes: list[int] = []
    box = Coalescer[int](lambda: wakes.append(1))
    threads = [threading.Thread(target=box.put, args=(value,)) for value in range(50)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(wakes) == 1
    assert box.take() is not None
    assert box.take() is None
    box.put(7)
    assert len(wakes) == 2 and box.take() == 7


def test_text_buffer_and_inbox_drain_everything_once() -> None:
    buffer = TextBuffer()
    for piece in ("a", "", "b", "c"):
        buffer.append(piece)
    assert buffer.drain() == "abc" and buffer.drain() == ""
    inbox = Inbox[int](limit=3)
    for value in range(5):
        inbox.add(value)
    assert inbox.drain() == [2, 3, 4] and inbox.drain() == []


def test_knobs_parse_select_values_and_cycle_through_auto() -> None:
    knobs = Knobs().with_value("kv_type", "q8_0").with_value("n_parallel", "4")
    assert knobs == Knobs(kv_type="q8_0", n_parallel=4)
    assert knobs.with_value("kv_type", "auto").kv_type is None
    assert cycle(None, ("f16", "q8_0")) == "f16"
    assert cycle("q8_0", ("f16", "q8_0")) is None


def test_sizes_read_like_a_person_wrote_them() -> None:
    assert format_size(24 * GIB, digits=1) == "24.0 GiB"
    assert format_size(1536, digits=1) == "1.5 KiB"
    assert format_size(None, digits=1) == "N/A"
    assert human_tokens(131072) == "128k" and human_tokens(1 << 20) == "1M"
    assert human_tokens(10496) == "10.2k"  # floored: never more than is reachable
    assert human_tokens(1000) == "1000"


def test_status_names_the_demo_model_and_its_plan(cpu_machine: FakeHardware) -> None:
    document = status_document(None, cpu_machine)
    assert document["model"]["demo"] is True
    assert document["model"]["note"].startswith(
        "small demo model trained on Python's documentation"
    )
    assert document["hardware"]["has_gpu"] is False
    assert set(document["plan"]) >= {"settings", "memory", "capacity", "fits", "reasons"}


def test_the_plan_panels_bar_and_legend_show_every_part_of_the_device() -> None:
    """The dashboard draws DeviceMemory.parts(): a draft and a projector take their share of
    the bar and are named in the legend (not drawn as free)."""
    from homelab.planner.memory import DeviceMemory
    from homelab.tui.plan_view import device_segments, legend

    device = DeviceMemory(
        "CPU",
        "cpu",
        "host RAM",
        100 * MIB,
        10 * MIB,
        20 * MIB,
        0,
        5 * MIB,
        1 * MIB,
        draft_bytes=7 * MIB,
        projector_bytes=9 * MIB,
    )
    segments = device_segments(device)
    assert [(s.label, s.amount) for s in segments[:-1]] == [
        (part.label, part.size_bytes) for part in device.parts()
    ]
    assert (segments[-1].label, segments[-1].amount) == ("free", 48 * MIB)
    text = legend(device, None)
    assert "draft 7.0 MiB" in text and "projector 9.0 MiB" in text and "free 48.0 MiB" in text
