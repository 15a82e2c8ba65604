# SPDX-License-Identifier: LGPL-3.0-only
"""The site's [dws] table -> Policy: defaults, every key, every error, config directories."""

from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flux_dws.base.errors import PolicyError
from flux_dws.base.frozen import FrozenMap
from flux_dws.core.policy import (
    CONFIG_KEYS,
    COUNT_BOUNDS,
    DEFAULT_TIMEOUTS,
    TIMEOUT_KEYS,
    Policy,
    TimeoutBound,
    load_policy,
    policy_from_table,
)
from flux_dws.core.states import STATE_KEYS

EXAMPLE = Path(__file__).resolve().parent.parent / "doc" / "dws.toml.example"
JOBDW = "#DW jobdw type=xfs capacity=10GiB name=scratch"


def error_of(table: Any) -> str:
    with pytest.raises(PolicyError) as info:
        policy_from_table(table)
    return str(info.value)


# ---- defaults -------------------------------------------------------------------------------


@pytest.mark.parametrize("table", [None, {}])
def test_empty_table_gives_the_defaults(table: Any) -> None:
    policy = policy_from_table(table)
    assert policy == Policy()
    assert policy.namespace == "default"
    assert policy.kubeconfig is None and policy.instance is None
    assert policy.restrict_persistent is True and policy.user_timeouts is True
    assert policy.api_alarm == 120.0 and policy.service_wait == math.inf
    assert dict(policy.presets) == {}
    assert tuple(policy.timeouts) == TIMEOUT_KEYS


def test_timeout_keys_are_the_states_then_transient() -> None:
    assert TIMEOUT_KEYS == STATE_KEYS + ("transient",)


def test_default_bounds_are_sane() -> None:
    policy = Policy()
    for key in TIMEOUT_KEYS:
        bound = policy.timeout(key)
        assert 0 < bound.default <= bound.maximum
    # The DWS errors guide recommends 30 s of TransientCondition before tearing down.
    assert policy.timeout("transient") == TimeoutBound(30.0, 600.0)


def test_unknown_timeout_key_is_a_key_error_naming_it() -> None:
    with pytest.raises(KeyError, match="bogus"):
        Policy().timeout("bogus")


def test_policy_is_frozen_and_hashable() -> None:
    a = policy_from_table({"presets": {"small": JOBDW}, "timeouts": {"prerun": {"max": "3h"}}})
    b = policy_from_table({"presets": {"small": [JOBDW]}, "timeouts": {"prerun": {"max": "3h"}}})
    assert a == b and hash(a) == hash(b)
    assert len({a, b, Policy()}) == 2
    with pytest.raises(TypeError):
        a.presets["other"] = ("x",)  # type: ignore[index]
    with pytest.raises(TypeError):
        a.timeouts["prerun"] = TimeoutBound(1, 2)  # type: ignore[index]


def test_policy_constructed_directly_is_frozen_and_filled() -> None:
    policy = Policy(timeouts={"prerun": TimeoutBound(5.0, 10.0)}, presets={"p": [JOBDW]})
    assert isinstance(policy.timeouts, FrozenMap) and isinstance(policy.presets, FrozenMap)
    assert policy.timeout("prerun") == TimeoutBound(5.0, 10.0)
    assert policy.timeout("setup") == DEFAULT_TIMEOUTS["setup"]
    assert policy.presets["p"] == (JOBDW,)
    hash(policy)


def test_policy_constructed_with_unknown_timeout_key_is_refused() -> None:
    with pytest.raises(PolicyError, match="'bogus'"):
        Policy(timeouts={"bogus": TimeoutBound(1.0, 2.0)})


# ---- every key ------------------------------------------------------------------------------


def test_every_key_is_read() -> None:
    policy = policy_from_table(
        {
            "namespace": "flux-jobs",
            "kubeconfig": "/etc/flux/dws/kubeconfig",
            "instance": "cluster1",
            "restrict-persistent": False,
            "user-timeouts": False,
            "workflow-version": "v1alpha7",
            "nnf-version": "v1alpha10",
            "api-alarm": "5m",
            "service-wait": "1h",
            "presets": {"small": JOBDW},
            "timeouts": {"prerun": {"default": "10m", "max": "1h"}, "transient": {"max": "inf"}},
        }
    )
    assert policy.namespace == "flux-jobs"
    assert policy.kubeconfig == "/etc/flux/dws/kubeconfig"
    assert policy.instance == "cluster1"
    assert policy.restrict_persistent is False and policy.user_timeouts is False
    assert policy.workflow_version == "v1alpha7" and policy.nnf_version == "v1alpha10"
    assert policy.api_alarm == 300.0 and policy.service_wait == 3600.0
    assert policy.presets == {"small": (JOBDW,)}
    assert policy.timeout("prerun") == TimeoutBound(600.0, 3600.0)
    assert policy.timeout("transient") == TimeoutBound(30.0, math.inf)
    assert policy.timeout("setup") == DEFAULT_TIMEOUTS["setup"]


def test_numbers_of_seconds_and_inf_are_durations() -> None:
    policy = policy_from_table(
        {"api-alarm": 90, "timeouts": {"datain": {"default": 7200.5, "max": "inf"}}}
    )
    assert policy.api_alarm == 90.0
    assert policy.timeout("datain") == TimeoutBound(7200.5, math.inf)


def test_lone_max_lowers_the_builtin_default_to_meet_it() -> None:
    policy = policy_from_table({"timeouts": {"prerun": {"max": "5m"}}})
    assert policy.timeout("prerun") == TimeoutBound(300.0, 300.0)


def test_lone_max_above_the_default_keeps_the_default() -> None:
    policy = policy_from_table({"timeouts": {"prerun": {"max": "8h"}}})
    assert policy.timeout("prerun") == TimeoutBound(DEFAULT_TIMEOUTS["prerun"].default, 28800.0)


def test_lone_default_raises_the_builtin_max_to_meet_it() -> None:
    policy = policy_from_table({"timeouts": {"datain": {"default": "48h"}}})
    assert policy.timeout("datain") == TimeoutBound(172800.0, 172800.0)


def test_empty_timeout_table_keeps_the_builtin_bound() -> None:
    policy = policy_from_table({"timeouts": {"setup": {}}})
    assert policy.timeout("setup") == DEFAULT_TIMEOUTS["setup"]


def test_presets_are_normalised_directive_texts() -> None:
    two = f"{JOBDW}\n  #DW   copy_in source=/lus/in   destination=$DW_JOB_scratch/in"
    policy = policy_from_table({"presets": {"two": two, "list": [JOBDW, "#DW PreRun action=wait"]}})
    assert policy.presets["two"] == (
        JOBDW,
        "#DW copy_in source=/lus/in destination=$DW_JOB_scratch/in",
    )
    assert policy.presets["list"] == (JOBDW, "#DW PreRun action=wait")


# ---- every error ----------------------------------------------------------------------------


def test_unknown_top_level_key_suggests_the_right_one() -> None:
    assert error_of({"namspace": "x"}) == "[dws] unknown key 'namspace' (did you mean 'namespace'?)"


def test_unknown_top_level_key_without_a_near_match_lists_the_keys() -> None:
    message = error_of({"zzz": 1})
    assert message.startswith("[dws] unknown key 'zzz' (known: namespace, ")
    assert all(key in message for key in CONFIG_KEYS)


def test_underscore_spelling_is_unknown() -> None:
    # Flux config keys use hyphens; the Python field name is not a config key.
    assert "did you mean 'user-timeouts'" in error_of({"user_timeouts": True})


def test_table_that_is_not_a_table() -> None:
    assert error_of(["x"]) == "[dws] must be a table, not array"


@pytest.mark.parametrize(
    "table, message",
    [
        (
            {"timeouts": {"prerun": {"max": "5x"}}},
            "[dws] timeouts.prerun.max: invalid duration '5x'",
        ),
        (
            {"timeouts": {"setup": {"default": -3}}},
            "[dws] timeouts.setup.default: invalid duration",
        ),
        ({"timeouts": {"setup": {"default": True}}}, "[dws] timeouts.setup.default: invalid"),
        ({"api-alarm": "soon"}, "[dws] api-alarm: invalid duration 'soon'"),
        ({"service-wait": [1]}, "[dws] service-wait: invalid duration [1]"),
    ],
)
def test_invalid_durations_name_the_full_key(table: Any, message: str) -> None:
    assert error_of(table).startswith(message)


@pytest.mark.parametrize(
    "table, key",
    [
        ({"timeouts": {"prerun": {"default": "0s"}}}, "timeouts.prerun.default"),
        ({"timeouts": {"transient": {"max": 0}}}, "timeouts.transient.max"),
        ({"api-alarm": "0"}, "api-alarm"),
        ({"service-wait": 0.0}, "service-wait"),
    ],
)
def test_zero_durations_are_refused(table: Any, key: str) -> None:
    assert error_of(table) == f'[dws] {key}: must be greater than 0 (use "inf" for no limit)'


def test_default_above_max_names_the_key() -> None:
    message = error_of({"timeouts": {"prerun": {"default": "2h", "max": "1h"}}})
    assert message == "[dws] timeouts.prerun: default 2h exceeds max 1h"


def test_inf_default_needs_inf_max() -> None:
    message = error_of({"timeouts": {"teardown": {"default": "inf", "max": "4h"}}})
    assert message == "[dws] timeouts.teardown: default inf exceeds max 4h"


def test_unknown_timeout_key_suggests() -> None:
    message = error_of({"timeouts": {"prerunn": {"max": "1h"}}})
    assert message == "[dws] unknown key 'timeouts.prerunn' (did you mean 'timeouts.prerun'?)"


def test_unknown_timeout_subkey_suggests() -> None:
    message = error_of({"timeouts": {"prerun": {"maximum": "1h"}}})
    assert (
        message
        == "[dws] unknown key 'timeouts.prerun.maximum' (did you mean 'timeouts.prerun.max'?)"
    )


@pytest.mark.parametrize(
    "table, message",
    [
        ({"timeouts": "1h"}, "[dws] timeouts: must be a table, not string"),
        ({"timeouts": {"prerun": "10m"}}, "[dws] timeouts.prerun: must be a table, not string"),
        ({"presets": ["a"]}, "[dws] presets: must be a table, not array"),
        ({"namespace": 5}, "[dws] namespace: must be a string, not integer"),
        ({"namespace": ""}, "[dws] namespace: must not be empty"),
        ({"kubeconfig": {"a": 1}}, "[dws] kubeconfig: must be a string, not table"),
        ({"restrict-persistent": "yes"}, "[dws] restrict-persistent: must be true or false"),
        ({"user-timeouts": 1}, "[dws] user-timeouts: must be true or false, not integer 1"),
    ],
)
def test_wrong_types_name_the_key(table: Any, message: str) -> None:
    assert error_of(table).startswith(message)


@pytest.mark.parametrize("value", ["Flux", "a_b", "-a", "a" * 64, "default\n"])
def test_namespace_must_be_a_kubernetes_name(value: str) -> None:
    assert error_of({"namespace": value}).startswith(f"[dws] namespace: invalid value {value!r}")


@pytest.mark.parametrize("key", ["workflow-version", "nnf-version"])
@pytest.mark.parametrize("value", ["1alpha7", "v1alpha", "valpha1", "v1alpha7 "])
def test_api_versions_must_look_like_versions(key: str, value: str) -> None:
    assert "Kubernetes API version" in error_of({key: value})


@pytest.mark.parametrize("value", ["Cluster1", "a_b", "-x", "x" * 41])
def test_instance_must_be_a_valid_identity(value: str) -> None:
    message = error_of({"instance": value})
    assert message.startswith(f"[dws] instance: invalid instance identity {value!r}")


@pytest.mark.parametrize(
    "presets, message",
    [
        ({"small": 5}, "[dws] presets.small: must be a string or an array of strings, not integer"),
        ({"small": [JOBDW, 5]}, "[dws] presets.small: must be a string or an array of strings"),
        ({"small": ""}, "[dws] presets.small: must hold at least one #DW directive"),
        ({"small": []}, "[dws] presets.small: must hold at least one #DW directive"),
        ({"small": ["  "]}, "[dws] presets.small: must hold at least one #DW directive"),
        ({"has space": JOBDW}, "[dws] presets.has space: a preset name must be one word"),
        ({"#DW": JOBDW}, "[dws] presets.#DW: a preset name must be one word"),
    ],
)
def test_bad_presets_name_the_preset(presets: Any, message: str) -> None:
    assert error_of({"presets": presets}).startswith(message)


def test_preset_directive_errors_name_the_preset_and_directive() -> None:
    message = error_of({"presets": {"big": [JOBDW, "#DW jobdw type=xfs capacity=1GiB"]}})
    assert message.startswith("[dws] presets.big: #DW directive 1 (jobdw): missing required key")


def test_preset_without_dw_prefix_is_refused() -> None:
    message = error_of({"presets": {"big": "jobdw type=xfs capacity=1GiB name=x"}})
    assert message.startswith("[dws] presets.big: #DW directive 0:")


# ---- files and directories ------------------------------------------------------------------


def test_example_config_loads_and_documents_every_key() -> None:
    policy = load_policy(str(EXAMPLE))
    assert set(policy.presets) == {"small", "shared"}
    assert dict(policy.timeouts) == dict(DEFAULT_TIMEOUTS)
    # it holds exactly the defaults, but for what it marks as an example (the presets)
    assert dataclasses.replace(policy, presets={}) == Policy()
    text = EXAMPLE.read_text()
    for key in CONFIG_KEYS:
        assert f"{key} =" in text or f"[dws.{key}]" in text, key
    for key in TIMEOUT_KEYS:
        assert f"[dws.timeouts.{key}]" in text, key


def test_load_single_toml_file(tmp_path: Path) -> None:
    path = tmp_path / "flux.toml"
    path.write_text('[dws]\nnamespace = "jobs"\n[dws.timeouts.setup]\nmax = "8h"\n[other]\nx = 1\n')
    policy = load_policy(str(path))
    assert policy.namespace == "jobs"
    assert policy.timeout("setup").maximum == 8 * 3600.0


def test_file_without_dws_table_gives_defaults(tmp_path: Path) -> None:
    path = tmp_path / "flux.toml"
    path.write_text("[resource]\nnoverify = true\n")
    assert load_policy(str(path)) == Policy()


def test_load_json_file(tmp_path: Path) -> None:
    path = tmp_path / "flux.json"
    path.write_text('{"dws": {"namespace": "jobs", "service-wait": "10m"}}')
    policy = load_policy(str(path))
    assert policy.namespace == "jobs" and policy.service_wait == 600.0


def test_directory_merges_toml_files_in_sorted_order(tmp_path: Path) -> None:
    (tmp_path / "10-dws.toml").write_text(
        '[dws]\nnamespace = "first"\n[dws.timeouts.prerun]\ndefault = "20m"\nmax = "3h"\n'
    )
    (tmp_path / "20-dws.toml").write_text(
        '[dws]\nnamespace = "second"\n[dws.timeouts.prerun]\nmax = "4h"\n'
        f'[dws.presets]\nsmall = "{JOBDW}"\n'
    )
    (tmp_path / "99-ignored.toml.bak").write_text("this is not toml [")
    (tmp_path / "README").write_text("not config")
    (tmp_path / ".hidden.toml").write_text("[dws]\nnamespace = 'hidden'\n")  # glob skips it
    policy = load_policy(str(tmp_path))
    assert policy.namespace == "second"  # the later file wins
    assert policy.timeout("prerun") == TimeoutBound(1200.0, 14400.0)  # tables merge
    assert policy.presets == {"small": (JOBDW,)}


def test_empty_directory_gives_defaults(tmp_path: Path) -> None:
    assert load_policy(str(tmp_path)) == Policy()


def test_bad_toml_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "dws.toml"
    path.write_text("[dws]\nnamespace = \n")
    with pytest.raises(PolicyError) as info:
        load_policy(str(tmp_path))
    assert str(info.value).startswith(f"{path}: ")
    assert "\n" not in str(info.value)


def test_bad_value_in_directory_names_the_key(tmp_path: Path) -> None:
    (tmp_path / "dws.toml").write_text("[dws.timeouts.prerun]\nmax = '5x'\n")
    with pytest.raises(PolicyError, match=r"^\[dws\] timeouts.prerun.max: invalid duration '5x'"):
        load_policy(str(tmp_path))


def test_missing_path_is_a_policy_error(tmp_path: Path) -> None:
    missing = os.path.join(str(tmp_path), "nope.toml")
    with pytest.raises(PolicyError, match=f"cannot read config {missing}"):
        load_policy(missing)


def test_unreadable_file_in_directory_is_a_policy_error(tmp_path: Path) -> None:
    (tmp_path / "dws.toml").symlink_to(tmp_path / "gone.toml")  # dangling, even root fails
    with pytest.raises(PolicyError, match="cannot read config"):
        load_policy(str(tmp_path))


# ---- fuzz -----------------------------------------------------------------------------------

_durations = st.sampled_from(["30s", "5m", "1.5h", "2d", "inf", "0", "5x", "-1s", "", "1e400"])
_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(),
    st.text(max_size=20),
    _durations,
    st.sampled_from([JOBDW, "#DW container name=c profile=p", "#DW jobdw", "cluster1", "v1alpha7"]),
)
_keys = st.one_of(
    st.sampled_from(CONFIG_KEYS + TIMEOUT_KEYS + ("default", "max", "small", "namspace")),
    st.text(max_size=8),
)
_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(_keys, inner, max_size=4)),
    max_leaves=12,
)
_timeout_tables = st.dictionaries(
    st.sampled_from(TIMEOUT_KEYS),
    st.dictionaries(st.sampled_from(["default", "max"]), st.one_of(_durations, _scalars)),
    max_size=4,
)


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(
        st.dictionaries(_keys, _values, max_size=6),
        st.fixed_dictionaries({"timeouts": _timeout_tables}),
        st.fixed_dictionaries({"presets": st.dictionaries(_keys, _values, max_size=3)}),
        _values,
    )
)
def test_random_tables_raise_only_policy_errors(table: Any) -> None:
    try:
        policy = policy_from_table(table)
    except PolicyError as exc:
        assert "\n" not in str(exc)
        assert str(exc).startswith("[dws]")
        return
    hash(policy)
    for key in TIMEOUT_KEYS:
        bound = policy.timeout(key)
        assert 0 < bound.default <= bound.maximum


def test_heartbeat_is_a_finite_positive_duration():
    assert policy_from_table({}).heartbeat == 10.0
    assert policy_from_table({"heartbeat": "2s"}).heartbeat == 2.0
    for bad, message in (("inf", "finite"), ("0", "greater than 0"), ("soon", "invalid")):
        with pytest.raises(PolicyError, match=f"heartbeat: .*{message}"):
            policy_from_table({"heartbeat": bad})


def test_max_proposals_is_a_count_and_zero_means_no_limit():
    assert policy_from_table({}).max_proposals == 16
    assert policy_from_table({"max-proposals": 0}).max_proposals == 0
    assert policy_from_table({"max-proposals": 200}).max_proposals == 200
    for bad, message in ((-1, "0 \\(no limit\\) to 10000, not -1"), ("16", "not string"),
                         (True, "integer, not boolean"), (1.5, "integer, not float")):  # fmt: skip
        with pytest.raises(PolicyError, match=f"^\\[dws\\] max-proposals: .*{message}"):
            policy_from_table({"max-proposals": bad})


@pytest.mark.parametrize("key", sorted(COUNT_BOUNDS))
def test_every_count_is_bounded_both_ways_naming_the_key_and_the_range(key: str) -> None:
    """issue 22: ``api-threads = 10**30`` made the service build ``range(threads)`` threads."""
    least, most = COUNT_BOUNDS[key]
    field = key.replace("-", "_")
    assert getattr(policy_from_table({key: least}), field) == least
    assert getattr(policy_from_table({key: most}), field) == most
    assert least <= getattr(Policy(), field) <= most  # the default is inside
    for bad in (most + 1, 10**30, least - 1, -(10**5000)):
        message = error_of({key: bad})
        assert message.startswith(f"[dws] {key}: must be from {least}")
        assert f"to {most}, not " in message and "\n" not in message and len(message) < 200


def test_api_threads_needs_one_for_moves_and_one_for_the_rest():
    assert policy_from_table({}).api_threads == 4
    assert policy_from_table({"api-threads": 12}).api_threads == 12
    for bad, message in ((1, "must be from 2 to 64, not 1"), (0, "2 to 64"), ("4", "not string")):
        with pytest.raises(PolicyError, match=f"^\\[dws\\] api-threads: .*{message}"):
            policy_from_table({"api-threads": bad})
