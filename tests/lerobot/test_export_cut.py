"""Export of partly selected MP4s: the selected episodes cut out by a stream copy and packed.

Source MP4s hold three episodes each (two cameras); exports pick some of them,
so no source file is wholly selected. The exported videos must hold exactly
the selected episodes' frames, decoding (PyAV, frame by frame) to the source's
pixels at exactly ``from_timestamp + k/fps``; files are packed and cut at
info.json's ``video_files_size_in_mb``; a file not written LeRobot's way (its
episodes do not start at keyframes) is copied whole instead.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import av
import numpy as np
import pytest

import lake_sdk
from lake_sdk.lerobot import export_lerobot, import_lerobot
from tests.lerobot.checker import VIDEO_PATH, check_dataset, decoded_frames
from tools.lake_testing.lerobot import CAMERAS, DatasetSpec, write_dataset
from tools.lake_testing.plugin import LakeCluster

LENGTHS = (4, 3, 5, 2, 3, 4)  # files: episodes 0-2 and 3-5
FPS = 10


def _spec(**changes: Any) -> DatasetSpec:
    return DatasetSpec(lengths=LENGTHS, episodes_per_file=3, fps=FPS, **changes)


def _import(lake: LakeCluster, source: Path, name: str) -> None:
    with lake_sdk.Client(lake.query.url) as client:
        import_lerobot(client, source, namespace="robots", name=name, meta_addr=lake.meta.addr)


def _export(lake: LakeCluster, name: str, picked: tuple[int, ...], out: Path) -> Any:
    listed = ", ".join(map(str, picked))
    with lake_sdk.Client(lake.query.url) as client:
        return export_lerobot(
            client,
            f"SELECT episode_index FROM robots.{name}_episodes WHERE episode_index IN ({listed})",
            out,
        )


def _episode_frames(root: Path, key: str, episode: dict[str, Any]) -> list[tuple[float, Any]]:
    """The frames of one episode's window, as (time since from_timestamp, pixels)."""
    video = root / VIDEO_PATH.format(
        video_key=key,
        chunk_index=episode[f"videos/{key}/chunk_index"],
        file_index=episode[f"videos/{key}/file_index"],
    )
    start = episode[f"videos/{key}/from_timestamp"]
    end = episode[f"videos/{key}/to_timestamp"]
    return [
        (t - start, pixels) for t, pixels in decoded_frames(video) if start - 1e-4 <= t < end - 1e-4
    ]


def _assert_same_frames(
    source: Path, out: Path, picked: tuple[int, ...], *, all_frames_selected: bool
) -> None:
    """Each exported episode decodes to its source episode's frames, at exactly k/fps."""
    before = {e["episode_index"]: e for e in check_dataset(source)["episodes"]}
    after = check_dataset(out)["episodes"]
    assert [e["length"] for e in after] == [LENGTHS[old] for old in picked]
    for key in CAMERAS:
        for new, old in enumerate(picked):
            got = _episode_frames(out, key, after[new])
            want = _episode_frames(source, key, before[old])
            assert len(got) == len(want) == LENGTHS[old]
            for k, ((t_got, p_got), (t_want, p_want)) in enumerate(zip(got, want, strict=True)):
                assert abs(t_got - k / FPS) < 1e-9, (key, new, k, t_got)
                assert abs(t_want - k / FPS) < 1e-9
                assert np.array_equal(p_got, p_want), (key, new, k)
        if all_frames_selected:
            # The cut files hold the selected episodes' frames and nothing else.
            videos = sorted(out.glob(f"videos/{key}/*/*.mp4"))
            assert sum(len(decoded_frames(v)) for v in videos) == sum(LENGTHS[i] for i in picked)


def _packet_bytes(source: Path) -> dict[tuple[str, int], int]:
    """Bytes of each episode's packets per camera in the source files (three per file)."""
    sizes: dict[tuple[str, int], int] = {}
    for key in CAMERAS:
        for file_index in range(2):
            members = range(file_index * 3, file_index * 3 + 3)
            bounds = np.cumsum([0, *(LENGTHS[i] for i in members)])
            path = source / VIDEO_PATH.format(video_key=key, chunk_index=0, file_index=file_index)
            with av.open(str(path)) as container:
                stream = container.streams.video[0]
                packets = [p for p in container.demux(stream) if p.size]
            for n, episode in enumerate(members):
                chosen = packets[bounds[n] : bounds[n + 1]]
                sizes[(key, episode)] = sum(p.size for p in chosen)
    return sizes


def _set_video_limit(source: Path, limit_mb: float, chunks_size: int = 1000) -> None:
    path = source / "meta/info.json"
    info = json.loads(path.read_text())
    info["video_files_size_in_mb"] = limit_mb
    info["chunks_size"] = chunks_size
    path.write_text(json.dumps(info, indent=2))


def _video_slots(out: Path, key: str) -> list[tuple[int, int]]:
    return [
        (e[f"videos/{key}/chunk_index"], e[f"videos/{key}/file_index"])
        for e in check_dataset(out)["episodes"]
    ]


def test_partial_selections_across_files_decode_to_the_source_frames(
    shared_lake: LakeCluster, tmp_path: Path
) -> None:
    source = write_dataset(tmp_path / "source", _spec())
    _import(shared_lake, source, "cut")
    picked = (0, 2, 4)
    out = tmp_path / "out"
    done = _export(shared_lake, "cut", picked, out)
    # No source file is wholly selected: one cut file per camera holds all three episodes.
    assert (done.videos_copied, done.videos_cut) == (0, 2)
    for key in CAMERAS:
        assert _video_slots(out, key) == [(0, 0)] * 3
        starts = [e[f"videos/{key}/from_timestamp"] for e in check_dataset(out)["episodes"]]
        assert starts == pytest.approx([0.0, 0.4, 0.9], abs=1e-9)
    _assert_same_frames(source, out, picked, all_frames_selected=True)
    # The cut files are smaller than the two source files they came from.
    for key in CAMERAS:
        cut = sum(p.stat().st_size for p in out.glob(f"videos/{key}/*/*.mp4"))
        whole = sum(p.stat().st_size for p in source.glob(f"videos/{key}/*/*.mp4"))
        assert cut < whole
    # A second selection from the same files: episodes 1 and 5 (each the middle or end of a file).
    again = tmp_path / "again"
    _export(shared_lake, "cut", (1, 3, 5), again)
    _assert_same_frames(source, again, (1, 3, 5), all_frames_selected=True)


def test_cut_files_are_packed_up_to_the_video_size_limit(
    shared_lake: LakeCluster, tmp_path: Path
) -> None:
    picked = (0, 2, 4)
    probe = write_dataset(tmp_path / "probe", _spec())
    sizes = _packet_bytes(probe)
    # Both cameras' episodes 0 and 2 fit; episode 4 would take a file exactly to the limit.
    limit = max(sum(sizes[(k, e)] for e in picked) for k in CAMERAS)
    for name, limit_bytes, want in (
        ("at_limit", limit, [(0, 0), (0, 0), (0, 1)]),
        ("under_limit", limit + 1, [(0, 0), (0, 0), (0, 0)]),
    ):
        source = write_dataset(tmp_path / name, _spec())
        _set_video_limit(source, limit_bytes / (1024 * 1024))
        _import(shared_lake, source, name)
        out = tmp_path / f"{name}_out"
        _export(shared_lake, name, picked, out)
        # The camera whose three episodes total exactly the limit starts a new file for the
        # third; the other camera's total is below it.
        slots = {k: _video_slots(out, k) for k in CAMERAS}
        exact = [k for k in CAMERAS if sum(sizes[(k, e)] for e in picked) == limit]
        for key in CAMERAS:
            expected = want if key in exact else [(0, 0)] * 3
            assert slots[key] == expected, (name, key)
            starts = [e[f"videos/{key}/from_timestamp"] for e in check_dataset(out)["episodes"]]
            assert starts[0] == 0.0
        _assert_same_frames(source, out, picked, all_frames_selected=True)
    # A tiny limit: every episode its own file, file numbers wrapping at chunks_size.
    source = write_dataset(tmp_path / "tiny", _spec())
    _set_video_limit(source, 1e-4, chunks_size=2)
    _import(shared_lake, source, "tiny")
    out = tmp_path / "tiny_out"
    done = _export(shared_lake, "tiny", picked, out)
    assert done.videos_cut == 6
    for key in CAMERAS:
        assert _video_slots(out, key) == [(0, 0), (0, 1), (1, 0)]
        for episode in check_dataset(out)["episodes"]:
            assert episode[f"videos/{key}/from_timestamp"] == 0.0
    _assert_same_frames(source, out, picked, all_frames_selected=True)


def test_a_file_whose_episodes_do_not_start_at_keyframes_is_copied_whole(
    shared_lake: LakeCluster, tmp_path: Path
) -> None:
    # One stream per file, a keyframe only at its start: episodes 0 and 3 start at one, the
    # others do not.
    source = write_dataset(tmp_path / "source", _spec(episode_keyframes=False))
    _import(shared_lake, source, "oneshot")
    picked = (0, 1, 3)
    out = tmp_path / "out"
    done = _export(shared_lake, "oneshot", picked, out)
    # Per camera: episodes 0 and 3 cut into file 0; file 0 of the source copied whole (file 1)
    # for episode 1.
    assert (done.videos_copied, done.videos_cut) == (2, 2)
    for key in CAMERAS:
        assert _video_slots(out, key) == [(0, 0), (0, 1), (0, 0)]
        copied = out / VIDEO_PATH.format(video_key=key, chunk_index=0, file_index=1)
        original = source / VIDEO_PATH.format(video_key=key, chunk_index=0, file_index=0)
        assert copied.read_bytes() == original.read_bytes()
        episode_1 = check_dataset(out)["episodes"][1]
        assert episode_1[f"videos/{key}/from_timestamp"] == pytest.approx(0.4)
    _assert_same_frames(source, out, picked, all_frames_selected=False)
