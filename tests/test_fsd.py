# SPDX-License-Identifier: LGPL-3.0-only
"""Flux Standard Duration: parse_fsd and format_fsd."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flux_dws.base.fsd import format_fsd, parse_fsd


@pytest.mark.parametrize(
    "text, seconds",
    [
        ("30s", 30.0),
        ("5m", 300.0),
        ("1.5h", 5400.0),
        ("2d", 172800.0),
        ("500ms", 0.5),
        ("10", 10.0),
        (" 7m ", 420.0),
        (".5s", 0.5),
        ("5.", 5.0),
        ("1e3", 1000.0),
        ("2E1m", 1200.0),
        ("0", 0.0),
        (0, 0.0),
        (42, 42.0),
        (2.5, 2.5),
    ],
)
def test_parse_fsd_values(text: object, seconds: float) -> None:
    assert parse_fsd(text) == seconds


@pytest.mark.parametrize("text", ["inf", "INF", "Infinity", " inf ", math.inf])
def test_parse_fsd_infinity(text: object) -> None:
    assert parse_fsd(text) == math.inf


@pytest.mark.parametrize(
    "value", ["", "5x", "m", "5 m", "-5s", "5mm", "1.2.3s", "nan", ".", "5M", None, [], {}]
)
def test_parse_fsd_rejects_and_names_the_value(value: object) -> None:
    with pytest.raises(ValueError, match="invalid duration") as info:
        parse_fsd(value)
    assert repr(value) in str(info.value)


@pytest.mark.parametrize("value", [True, False])
def test_parse_fsd_rejects_booleans(value: bool) -> None:
    # TOML/JSON booleans are ints in Python; "true" is not a duration.
    with pytest.raises(ValueError, match="invalid duration"):
        parse_fsd(value)


@pytest.mark.parametrize("value", [-1, -0.5])
def test_parse_fsd_rejects_negative_numbers(value: float) -> None:
    with pytest.raises(ValueError, match="must not be negative"):
        parse_fsd(value)


@pytest.mark.parametrize("value", [math.nan, "nan", "NaN"])
def test_parse_fsd_says_nan_is_not_a_duration(value: object) -> None:
    with pytest.raises(ValueError, match="NaN is not a number of seconds"):
        parse_fsd(value)


@pytest.mark.parametrize("value", ["３０m", "٣s", "1.５h", "²s"])
def test_parse_fsd_takes_ascii_digits_only(value: str) -> None:
    with pytest.raises(ValueError, match="invalid duration"):
        parse_fsd(value)


@pytest.mark.parametrize("value", ["1e400s", "1e400", "1e308d", "9" * 400 + "s"])
def test_parse_fsd_out_of_range_is_refused_not_unlimited(value: str) -> None:
    with pytest.raises(ValueError, match="out of range"):
        parse_fsd(value)


def test_parse_fsd_echoes_input_escaped_and_cut_short() -> None:
    value = "\x1b[31m" + "x" * 500 + "\n\x00"
    with pytest.raises(ValueError) as info:
        parse_fsd(value)
    message = str(info.value)
    assert "\x1b" not in message and "\x00" not in message and "\n" not in message
    assert "\\x1b[31m" in message
    assert len(message) < 160


def test_parse_fsd_keeps_a_line_separator_out_of_its_one_line_message() -> None:
    """U+2028 split the message across lines (issue 22, item 13)."""
    with pytest.raises(ValueError) as info:
        parse_fsd("1\u2028h\u2029\x85")
    message = str(info.value)
    assert len(message.splitlines()) == 1 and "\\u2028" in message, repr(message)


def test_parse_fsd_huge_integer_is_a_value_error() -> None:
    # float() of a huge int raises OverflowError, which is not a ValueError.
    with pytest.raises(ValueError, match="too large"):
        parse_fsd(10**400)


@pytest.mark.parametrize(
    "seconds, text",
    [
        (0, "0s"),
        (0.5, "500ms"),
        (0.0015, "1.5ms"),
        (1, "1s"),
        (90, "1.5m"),
        (100, "100s"),
        (3600, "1h"),
        (5400, "1.5h"),
        (86400, "1d"),
        (1234567, "1234567s"),
        (86400 * 1234567, "1234567d"),
        (math.inf, "inf"),
    ],
)
def test_format_fsd_shortest_form(seconds: float, text: str) -> None:
    assert format_fsd(seconds) == text


@given(st.integers(min_value=0, max_value=10**15))
def test_format_round_trips_every_millisecond_count(millis: int) -> None:
    seconds = millis / 1000
    assert math.isclose(parse_fsd(format_fsd(seconds)), seconds, rel_tol=1e-12, abs_tol=1e-9)


@given(st.floats(min_value=0.001, max_value=1e12, allow_nan=False))
def test_format_is_within_half_a_millisecond(seconds: float) -> None:
    again = parse_fsd(format_fsd(seconds))
    assert math.isclose(again, seconds, rel_tol=1e-12, abs_tol=0.0005 + 1e-9)


@given(st.one_of(st.text(max_size=12), st.integers(), st.floats(), st.none(), st.booleans()))
def test_parse_fsd_raises_only_value_error(value: object) -> None:
    try:
        seconds = parse_fsd(value)
    except ValueError:
        return
    assert seconds >= 0 and not math.isnan(seconds)
