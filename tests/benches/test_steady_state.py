"""benches/steady_state.py's arithmetic: the two ratios a sidecar is signed off on, from the rows
it prints, and its refusals (too short a run, a duration it cannot read)."""

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benches"))
import steady_state  # noqa: E402 (the path above)


def rows(cpu, rss):
    return [{"minute": m, "cpu_ms": c, "rss_mib": r} for m, (c, r) in enumerate(zip(cpu, rss), 1)]


def test_the_end_is_compared_with_minutes_2_to_4_and_minute_2s_rss():
    r = rows([500, 100, 110, 120, 130, 140, 150, 160, 170],
             [10.0, 12.0, 13.0, 14.0, 15.0, 15.0, 15.0, 15.0, 15.0])
    cpu, rss = steady_state.ratios(r)
    # The last three minutes (150, 160, 170) over minutes 2-4 (100, 110, 120); minute 1's
    # start-up is left out.
    assert cpu == pytest.approx(160 / 110)
    assert rss == pytest.approx(15.0 / 12.0)


def test_a_run_too_short_to_compare_is_refused():
    with pytest.raises(SystemExit, match="at least 7 minutes"):
        steady_state.ratios(rows([1] * 6, [1.0] * 6))


@pytest.mark.parametrize("text, seconds", [("1s", 1.0), ("500ms", 0.5), ("10s", 10.0), ("2m", 120.0)])
def test_durations_read_as_gpulse_takes_them(text, seconds):
    assert steady_state.parse_seconds(text) == pytest.approx(seconds)


def test_a_duration_without_a_unit_is_refused_with_what_to_write():
    with pytest.raises(SystemExit, match="use e.g. 1s"):
        steady_state.parse_seconds("10")
