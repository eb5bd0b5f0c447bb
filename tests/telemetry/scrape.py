"""Read a process's /metrics and its log lines, for the telemetry tests."""

from __future__ import annotations

import json
import re
import urllib.request
from typing import Any

_SAMPLE = re.compile(
    r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>[^}]*)\})? (?P<value>\S+)$"
)


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        return str(reply.read().decode())


def value(text: str, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    total, found = 0.0, False
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match is None or match["name"] != name:
            continue
        have = dict(re.findall(r'(\w+)="([^"]*)"', match["labels"] or ""))
        if all(have.get(k) == v for k, v in labels.items()):
            total, found = total + float(match["value"]), True
    assert found, f"no sample {name}{labels} in /metrics"
    return total


def json_lines(log: str) -> list[dict[str, Any]]:
    """Every line of ``log`` parsed as one JSON object (fails on any other line)."""
    records = []
    for line in log.splitlines():
        record = json.loads(line)
        assert isinstance(record, dict), line
        records.append(record)
    return records
