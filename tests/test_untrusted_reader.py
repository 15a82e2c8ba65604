# SPDX-License-Identifier: LGPL-3.0-only
"""One reader for untrusted data (flux_dws.base.untrusted, issue 20): the same untrusted
string reads the same way on every path, and no control character (ESC ...) from Kubernetes
or a user ever reaches a terminal through ``flux dws``."""

from __future__ import annotations

import io
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flux_dws.base import untrusted
from flux_dws.base.jobid import f58
from flux_dws.cli import main
from flux_dws.cli.sources import SourceError
from flux_dws.core.copies import DIRECTIVE_INDEX_LABEL, INITIATOR_LABEL, copy_records
from flux_dws.core.health import job_reason
from flux_dws.core.output import OUTPUT_KEY, OUTPUT_VERSION, read_saved, tail
from flux_dws.core.states import State
from flux_dws.k8s.errors import KubeError

BAD = "a\x00b\ud800c"
SHOWN = "a\\x00b\ufffdc"  # the one rendering: NUL escaped, the lone surrogate U+FFFD
ESC = "\x1b[31mred\x1b[0m\x07\x9b2J"
JOBID = 123456789


def _controls(text: str) -> list[str]:
    """The control characters (C0, DEL, C1) in ``text``, newlines and tabs aside."""
    return [c for c in text if c not in "\n\t" and (ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0)]


# ---------------------------------------------------------------------------- the reader


def test_text_renders_one_way():
    assert untrusted.text(BAD) == SHOWN
    assert untrusted.text("a\nb\tc\rd\x1b\x7f\x85\u202e") == "a\\nb\\tc\\rd\\x1b\\x7f\\x85\\u202e"
    assert untrusted.text(b"ok \xff\xfe") == "ok \ufffd\ufffd"
    assert untrusted.text(42) == "42"
    assert untrusted.text("x" * 100, 10) == "xxxxxxx..."
    assert untrusted.text("\x1b" * 100, 10) == "\\x1b\\x1..."
    assert len(untrusted.text("y" * 10**6)) == untrusted.TEXT_LIMIT


def test_lines_keep_newlines_and_tabs_but_no_other_control():
    assert untrusted.lines(f"one\n\ttwo {ESC}") == "one\n\ttwo \\x1b[31mred\\x1b[0m\\x07\\x9b2J"


def test_field_keeps_text_and_replaces_only_what_jansson_refuses():
    assert untrusted.field(BAD) == SHOWN
    assert untrusted.field("two\nlines\x1b") == "two\nlines\x1b"
    assert untrusted.field(7) == "" and untrusted.field(None) == ""
    assert untrusted.field("abcdef", 5) == "ab..."
    assert untrusted.jansson_problem(untrusted.field(BAD)) is None


def test_typed_reads_fall_back():
    assert untrusted.mapping([1]) == {} and untrusted.mapping({"a": 1}) == {"a": 1}
    assert untrusted.sequence("abc") == [] and untrusted.sequence((1, 2)) == [1, 2]
    assert untrusted.integer(True) is None and untrusted.integer(2**63) is None
    assert untrusted.integer(-(2**63)) == -(2**63) and untrusted.integer(1.0) is None
    assert untrusted.integer(5, 0, 4) is None and untrusted.count(-1) is None
    assert untrusted.name_of({"metadata": {"name": "w1", "namespace": "ns"}}) == "w1"
    assert untrusted.name_of({"metadata": {"name": f"w{ESC}"}}) == untrusted.text(f"w{ESC}")
    assert untrusted.name_of({"metadata": {"name": 5}}) == "?"
    assert untrusted.name_of("junk") == "?"
    assert untrusted.name_of({"metadata": {"name": "w"}}, namespaced=True) == "?/w"
    assert untrusted.echo("it's") == "'it's'" and untrusted.echo([1]) == "[1]"


@pytest.mark.parametrize("text", ["²", "0-²", "３", "٣", "", " 1", "1.0", "-1", "9" * 20, "0x1", 7])
def test_decimal_reads_ascii_digits_only(text):
    """str.isdigit took "²" (int() then raised ValueError) and "３" (int() read it): a
    directive_index, jobID or resourceVersion label of those raised or was misread."""
    assert untrusted.decimal(text) is None


def test_decimal_reads_what_fits():
    assert untrusted.decimal("0") == 0 and untrusted.decimal("0042") == 42
    assert untrusted.decimal(str(2**63 - 1)) == 2**63 - 1 and untrusted.decimal(str(2**63)) is None
    assert untrusted.decimal("100000", 99_999) is None


def test_a_copy_with_a_superscript_index_is_a_record_not_an_exception():
    """Found by the thorough property run: directive_index "²" raised ValueError."""
    objects = [
        {
            "metadata": {
                "name": "dm",
                "labels": {INITIATOR_LABEL: "copy_in", DIRECTIVE_INDEX_LABEL: "²"},
            }
        }
    ]
    (record,) = copy_records(State.DATAIN, ["#DW copy_in source=/a destination=/b"], objects)
    assert record is not None


class _Unprintable:
    def __str__(self) -> str:
        raise RuntimeError("no")


def test_a_value_whose_str_fails_is_still_read():
    assert untrusted.text(_Unprintable()) == "<_Unprintable>"


@given(
    st.one_of(
        st.text(),
        st.binary(),
        st.integers(),
        st.floats(),
        st.none(),
        st.lists(st.text(max_size=5), max_size=3),
        st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=3),
    ),
    st.one_of(st.none(), st.integers(min_value=0, max_value=300)),
)
def test_text_is_always_one_bounded_printable_line(value, limit):
    shown = untrusted.text(value) if limit is None else untrusted.text(value, limit)
    assert isinstance(shown, str)
    assert shown.isprintable()  # no NUL, no newline, no control, no surrogate
    assert "\x00" not in shown and "\n" not in shown
    shown.encode("utf-8")  # strict: no lone surrogate
    assert untrusted.jansson_problem(shown) is None
    assert len(shown) <= (untrusted.TEXT_LIMIT if limit is None else limit)


@given(st.text())
def test_lines_never_hold_a_control_character_but_newline_and_tab(value):
    shown = untrusted.lines(value)
    assert all(c in "\n\t" or c.isprintable() for c in shown)
    shown.encode("utf-8")


@given(st.text())
def test_field_is_always_jansson_safe_and_the_same_as_text_for_printable_text(value):
    kept = untrusted.field(value)
    assert untrusted.jansson_problem(kept) is None
    kept.encode("utf-8")
    if value.isprintable():
        assert kept == untrusted.text(value, None)


# ---------------------------------------------------------------------------- one way everywhere


def _data_movement(message: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "dm-0",
            "namespace": "default",
            "labels": {INITIATOR_LABEL: "copy_in", DIRECTIVE_INDEX_LABEL: "0"},
        },
        "status": {"state": "Finished", "status": "Failed", "message": message},
    }


def _saved(**container: Any) -> dict[str, Any]:
    entry = {"pod": "p", "name": "c", "state": "terminated", "exit_code": 1, "log": ""}
    return {"version": OUTPUT_VERSION, "containers": [{**entry, **container}], "limit": 1000}


def test_the_same_untrusted_string_reads_the_same_on_every_path():
    directive = "#DW copy_in source=/a destination=/b"
    (record,) = copy_records(State.DATAIN, [directive], [_data_movement(BAD)])
    saved = read_saved(_saved(reason=BAD, log=BAD, note=BAD))
    assert saved is not None
    (container,) = saved.containers
    err = io.StringIO()
    main(["status", str(JOBID)], out=io.StringIO(), err=err, source_factory=_Failing(BAD))
    readings = {
        "text": untrusted.text(BAD),
        "field": untrusted.field(BAD),
        "lines": untrusted.lines(BAD),
        "json_safe": untrusted.json_safe({"k": BAD})["k"],
        "copies": record.message,
        "output.reason": container.status.reason,
        "output.log": container.log,
        "output.tail": tail(b"a\x00b\xffc", 100)[0],  # invalid UTF-8 where the surrogate was
        "kube error": KubeError("get", "workflows", "w", BAD).what,
        "cli error": err.getvalue().split(": ", 1)[1].rstrip("\n"),
    }
    assert readings == dict.fromkeys(readings, SHOWN)


def test_drain_reasons_name_the_job_in_f58():
    assert job_reason(JOBID, "PreRun failed") == f"dws: job {f58(JOBID)}: PreRun failed"
    assert job_reason(JOBID, f"x\n{ESC}").isprintable()


# ---------------------------------------------------------------------------- the CLI


class _Failing:
    """A source whose instance cannot be reached, for a reason an attacker wrote."""

    def __init__(self, why: str) -> None:
        self.why = why

    def __call__(self) -> _Failing:
        return self

    def eventlog(self, jobid: int) -> list[dict[str, Any]]:
        raise SourceError(self.why)

    def close(self) -> None:
        pass


class _Recorded:
    """A finished job whose eventlog and saved output hold ESC sequences everywhere."""

    identity = "test"

    def __init__(self) -> None:
        evil = f"boom{ESC}\nsecond line"
        self.events = [
            {"timestamp": 1.0, "name": "submit", "context": {"userid": 1001}},
            {
                "timestamp": 2.0,
                "name": "dws-workflow",
                "context": {"name": f"wf{ESC}", "namespace": "default", "timeouts": {}},
            },
            {"timestamp": 3.0, "name": "dws-state", "context": {"state": "Proposal"}},
            {
                "timestamp": 4.0,
                "name": "dws-transient",
                "context": {"state": "Proposal", "since": 4.0, "message": evil},
            },
            {
                "timestamp": 5.0,
                "name": "dws-container",
                "context": {"state": "failed", "phase": "PostRun", "reason": evil},
            },
            {
                "timestamp": 6.0,
                "name": "dws-datamovement",
                "context": {
                    "state": "DataIn",
                    "index": 0,
                    "directive": f"#DW copy_in {ESC}",
                    "status": f"Failed{ESC}",
                    "message": evil,
                },
            },
            {
                "timestamp": 7.0,
                "name": "exception",
                "context": {"type": f"dws{ESC}", "severity": 0, "note": evil},
            },
            {"timestamp": 8.0, "name": "clean", "context": {}},
        ]

    def __call__(self) -> _Recorded:
        return self

    def eventlog(self, jobid: int) -> list[dict[str, Any]]:
        return self.events

    def saved(self, jobid: int, key: str) -> Any:
        assert key == OUTPUT_KEY
        log = f"line one {ESC}\nline\ttwo\r\x00three\n"
        return _saved(pod=f"pod{ESC}", name=f"c{ESC}", reason=f"r{ESC}\nx", log=log)

    def kube(self) -> Any:
        raise AssertionError("an inactive job's workflow is not read")

    def close(self) -> None:
        pass


@pytest.mark.parametrize("command", ["status", "logs"])
def test_no_escape_sequence_reaches_the_terminal(command):
    out, err = io.StringIO(), io.StringIO()
    main([command, str(JOBID)], out=out, err=err, source_factory=_Recorded())
    shown = out.getvalue() + err.getvalue()
    assert "red" in shown  # the text is shown, escaped
    assert _controls(shown) == []
    assert "\\x1b[31m" in shown


def test_container_output_keeps_its_lines():
    out = io.StringIO()
    main(["logs", str(JOBID)], out=out, err=io.StringIO(), source_factory=_Recorded())
    shown = out.getvalue().splitlines()
    assert "  line one \\x1b[31mred\\x1b[0m\\x07\\x9b2J" in shown
    assert "  line\ttwo" in shown  # a tab in a log stays a tab
    assert any(line.startswith("  ") and "\\x00three" in line for line in shown)


def test_an_error_from_outside_is_one_escaped_line():
    err = io.StringIO()
    code = main(["status", str(JOBID)], out=io.StringIO(), err=err, source_factory=_Failing(ESC))
    assert code == 1
    assert err.getvalue() == "flux-dws status: \\x1b[31mred\\x1b[0m\\x07\\x9b2J\n"
