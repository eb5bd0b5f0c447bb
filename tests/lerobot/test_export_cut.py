"""Export of partly selected MP4s: the selected episodes cut out by a stream copy and packed.

Source MP4s hold three episodes each (two cameras); exports pick some of them,
so no source file is wholly selected. The exported videos must hold exactly
the selected episodes' frames, decoding (PyAV, frame by frame) to the source's
pixels at exactly ``from_timestamp + k/fps``; files are packed and cut at
info.json's ``video_files_size_in_mb``; a file not written LeRobot's way (its
episodes do not start at keyframes) is copied whole instead. The same holds
for sources with B-frames (packets out of presentation order) and open GOPs,
and for a Lake whose stage is S3 (SeaweedFS).
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
from tests.files.conftest import S3Lake
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
    source: Path,
    out: Path,
    picked: tuple[int, ...],
    *,
    all_frames_selected: bool,
    lengths: tuple[int, ...] = LENGTHS,
) -> None:
    """Each exported episode decodes to its source episode's frames, at exactly k/fps."""
    before = {e["episode_index"]: e for e in check_dataset(source)["episodes"]}
    after = check_dataset(out)["episodes"]
    assert [e["length"] for e in after] == [lengths[old] for old in picked]
    for key in CAMERAS:
        for new, old in enumerate(picked):
            got = _episode_frames(out, key, after[new])
            want = _episode_frames(source, key, before[old])
            assert len(got) == len(want) == lengths[old]
            for k, ((t_got, p_got), (t_want, p_want)) in enumerate(zip(got, want, strict=True)):
                assert abs(t_got - k / FPS) < 1e-9, (key, new, k, t_got)
                assert abs(t_want - k / FPS) < 1e-9
                assert np.array_equal(p_got, p_want), (key, new, k)
        if all_frames_selected:
            # The cut files hold the selected episodes' frames and nothing else.
            videos = sorted(out.glob(f"videos/{key}/*/*.mp4"))
            assert sum(len(decoded_frames(v)) for v in videos) == sum(lengths[i] for i in picked)


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


def _packets(path: Path) -> list[tuple[int, int, bool]]:
    """(pts, dts, keyframe) of an MP4's video packets in decode order."""
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        return [(p.pts, p.dts, p.is_keyframe) for p in container.demux(stream) if p.size]


def _has_b_frames(path: Path) -> bool:
    """Whether some packet is presented before one decoded ahead of it (a B-frame)."""
    times = [pts for pts, _, _ in _packets(path)]
    return any(later < max(times[:n]) for n, later in enumerate(times) if n)


def test_sources_with_b_frames_are_cut_frame_for_frame(
    shared_lake: LakeCluster, tmp_path: Path
) -> None:
    # Each episode encoded on its own (LeRobot's way) with 2 B-frames and one GOP per episode;
    # every episode at least 3 frames long, so each has the same decoding delay.
    lengths = (4, 3, 5, 6, 3, 4)
    spec = DatasetSpec(lengths=lengths, episodes_per_file=3, fps=FPS, b_frames=2, gop=12)
    source = write_dataset(tmp_path / "source", spec)
    for path in source.glob("videos/*/*/*.mp4"):
        assert _has_b_frames(path), path  # the encoder really reordered frames
    _import(shared_lake, source, "bframes")
    picked = (0, 2, 4, 5)
    out = tmp_path / "out"
    done = _export(shared_lake, "bframes", picked, out)
    assert (done.videos_copied, done.videos_cut) == (0, 2)
    for key in CAMERAS:
        assert _video_slots(out, key) == [(0, 0)] * 4
        cut = out / VIDEO_PATH.format(video_key=key, chunk_index=0, file_index=0)
        assert _has_b_frames(cut)  # the packets were copied as they are, B-frames and all
    _assert_same_frames(source, out, picked, all_frames_selected=True, lengths=lengths)


def test_open_gops_are_not_cut_at_their_keyframes(shared_lake: LakeCluster, tmp_path: Path) -> None:
    # One stream per file (not LeRobot's way), open GOPs of 6 frames with 2 B-frames: the
    # keyframes at frames 6 and 12 are followed, in decode order, by B-frames shown before
    # them that refer to the GOP before. Episodes of 6 frames each start at a keyframe, but a
    # cut there would lose or misplace the frames before it; the files are copied whole.
    lengths = (6, 6, 6, 6, 6, 6)
    spec = DatasetSpec(
        lengths=lengths, episodes_per_file=3, fps=FPS, episode_keyframes=False,
        b_frames=2, gop=6, open_gop=True,
    )  # fmt: skip
    source = write_dataset(tmp_path / "source", spec)
    for path in source.glob("videos/*/*/*.mp4"):
        packets = _packets(path)
        keyframe_times = {pts for pts, _, key in packets if key}
        assert len(keyframe_times) == 3  # frames 0, 6 and 12: every episode starts at one
        # A packet after the keyframe at frame 6 (in decode order) is shown before it.
        at_6 = next(n for n, (pts, _, key) in enumerate(packets) if key and pts > 0)
        assert any(pts < packets[at_6][0] for pts, _, _ in packets[at_6 + 1 :])
    _import(shared_lake, source, "opengop")
    picked = (1, 3, 4)
    out = tmp_path / "out"
    done = _export(shared_lake, "opengop", picked, out)
    assert (done.videos_copied, done.videos_cut) == (4, 0)
    for key in CAMERAS:
        assert _video_slots(out, key) == [(0, 0), (0, 1), (0, 1)]
        for file_index in range(2):
            copied = out / VIDEO_PATH.format(video_key=key, chunk_index=0, file_index=file_index)
            original = source / VIDEO_PATH.format(
                video_key=key, chunk_index=0, file_index=file_index
            )
            assert copied.read_bytes() == original.read_bytes()
    before = {e["episode_index"]: e for e in check_dataset(source)["episodes"]}
    after = check_dataset(out)["episodes"]
    for key in CAMERAS:
        for new, old in enumerate(picked):
            got = _episode_frames(out, key, after[new])
            want = _episode_frames(source, key, before[old])
            assert len(got) == len(want) == lengths[old]
            for (t_got, p_got), (t_want, p_want) in zip(got, want, strict=True):
                assert t_got == pytest.approx(t_want, abs=1e-9)
                assert np.array_equal(p_got, p_want)


def test_cut_and_copied_videos_from_an_s3_stage(s3_lake: S3Lake, tmp_path: Path) -> None:
    source = write_dataset(tmp_path / "source", _spec())
    _import(s3_lake.cluster, source, "s3")
    objects = s3_lake.client().list_objects_v2(Bucket=s3_lake.bucket).get("Contents", [])
    assert sum(o["Key"].startswith("lake/managed/") for o in objects) >= 4  # the MP4s are on S3
    read_before = s3_lake.proxy.total
    # Episodes 3-5 fill source file 1 (copied whole); 0 and 2 are cut out of file 0.
    picked = (0, 2, 3, 4, 5)
    out = tmp_path / "out"
    done = _export(s3_lake.cluster, "s3", picked, out)
    assert s3_lake.proxy.total > read_before  # the videos were read from S3
    assert (done.videos_copied, done.videos_cut) == (2, 2)
    for key in CAMERAS:
        # Episodes 0 and 2 cut into file 0, source file 1 copied whole as file 1.
        assert _video_slots(out, key) == [(0, 0), (0, 0), (0, 1), (0, 1), (0, 1)]
        copied = out / VIDEO_PATH.format(video_key=key, chunk_index=0, file_index=1)
        original = source / VIDEO_PATH.format(video_key=key, chunk_index=0, file_index=1)
        assert copied.read_bytes() == original.read_bytes()
    _assert_same_frames(source, out, picked, all_frames_selected=False)
    # Only the cut file holds episodes 0 and 2: nothing else of source file 0.
    for key in CAMERAS:
        cut = out / VIDEO_PATH.format(video_key=key, chunk_index=0, file_index=0)
        assert len(decoded_frames(cut)) == LENGTHS[0] + LENGTHS[2]
