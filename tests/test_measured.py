"""measured/<stack>.json (domain/measured.py): a run's measured rates, read in exactly the format
`verl-gke report --save` writes, and a malformed file refused in one line naming the file and the key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from domain import measured
from domain.measured import MeasuredError

GOOD = {"run": "run-632c7d78917f", "stack": "smoke", "measuredAt": "2026-12-07T12:00:00Z",
        "rates": {"modelLoadGBps": 1.2, "localSaveGBpsPerRank": 2.1, "bucketWriteGBps": 1.8,
                  "verlStartupSeconds": 300.0, "stepSeconds": 120.5}}


def _write(tmp_path: Path, data: object, stack: str = "smoke") -> Path:
    (tmp_path / "measured").mkdir(exist_ok=True)
    path = tmp_path / "measured" / f"{stack}.json"
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def test_no_file_no_measured_rates(tmp_path: Path) -> None:
    assert measured.load(tmp_path, "smoke") is None


def test_the_issues_format_reads_every_rate(tmp_path: Path) -> None:
    _write(tmp_path, GOOD)
    m = measured.load(tmp_path, "smoke")
    assert (m.run, m.stack, m.measured_at.isoformat()) == ("run-632c7d78917f", "smoke", "2026-12-07T12:00:00+00:00")
    r = m.rates
    assert (r.model_load_gbps, r.local_save_gbps_per_rank, r.bucket_write_gbps, r.verl_startup_seconds,
            r.step_seconds) == (1.2, 2.1, 1.8, 300.0, 120.5)
    assert m.note == "measured on run run-632c7d78917f"


def test_every_rate_is_optional(tmp_path: Path) -> None:
    _write(tmp_path, {**GOOD, "rates": {"stepSeconds": 60.0}})
    r = measured.load(tmp_path, "smoke").rates
    assert (r.model_load_gbps, r.step_seconds) == (None, 60.0)


@pytest.mark.parametrize(("data", "line"), [
    ("{not json", "measured/smoke.json: not JSON (Expecting property name enclosed in double quotes at line 1)"),
    ({**GOOD, "rates": {"stepSeconds": -1}}, "measured/smoke.json: rates.stepSeconds = -1: a number greater than 0"),
    ({**GOOD, "rates": {"stepSeconds": "fast"}},
     'measured/smoke.json: rates.stepSeconds = "fast": a number greater than 0'),
    ({**GOOD, "rates": {"stepSecs": 3}}, "measured/smoke.json: rates.stepSecs = 3: unknown key; rates are "
     "modelLoadGBps, localSaveGBpsPerRank, bucketWriteGBps, verlStartupSeconds, stepSeconds"),
    ({**GOOD, "measuredAt": "yesterday"}, 'measured/smoke.json: measuredAt = "yesterday": an RFC 3339 time with its '
     "offset, such as 2026-12-07T12:00:00Z"),
    ({**GOOD, "measuredAt": "2026-12-07T12:00:00"}, 'measured/smoke.json: measuredAt = "2026-12-07T12:00:00": an RFC '
     "3339 time with its offset, such as 2026-12-07T12:00:00Z"),
    ({k: v for k, v in GOOD.items() if k != "run"}, "measured/smoke.json: run: missing"),
    ({**GOOD, "stack": "a4"}, 'measured/smoke.json: stack = "a4": measured on another stack; the file of stack smoke '
     "holds its own runs only"),
])
def test_a_malformed_file_is_one_line_naming_the_file_and_key(tmp_path: Path, data: object, line: str) -> None:
    _write(tmp_path, data)
    with pytest.raises(MeasuredError) as error:
        measured.load(tmp_path, "smoke")
    assert str(error.value) == line
