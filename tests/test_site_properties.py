# SPDX-License-Identifier: LGPL-3.0-only
"""Properties of the site surfaces that read untrusted data (issue 22): records, output,
policy, health text, hostlists, and the one sanitiser they all print through.

Each property holds for any input: no exception but the surface's own one-line error, every
text a person reads is readable (flux_dws.base.untrusted.readable leaves it as it is), and
everything sent to Flux is what jansson accepts (int64 included).

The examples per property come from the Hypothesis profile (tests/conftest.py): the default
runs Hypothesis's usual 100; ``HYPOTHESIS_PROFILE=thorough`` runs 1,000 each::

    HYPOTHESIS_PROFILE=thorough python3 -m pytest tests/test_site_properties.py -q
"""

from __future__ import annotations

import ipaddress
import string

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flux_dws.base import untrusted
from flux_dws.base.errors import PolicyError, RequestError
from flux_dws.base.hostlist import MAX_EXPANSION, HostlistError, expand_hostlist, expand_idset
from flux_dws.cli.recordviews import render_output
from flux_dws.core import copies, health
from flux_dws.core.output import OUTPUT_VERSION, read_saved
from flux_dws.core.policy import (
    CONFIG_KEYS,
    COUNT_BOUNDS,
    MAX_LOG_SIZE,
    Policy,
    policy_from_table,
)
from flux_dws.core.request import request_from_attributes
from flux_dws.core.states import State
from flux_dws.core.workflowstatus import prefixed_directive, strip_directive
from flux_dws.k8s.resources import decode_token

PROPERTY = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])

#: Characters that have broken terminals or one-line messages: C0, C1, bidi, separators,
#: surrogates, and digits of other scripts that str.isdigit takes.
NASTY = (
    [chr(c) for c in range(0x20)]
    + ["\x7f", "\x85", "\x9b", "\x9d", "\u2028", "\u2029", "\ufeff", "\ud800", "\udcff"]
    + [chr(c) for c in range(0x202A, 0x202F)]
    + [chr(c) for c in range(0x2066, 0x206A)]
    + ["²", "٣", "３", "\u00a0", "[", "]", ":", "-", ","]
)
TEXT = st.text(st.sampled_from(NASTY) | st.characters(), max_size=60)
INTS = st.integers() | st.sampled_from([2**63 - 1, 2**63, -(2**63) - 1, 2**64, 10**30])
JSON = st.recursive(
    st.none() | st.booleans() | INTS | st.floats() | TEXT,
    lambda c: st.lists(c, max_size=4) | st.dictionaries(TEXT, c, max_size=4),
    max_leaves=12,
)

BIDI = {chr(c) for c in [*range(0x202A, 0x202F), *range(0x2066, 0x206A)]}


def readable_line(text: str, limit: int | None = None) -> bool:
    """One line with no control, bidi or other non-printable character, within ``limit``."""
    return (
        text.isprintable()
        and not BIDI & set(text)
        and len(text.splitlines()) <= 1
        and (limit is None or len(text) <= limit)
    )


# ---- the sanitiser ---------------------------------------------------------------------


@PROPERTY
@given(value=JSON | st.binary(max_size=40), limit=st.none() | st.integers(0, 100))
def test_readable_is_printable_bounded_and_idempotent(value, limit):
    shown = untrusted.readable(value, limit)
    assert readable_line(shown, limit)
    assert untrusted.readable(shown, None) == shown
    several = untrusted.readable(value, limit, lines=True)
    assert all(readable_line(line) for line in several.split("\n") for line in line.split("\t"))
    assert untrusted.readable(several, None, lines=True) == several


@PROPERTY
@given(value=JSON)
def test_json_safe_records_are_what_jansson_accepts(value):
    safe = untrusted.json_safe({"v": value}, record=True)
    assert untrusted.jansson_problem(safe) is None
    assert all(s == untrusted.readable(s, None, lines=True) for s in _strings(safe))
    problem = untrusted.jansson_problem(untrusted.json_safe({"v": value}))
    assert problem is None or "int64" in problem  # a request's integer: its caller refuses it


def _strings(obj):
    if isinstance(obj, str):
        yield obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield k
            yield from _strings(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from _strings(v)


@PROPERTY
@given(value=INTS)
def test_jansson_problem_checks_int64_range(value):
    refused = untrusted.jansson_problem({"n": value}) is not None
    assert refused == (not -(2**63) <= value <= 2**63 - 1)


# ---- records: NnfDataMovement -> dws-datamovement ----------------------------------------

COMMAND = st.fixed_dictionaries(
    {},
    optional={
        "data": st.sampled_from(["", "1 GiB (1073741824 bytes)", f"x ({'9' * 19} bytes)"]) | TEXT,
        "items": INTS | JSON,
        "files": INTS | JSON,
        "bytes": INTS,
        "progress": INTS | JSON,
        "elapsedTime": st.sampled_from(["1m2.5s", "9" * 60 + "h"]) | TEXT,
        "rate": TEXT,
    },
)
MOVEMENT = st.fixed_dictionaries(
    {
        "metadata": st.fixed_dictionaries(
            {
                "name": TEXT,
                "labels": st.fixed_dictionaries(
                    {
                        copies.INITIATOR_LABEL: st.just("copy_in"),
                        copies.DIRECTIVE_INDEX_LABEL: st.sampled_from(["0", "1"]) | TEXT,
                    }
                ),
            }
        ),
        "status": st.fixed_dictionaries(
            {},
            optional={
                "state": st.sampled_from(["Finished", "Running"]) | TEXT,
                "status": st.sampled_from(["Success", "Failed"]) | TEXT,
                "message": TEXT,
                "commandStatus": COMMAND,
                "startTime": TEXT,
                "endTime": TEXT,
            },
        ),
    }
)


@PROPERTY
@given(
    objects=st.lists(MOVEMENT | JSON, max_size=5),
    word=TEXT.filter(lambda w: untrusted.jansson_problem(w) is None),  # a jobspec's: jansson's
)
def test_copy_records_post_what_flux_accepts_and_read_as_one_line(objects, word):
    directive = f"#DW copy_in source=/lus/{word.split()[0] if word.split() else 'x'} destination=y"
    for record in copies.copy_records(State.DATAIN, ["#DW jobdw", directive], objects):
        event = record.to_event()
        assert untrusted.jansson_problem(event) is None  # int64 figures: never EPROTO
        for figure in ("items", "files", "bytes", "directories", "links"):
            assert event[figure] is None or 0 <= event[figure] <= untrusted.INT64_MAX
        assert readable_line(copies.summary(record))
        assert readable_line(untrusted.readable(copies.copy_note(record, 1)), 1024)


def test_byte_totals_past_int64_are_unknown_not_refused():
    """Two rabbits' copies of 5e18 bytes each: their sum does not fit jansson's int64, so the
    record says unknown rather than being refused (EPROTO) and lost."""

    def movement(name: str) -> dict:
        labels = {copies.INITIATOR_LABEL: "copy_in", copies.DIRECTIVE_INDEX_LABEL: "1"}
        command = {"data": "4.3 EiB (5000000000000000000 bytes)", "files": 2**62}
        status = {"state": "Finished", "status": "Success", "commandStatus": command}
        return {"metadata": {"name": name, "labels": labels}, "status": status}

    (record,) = copies.copy_records(
        State.DATAIN,
        ["#DW jobdw", "#DW copy_in source=/a destination=b"],
        [movement("a"), movement("b")],
    )
    assert record.bytes is None and record.files is None  # 2 * 2**62 > INT64_MAX too
    assert untrusted.jansson_problem(record.to_event()) is None
    event = untrusted.json_safe({"n": 2**64, "s": "\x1b[2J"}, one_line=True, record=True)
    assert event == {"n": None, "s": "\\x1b[2J"}  # what JobManager.post sends


# ---- output: the saved container record and `flux dws logs` ------------------------------

CONTAINER = st.fixed_dictionaries(
    {},
    optional={
        "pod": TEXT,
        "name": TEXT,
        "state": TEXT,
        "exit_code": INTS,
        "reason": TEXT,
        "restarts": INTS,
        "log": st.lists(TEXT, max_size=4).map("\n".join),
        "truncated": st.booleans(),
        "error": TEXT,
    },
)


@PROPERTY
@given(containers=st.lists(CONTAINER | JSON, max_size=3), note=TEXT, limit=INTS)
def test_saved_output_prints_only_readable_lines(containers, note, limit):
    saved = read_saved(
        {"version": OUTPUT_VERSION, "containers": containers, "note": note, "limit": limit}
    )
    if saved is None:
        return
    assert untrusted.jansson_problem(untrusted.json_safe(saved.to_json(), record=True)) is None
    for line in render_output(1234, saved, {"context": {"output": note}}):
        assert readable_line(line.replace("\t", " ")), line


# ---- policy: the [dws] table --------------------------------------------------------------

KEYS = st.sampled_from(CONFIG_KEYS)  # every key of the [dws] table, as policy.py lists them
EDGES = st.sampled_from(
    ["²", "::1", "[::1]:9", "h:1:2", "[]:1", "1TiB", "16MiB", "17MiB", "0", "inf", "5x"]
) | st.sampled_from(sorted({n + d for b in COUNT_BOUNDS.values() for n in b for d in (-1, 0, 1)}))


@PROPERTY
@given(key=KEYS, value=JSON | TEXT | EDGES)
def test_policy_takes_a_value_or_says_why_in_one_line(key, value):
    try:
        policy = policy_from_table({key: value})
    except PolicyError as exc:
        assert readable_line(str(exc), 600), str(exc)
        assert str(exc).startswith("[dws] ") and key in str(exc), str(exc)
        return
    assert isinstance(policy, Policy)
    if key in COUNT_BOUNDS:
        least, most = COUNT_BOUNDS[key]
        assert least <= getattr(policy, key.replace("-", "_")) <= most
    if key == "container-log-size":
        assert 0 <= policy.container_log_size <= MAX_LOG_SIZE
    if key == "metrics-address" and policy.metrics_address is not None:
        host, port = policy.metrics_address
        assert 0 <= port <= 65535 and host and "[" not in host
        if ":" in host:
            ipaddress.IPv6Address(host)


def test_a_huge_table_where_a_number_belongs_is_echoed_short():
    """Found by the thorough run: ``container-log-size`` set to a table echoed all of it."""
    table = {f"k{i}": ["x" * 50] * 10 for i in range(20)}
    for key in ("container-log-size", "max-proposals"):
        try:
            policy_from_table({key: table})
        except PolicyError as exc:
            assert readable_line(str(exc), 300), str(exc)
        else:
            raise AssertionError(f"{key}: a table was taken")


@PROPERTY
@given(dw=TEXT | st.text(string.ascii_letters, min_size=1, max_size=5000), timeouts=JSON)
def test_requests_are_read_or_refused_in_one_bounded_line(dw, timeouts):
    policy = Policy(user_timeouts=True)
    for attributes in (
        {"dw": dw},
        {"dw": "#DW jobdw type=xfs capacity=1GiB", "dw_timeout": timeouts},
    ):
        try:
            request_from_attributes(attributes, policy, userid=1000, owner_uid=1000)
        except RequestError as exc:
            assert readable_line(str(exc), 2000), str(exc)[:200]


# ---- health text: Storage, ClientMount, drain reasons --------------------------------------


@PROPERTY
@given(storages=st.lists(JSON, max_size=4), mounts=st.lists(JSON, max_size=4), name=TEXT)
def test_health_text_is_readable_and_drain_reasons_bounded(storages, mounts, name):
    objs = [*storages, {"metadata": {"name": name}, "status": {"status": "Offline"}}]
    rabbits = [r for r in map(health.rabbit_health, objs) if r]
    hosts = {0: "c1", 1: "c1", 2: "c2"}
    plan = health.plan_drains(rabbits, {"c1": name, "c2": "r"}, hosts, {})
    for reason in plan.drain.values():
        assert readable_line(reason, health.MAX_REASON)
    failures = health.mount_failures(mounts, ("c1", "c2"))
    for cause in failures.causes.values():
        assert readable_line(cause, 300)
    assert readable_line(health.job_reason(1, name), health.MAX_REASON)


# ---- hostlists, directive indices, tokens -------------------------------------------------


@PROPERTY
@given(text=TEXT | st.from_regex(r"n\[[0-9²３]{1,12}-[0-9²]{1,12}(,[0-9]{1,3})?\]", fullmatch=True))
def test_hostlists_expand_bounded_or_say_why(text):
    for expand in (expand_hostlist, expand_idset):
        try:
            names = expand(text)
        except HostlistError as exc:
            assert readable_line(str(exc), 300)
            continue
        assert len(names) <= MAX_EXPANSION


@PROPERTY
@given(digits=st.integers(1, 6000), message=TEXT)
def test_directive_index_of_any_length_never_raises(digits, message):
    text = f"DW Directive {'7' * digits}: {message}"
    index = prefixed_directive(text)
    assert index is None or (digits <= 6 and index == int("7" * digits))
    assert isinstance(strip_directive(text), str)


@PROPERTY
@given(token=TEXT | JSON)
def test_decode_token_never_raises(token):
    result = decode_token({"token": token})
    assert result is None or isinstance(result, str)


def test_property_profile_is_documented():
    """The thorough profile is what the docstring says (1,000 examples per property)."""
    assert settings.get_profile("thorough").max_examples == 1000
