"""MCAP recordings written with ``mcap`` for tests and benchmarks: ROS 2 (CDR) and JSON topics.

Deterministic: message ``i`` of a topic has values derived from ``i``.
Options cover what Lake must handle: chunked or not, with or without a
summary (no statistics, no indexes, no summary offsets), and a bulky
``/camera`` topic that makes the file large enough for byte-count bounds.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mcap.writer import CompressionType, IndexType, Writer
from mcap_ros2._dynamic import serialize_dynamic

JOINT_STATE = "sensor_msgs/JointState"
JOINT_STATE_DEF = """std_msgs/Header header
string[] name
float64[] position
float64[] velocity
================================================================================
MSG: std_msgs/Header
builtin_interfaces/Time stamp
string frame_id
================================================================================
MSG: builtin_interfaces/Time
int32 sec
uint32 nanosec
"""
IMAGE = "sensor_msgs/CompressedImage"
IMAGE_DEF = """string format
uint8[] data
"""
EVENT_SCHEMA = {
    "type": "object",
    "properties": {
        "kind": {"type": "string"},
        "step": {"type": "integer"},
        "score": {"type": "number"},
        "ok": {"type": "boolean"},
        "pose": {
            "type": "object",
            "properties": {"x": {"type": "number"}, "y": {"type": "number"}},
        },
        "tags": {"type": "array", "items": {"type": "string"}},
    },
}
JOINTS = ("shoulder", "elbow", "wrist")
#: Log time of every recording's first message (2026-11-01T00:00:00Z).
T0 = 1_793_491_200_000_000_000
SECOND = 1_000_000_000


@dataclass(frozen=True)
class Spec:
    """What :func:`write_recording` writes."""

    seconds: float = 2.0
    joint_hz: int = 50
    event_hz: int = 5
    camera_hz: int = 0
    camera_bytes: int = 0
    chunked: bool = True
    summary: bool = True
    chunk_size: int = 1024 * 1024
    compression: CompressionType = CompressionType.ZSTD
    #: False: a summary (statistics, channels) but no chunk or message indexes to seek by.
    indexes: bool = True


def joint_state(i: int, t: int) -> dict[str, Any]:
    return {
        "header": {
            "stamp": {"sec": t // SECOND, "nanosec": t % SECOND},
            "frame_id": "base",
        },
        "name": list(JOINTS),
        "position": [i * 0.01 + k for k in range(len(JOINTS))],
        "velocity": [float(i % 7) - k for k in range(len(JOINTS))],
    }


def event(i: int) -> dict[str, Any]:
    return {
        "kind": "grasp" if i % 2 else "place",
        "step": i,
        "score": i / 4,
        "ok": i % 3 == 0,
        "pose": {"x": i * 0.5, "y": -i * 0.25},
        "tags": [f"t{k}" for k in range(i % 3)],
    }


def write_recording(path: Path, spec: Spec = Spec()) -> Path:
    """Write one recording; returns ``path``."""
    options: dict[str, Any] = {
        "chunk_size": spec.chunk_size,
        "compression": spec.compression,
        "use_chunking": spec.chunked,
    }
    if not spec.indexes:
        options["index_types"] = IndexType.NONE
    if not spec.summary:
        options.update(
            index_types=IndexType.NONE,
            repeat_channels=False,
            repeat_schemas=False,
            use_statistics=False,
            use_summary_offsets=False,
        )
    encode_joint = serialize_dynamic(JOINT_STATE, JOINT_STATE_DEF)[JOINT_STATE]
    encode_image = serialize_dynamic(IMAGE, IMAGE_DEF)[IMAGE]
    events: list[tuple[int, str, bytes, int]] = []
    for i in range(int(spec.seconds * spec.joint_hz)):
        t = T0 + i * SECOND // spec.joint_hz
        events.append((t, "/joint_states", encode_joint(joint_state(i, t)), i))
    for i in range(int(spec.seconds * spec.event_hz)):
        t = T0 + i * SECOND // spec.event_hz + 1
        events.append((t, "/events", json.dumps(event(i)).encode(), i))
    for i in range(int(spec.seconds * spec.camera_hz)):
        t = T0 + i * SECOND // spec.camera_hz + 2
        data = bytes((i * 31 + k * 7) % 251 for k in range(256)) * (spec.camera_bytes // 256)
        events.append((t, "/camera", encode_image({"format": "raw", "data": data}), i))
    events.sort()
    with path.open("wb") as out:
        writer = Writer(out, **options)
        writer.start(profile="ros2", library="lake-tests")
        joint_schema = writer.register_schema(JOINT_STATE, "ros2msg", JOINT_STATE_DEF.encode())
        image_schema = writer.register_schema(IMAGE, "ros2msg", IMAGE_DEF.encode())
        event_schema = writer.register_schema(
            "lake.Event", "jsonschema", json.dumps(EVENT_SCHEMA).encode()
        )
        channels = {
            "/joint_states": writer.register_channel("/joint_states", "cdr", joint_schema),
            "/camera": writer.register_channel("/camera", "cdr", image_schema),
            "/events": writer.register_channel("/events", "json", event_schema),
        }
        for t, topic, data, seq in events:
            writer.add_message(channels[topic], log_time=t, data=data, publish_time=t, sequence=seq)
        writer.finish()
    return path
