# SPDX-License-Identifier: LGPL-3.0-only
"""A job's system.dw / system.dw_timeout -> DwRequest: every refusal, defaults, presets, JSON."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flux_dws.base.errors import DirectiveError, RequestError
from flux_dws.core.directives import parse_directives
from flux_dws.core.policy import TIMEOUT_KEYS, Policy, policy_from_table
from flux_dws.core.request import DwRequest, request_from_attributes

OWNER = 1000
USER = 2000
JOBDW = "#DW jobdw type=xfs capacity=10GiB name=scratch"
COPY_IN = "#DW copy_in source=/lus/in destination=$DW_JOB_scratch/in"
CONTAINER = "#DW container name=app profile=red-rock DW_JOB_local_storage=shared"
GFS2 = "#DW jobdw type=gfs2 capacity=100GB name=shared"
CREATE = "#DW create_persistent name=keep type=lustre capacity=1TiB"
DESTROY = "#DW destroy_persistent name=keep"

SITE = policy_from_table(
    {
        "presets": {"small": JOBDW, "staged": [JOBDW, COPY_IN]},
        "timeouts": {"prerun": {"default": "10m", "max": "1h"}, "datain": {"max": "inf"}},
    }
)


def request(system: Any, policy: Policy = SITE, userid: int = USER) -> DwRequest | None:
    return request_from_attributes(system, policy, userid=userid, owner_uid=OWNER)


def refusal(system: Any, policy: Policy = SITE, userid: int = USER) -> str:
    with pytest.raises(RequestError) as info:
        request(system, policy, userid)
    message = str(info.value)
    assert "\n" not in message
    return message


def accepted(system: Any, policy: Policy = SITE, userid: int = USER) -> DwRequest:
    req = request(system, policy, userid)
    assert req is not None
    return req


# ---- not a DWS job --------------------------------------------------------------------------


@pytest.mark.parametrize("system", [None, {}, {"duration": 60, "queue": "batch"}])
def test_job_without_dw_is_not_a_dws_job(system: Any) -> None:
    assert request(system) is None


def test_dw_timeout_without_dw_is_refused() -> None:
    message = refusal({"dw_timeout": {"prerun": "5m"}})
    assert message.startswith("system.dw_timeout is set but system.dw is not")


def test_system_that_is_not_a_table_is_refused() -> None:
    assert refusal(["dw"]) == "attributes.system must be a table, not array"


# ---- directives -----------------------------------------------------------------------------


def test_one_directive_string_takes_the_site_defaults() -> None:
    req = accepted({"dw": JOBDW})
    assert req.lines == (JOBDW,)
    assert req.directives == parse_directives(JOBDW)
    assert req.preset is None
    assert dict(req.user_timeouts) == {}
    assert dict(req.timeouts) == {key: SITE.timeout(key).default for key in TIMEOUT_KEYS}
    assert req.timeouts["prerun"] == 600.0  # the site's default, not the built-in one
    assert not req.has_container


def test_several_directives_in_one_string_and_in_a_list_agree() -> None:
    text = accepted({"dw": f"{JOBDW}\n{COPY_IN}"})
    listed = accepted({"dw": [JOBDW, COPY_IN]})
    assert text == listed
    assert text.lines == (JOBDW, COPY_IN)
    assert [d.index for d in text.directives] == [0, 1]


def test_has_container() -> None:
    assert accepted({"dw": [GFS2, CONTAINER]}).has_container


def test_directive_error_is_prefixed_with_the_attribute() -> None:
    bad = [JOBDW, "#DW jobdw type=xfs capacity=10GiB"]
    with pytest.raises(DirectiveError) as info:
        parse_directives(bad)
    message = refusal({"dw": bad})
    assert message == f"system.dw: {info.value}"
    assert "#DW directive 1" in message


def test_text_that_is_not_a_directive_is_refused_by_the_grammar() -> None:
    assert refusal({"dw": "jobdw type=xfs capacity=10GiB name=x"}).startswith(
        "system.dw: #DW directive 0:"
    )


@pytest.mark.parametrize(
    "value, kind",
    [(5, "integer"), (None, "NoneType"), ({"a": 1}, "table"), (True, "boolean"), (1.5, "float")],
)
def test_dw_of_the_wrong_type_is_refused(value: Any, kind: str) -> None:
    assert refusal({"dw": value}) == (
        "system.dw must be #DW directives (a string or a list of strings) or a preset name, "
        f"not {kind}"
    )


@pytest.mark.parametrize("value", ["", "   \n", [], [""], ["  ", "\t"]])
def test_empty_dw_is_refused(value: Any) -> None:
    assert refusal({"dw": value}) == "system.dw is empty: give #DW directives or a preset name"


def test_list_with_a_non_string_names_the_element() -> None:
    assert refusal({"dw": [JOBDW, 7]}) == "system.dw[1] must be a string, not integer"


# ---- presets --------------------------------------------------------------------------------


def test_string_preset() -> None:
    req = accepted({"dw": "small"})
    assert req.preset == "small"
    assert req.lines == (JOBDW,)


def test_list_preset_with_surrounding_whitespace() -> None:
    req = accepted({"dw": "  staged\n"})
    assert req.preset == "staged"
    assert req.lines == (JOBDW, COPY_IN)
    assert req.directives == parse_directives([JOBDW, COPY_IN])


def test_unknown_preset_lists_the_known_ones() -> None:
    assert refusal({"dw": "large"}) == "system.dw: unknown preset 'large'; known: small, staged"


def test_unknown_preset_at_a_site_without_presets() -> None:
    message = refusal({"dw": "small"}, Policy())
    assert message == "system.dw: unknown preset 'small'; known: (this site defines none)"


def test_a_list_is_never_a_preset_name() -> None:
    assert refusal({"dw": ["small"]}).startswith("system.dw: #DW directive 0:")


# ---- persistent storage ---------------------------------------------------------------------


@pytest.mark.parametrize("directive", [CREATE, DESTROY])
def test_persistent_storage_is_for_the_instance_owner(directive: str) -> None:
    command = directive.split()[1]
    assert refusal({"dw": directive}) == (
        f"system.dw: #DW directive 0 ({command}): only the instance owner (uid {OWNER}) "
        "may manage persistent storage at this site"
    )
    assert accepted({"dw": directive}, userid=OWNER).lines == (directive,)


def test_persistent_storage_for_everyone_when_not_restricted() -> None:
    open_site = Policy(restrict_persistent=False)
    assert accepted({"dw": CREATE}, open_site).directives[0].command == "create_persistent"


def test_persistentdw_is_not_restricted() -> None:
    assert accepted({"dw": "#DW persistentdw name=keep"}).directives[0].name == "keep"


# ---- timeouts -------------------------------------------------------------------------------


def test_user_timeouts_override_only_their_keys() -> None:
    req = accepted({"dw": JOBDW, "dw_timeout": {"prerun": "30m", "setup": 90, "datain": "inf"}})
    assert dict(req.user_timeouts) == {"prerun": 1800.0, "setup": 90.0, "datain": math.inf}
    assert req.timeouts["prerun"] == 1800.0 and req.timeouts["setup"] == 90.0
    assert req.timeouts["datain"] == math.inf
    assert req.timeouts["teardown"] == SITE.timeout("teardown").default
    assert tuple(req.timeouts) == TIMEOUT_KEYS


def test_user_timeout_equal_to_the_maximum_is_accepted() -> None:
    assert accepted({"dw": JOBDW, "dw_timeout": {"prerun": "1h"}}).timeouts["prerun"] == 3600.0


def test_empty_dw_timeout_table_changes_nothing() -> None:
    assert accepted({"dw": JOBDW, "dw_timeout": {}}) == accepted({"dw": JOBDW})


def test_user_timeout_above_the_maximum_is_refused_not_clamped() -> None:
    message = refusal({"dw": JOBDW, "dw_timeout": {"prerun": "2h"}})
    assert message == "system.dw_timeout.prerun=2h exceeds the site maximum of 1h"


def test_numeric_user_timeout_above_the_maximum_is_shown_as_given() -> None:
    message = refusal({"dw": JOBDW, "dw_timeout": {"transient": 601}})
    assert message == "system.dw_timeout.transient=601 exceeds the site maximum of 10m"


def test_inf_above_a_finite_maximum_is_refused() -> None:
    message = refusal({"dw": JOBDW, "dw_timeout": {"teardown": "inf"}})
    assert message == "system.dw_timeout.teardown=inf exceeds the site maximum of 4h"


@pytest.mark.parametrize("value", ["5 minutes", "-1s", True, [1], None])
def test_invalid_user_duration_names_the_key(value: Any) -> None:
    message = refusal({"dw": JOBDW, "dw_timeout": {"postrun": value}})
    assert message.startswith(f"system.dw_timeout.postrun: invalid duration {value!r}")


@pytest.mark.parametrize("value", [0, "0s", "0ms", 0.0])
def test_zero_user_timeout_is_refused(value: Any) -> None:
    message = refusal({"dw": JOBDW, "dw_timeout": {"prerun": value}})
    assert message == 'system.dw_timeout.prerun: must be greater than 0 (use "inf" for no limit)'


def test_unknown_timeout_key_lists_the_valid_ones() -> None:
    message = refusal({"dw": JOBDW, "dw_timeout": {"pre_run": "5m"}})
    assert (
        message == f"system.dw_timeout.pre_run: unknown timeout; valid: {', '.join(TIMEOUT_KEYS)}"
    )


@pytest.mark.parametrize("value, kind", [("10m", "string"), (["prerun"], "array"), (5, "integer")])
def test_dw_timeout_must_be_a_table(value: Any, kind: str) -> None:
    message = refusal({"dw": JOBDW, "dw_timeout": value})
    assert message == (
        "system.dw_timeout must be a table of state=duration (e.g. -S dw_timeout.prerun=30m), "
        f"not {kind}"
    )


def test_sites_may_forbid_user_timeouts() -> None:
    strict = Policy(user_timeouts=False)
    message = refusal({"dw": JOBDW, "dw_timeout": {"prerun": "5m"}}, strict)
    assert message == "system.dw_timeout: this site does not let jobs set DWS timeouts"
    req = accepted({"dw": JOBDW, "dw_timeout": {}}, strict)
    assert dict(req.timeouts) == {key: strict.timeout(key).default for key in TIMEOUT_KEYS}


def test_describe_timeouts_in_flux_standard_duration() -> None:
    req = accepted({"dw": JOBDW, "dw_timeout": {"prerun": 90, "datain": "inf"}})
    described = req.describe_timeouts()
    assert list(described) == list(TIMEOUT_KEYS)
    assert described["prerun"] == "1.5m"
    assert described["datain"] == "inf"
    assert described["transient"] == "30s"


# ---- JSON -----------------------------------------------------------------------------------


def test_json_round_trip_through_text() -> None:
    req = accepted({"dw": "staged", "dw_timeout": {"datain": "inf", "setup": "1.5h"}})
    text = json.dumps(req.to_json(), allow_nan=False)  # Flux's jansson refuses NaN/Infinity
    again = DwRequest.from_json(json.loads(text))
    assert again == req
    assert again.preset == "staged" and again.timeouts["datain"] == math.inf
    assert hash(again) == hash(req)


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d: "not an object", "stored DWS request must be an object, not string"),
        (lambda d: {**d, "dw": []}, "'dw' must be a non-empty list of strings"),
        (lambda d: {**d, "dw": "#DW jobdw"}, "'dw' must be a non-empty list of strings"),
        (lambda d: {**d, "dw": ["#DW jobdw"]}, "stored DWS request: dw: #DW directive 0"),
        (lambda d: {**d, "timeouts": None}, "'timeouts' must be an object"),
        (lambda d: {**d, "timeouts": {"prerun": 5}}, "'timeouts' must have exactly the keys"),
        (lambda d: {**d, "user_timeouts": {"bogus": 5}}, "'user_timeouts' has unknown keys"),
        (lambda d: {**d, "user_timeouts": {"prerun": "x"}}, "user_timeouts: invalid duration"),
        (lambda d: {**d, "preset": 5}, "'preset' must be a string or null"),
    ],
)
def test_from_json_refuses_damaged_data(mutate: Any, message: str) -> None:
    data = accepted({"dw": JOBDW}).to_json()
    with pytest.raises(RequestError, match=message.replace("(", r"\(").replace(")", r"\)")):
        DwRequest.from_json(mutate(data))


# ---- fuzz -----------------------------------------------------------------------------------

_directive_texts = st.sampled_from(
    [JOBDW, COPY_IN, CONTAINER, GFS2, CREATE, DESTROY, "#DW PreRun action=wait", "#DW jobdw"]
)
_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(),
    st.text(max_size=12),
    st.sampled_from(["30s", "5m", "2h", "inf", "0", "1e400", "small", "staged", "large"]),
)
_dw_values = st.one_of(
    _scalars,
    _directive_texts,
    st.lists(_directive_texts, min_size=1, max_size=3),
    st.lists(_directive_texts, min_size=1, max_size=3).map("\n".join),
    st.lists(st.one_of(_directive_texts, _scalars), max_size=3),
)
_timeout_values = st.one_of(
    _scalars,
    st.dictionaries(
        st.one_of(st.sampled_from(TIMEOUT_KEYS), st.text(max_size=6)),
        st.one_of(st.sampled_from(["1s", "10m", "1h", "3h", "inf", 0, 30, 1e9]), _scalars),
        max_size=4,
    ),
)
_good_dw = st.sampled_from(
    [JOBDW, [JOBDW, COPY_IN], [GFS2, CONTAINER], "small", "staged", CREATE, DESTROY]
)
_good_timeouts = st.dictionaries(
    st.sampled_from(TIMEOUT_KEYS),
    st.sampled_from(["1s", "10m", "1h", "3h", "inf", 30, 0.5, 1e9]),
    max_size=4,
)
_systems = st.one_of(
    st.fixed_dictionaries({"dw": _good_dw}, optional={"dw_timeout": _good_timeouts}),
    st.fixed_dictionaries({"dw": _good_dw}, optional={"dw_timeout": _timeout_values}),
    st.fixed_dictionaries({}, optional={"dw": _dw_values, "dw_timeout": _timeout_values}),
    st.none(),
    _scalars,
    st.dictionaries(st.text(max_size=4), _scalars, max_size=3),
)
_policies = st.sampled_from(
    [SITE, Policy(), Policy(user_timeouts=False), Policy(restrict_persistent=False)]
)


@settings(max_examples=400, deadline=None)
@given(_systems, _policies, st.sampled_from([OWNER, USER]))
def test_random_attributes_raise_only_request_errors(
    system: Any, policy: Policy, userid: int
) -> None:
    try:
        req = request(system, policy, userid)
    except RequestError as exc:
        assert "\n" not in str(exc)
        return
    if req is None:
        assert not isinstance(system, dict) or "dw" not in system
        return
    assert tuple(req.timeouts) == TIMEOUT_KEYS
    for key, seconds in req.timeouts.items():
        assert 0 < seconds <= policy.timeout(key).maximum
    assert set(req.user_timeouts) <= set(TIMEOUT_KEYS)
    assert DwRequest.from_json(json.loads(json.dumps(req.to_json(), allow_nan=False))) == req
