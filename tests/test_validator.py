# SPDX-License-Identifier: LGPL-3.0-only
"""The job-ingest validator: which jobs it checks, what it says, and how a bad [dws] table shows.

The request rules themselves are tested in test_request.py; here the point is that the
validator relays them unchanged, uses the submitting user and the instance owner the right
way round, leaves other jobs alone, and that the module loads the way flux-core loads it.
"""

from __future__ import annotations

import errno
import importlib
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import flux_dws.validator as validator_module
from flux_dws.base.errors import PolicyError, RequestError
from flux_dws.core.jobspec import MAX_NESTING, OWN_SSD, WHOLE_NODES, rabbit_resources
from flux_dws.core.policy import policy_from_table
from flux_dws.core.request import request_from_attributes
from flux_dws.core.storage import PER_COMPUTE, AllocationNeed, StorageError
from flux_dws.flux.bindings import bindings_problem
from flux_dws.validator import DwsValidator, is_dws_job, site_policy, validate_attributes

OWNER = 1000
USER = 2000
JOBDW = "#DW jobdw type=xfs capacity=1GiB name=scratch"
CREATE = "#DW create_persistent name=keep type=lustre capacity=1TiB"
CONFIG = {"dws": {"timeouts": {"prerun": {"max": "1h"}}}, "ingest": {"validator": {}}}
SITE = policy_from_table(CONFIG["dws"])


def job(system: Any, userid: int = USER) -> SimpleNamespace:
    """A job as flux-core hands it to validate(): attributes only matter here."""
    jobspec = {"version": 1, "attributes": {"system": system}, "tasks": [], "resources": []}
    return SimpleNamespace(jobspec=jobspec, userid=userid, flags=0, urgency=16)


def configured(config: dict[str, Any] = CONFIG) -> DwsValidator:
    plugin = DwsValidator(parser=None)
    plugin.use_config(config, OWNER)
    return plugin


# ---- validate_attributes: the pure check ----------------------------------------------------


@pytest.mark.parametrize(
    "system",
    [
        {"dw": JOBDW, "dw_timeout": {"prerun": "2h"}},
        {"dw": "#DW jobdw type=xfs name=s"},
        {"dw": "nosuchpreset"},
        {"dw_timeout": {"prerun": "10m"}},
        {"dw": [JOBDW, 7]},
    ],
)
def test_rejection_is_the_request_error_message(system: dict[str, Any]) -> None:
    with pytest.raises(RequestError) as info:
        request_from_attributes(system, SITE, userid=USER, owner_uid=OWNER)
    assert validate_attributes(system, SITE, USER, OWNER) == str(info.value)


def test_timeout_above_the_site_maximum_names_both() -> None:
    reason = validate_attributes({"dw": JOBDW, "dw_timeout": {"prerun": "2h"}}, SITE, USER, OWNER)
    assert reason == "system.dw_timeout.prerun=2h exceeds the site maximum of 1h"


@pytest.mark.parametrize(
    "system", [None, {}, {"duration": 60}, {"dw": JOBDW}, {"dw": JOBDW, "dw_timeout": {}}]
)
def test_acceptable_attributes_give_no_reason(system: Any) -> None:
    assert validate_attributes(system, SITE, USER, OWNER) is None


def test_persistent_storage_is_checked_against_the_submitting_user() -> None:
    system = {"dw": CREATE}
    assert validate_attributes(system, SITE, OWNER, OWNER) is None
    reason = validate_attributes(system, SITE, USER, OWNER)
    assert reason is not None and f"uid {OWNER}" in reason


# ---- DwsValidator: what flux-core sees --------------------------------------------------------


def test_bad_job_is_rejected_with_einval_and_the_message() -> None:
    result = configured().validate(job({"dw": JOBDW, "dw_timeout": {"prerun": "2h"}}))
    assert result == (errno.EINVAL, "system.dw_timeout.prerun=2h exceeds the site maximum of 1h")


def test_good_job_is_accepted() -> None:
    assert configured().validate(job({"dw": JOBDW, "dw_timeout": {"prerun": "30m"}})) is None


def test_validate_uses_the_job_userid_and_the_configured_owner() -> None:
    plugin = configured()
    assert plugin.validate(job({"dw": CREATE}, userid=OWNER)) is None
    result = plugin.validate(job({"dw": CREATE}, userid=USER))
    assert result is not None and result[0] == errno.EINVAL


@pytest.mark.parametrize(
    "jobspec",
    [
        {"attributes": {"system": {"duration": 0}}},
        {"attributes": {}},
        {"attributes": ["not", "a", "table"]},
        {"attributes": {"system": "not a table"}},
        "not a jobspec",
    ],
)
def test_jobs_without_dws_attributes_pass_even_with_a_bad_config(jobspec: Any) -> None:
    plugin = configured({"dws": {"timeouts": {"prerun": {"max": "5x"}}}})
    assert plugin.validate(SimpleNamespace(jobspec=jobspec, userid=USER)) is None


@pytest.mark.parametrize(
    ("attr", "value"),
    [
        ("dw_timeout", {"prerun": "1m"}),
        ("dw_failure_tolerance", 1),
        ("dw_release", "after-unmount"),
    ],
)
def test_a_dws_attribute_without_directives_is_refused_at_submit(attr: str, value: Any) -> None:
    """Without #DW the service never sees the job: the attribute would be silently ignored."""
    result = configured().validate(job({attr: value}))
    assert result == (
        errno.EINVAL,
        f"system.{attr} is set but system.dw is not: "
        + {
            "dw_timeout": "DWS timeouts apply",
            "dw_failure_tolerance": "failure tolerance applies",
            "dw_release": "early release applies",
        }[attr]
        + " only to jobs with #DW directives",
    )


def test_bad_dws_table_rejects_every_dws_job_naming_the_key() -> None:
    plugin = configured({"dws": {"timeouts": {"prerun": {"max": "5x"}}}})
    for system in ({"dw": JOBDW}, {"dw_timeout": {"prerun": "1m"}}):
        result = plugin.validate(job(system))
        assert result is not None
        errnum, message = result
        assert errnum == errno.EINVAL
        assert "[dws] timeouts.prerun.max" in message and "\n" not in message


def test_bad_dws_table_is_logged_once_for_the_admin(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("ERROR", logger="flux-dws.validator"):
        configured({"dws": {"namespce": "x"}})
    assert len(caplog.records) == 1
    assert "namespce" in caplog.records[0].getMessage()


def test_an_unconfigured_validator_refuses_dws_jobs_rather_than_guess() -> None:
    result = DwsValidator(parser=None).validate(job({"dw": JOBDW}))
    assert result is not None and result[0] == errno.EINVAL


def test_site_policy_returns_the_error_instead_of_raising() -> None:
    assert site_policy({}) == policy_from_table(None)
    assert isinstance(site_policy({"dws": {"restrict-persistent": "yes"}}), PolicyError)


def test_is_dws_job() -> None:
    assert is_dws_job({"dw": "x"}) and is_dws_job({"dw_timeout": {}})
    assert not is_dws_job({"duration": 1}) and not is_dws_job(None) and not is_dws_job("dw")


# ---- loading ----------------------------------------------------------------------------------


def test_module_imports_without_flux(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [m for m in sys.modules if m == "flux" or m.startswith("flux.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "flux", None)  # any "import flux" now fails
    module = importlib.reload(validator_module)
    assert module.validate_attributes({"dw": JOBDW}, SITE, USER, OWNER) is None
    with pytest.raises(ImportError):
        module.Validator  # noqa: B018 - the class needs flux-core, and says so


def test_flux_core_loads_the_file_as_a_validator_plugin() -> None:
    """flux-core imports non-namespace plugins by file path and instantiates ``Validator``."""
    problem = bindings_problem()
    if problem:
        pytest.skip(problem)
    importer = pytest.importorskip("flux.importer")
    plugin_base = pytest.importorskip("flux.job.validator").ValidatorPlugin
    module = importer.import_path(str(Path(validator_module.__file__)))
    assert issubclass(module.Validator, plugin_base)
    plugin = module.Validator(parser=None)
    plugin.use_config(CONFIG, OWNER)
    assert plugin.validate(job({"dw": JOBDW})) is None
    assert plugin.validate(job({"dw": "#DW jobdw capacity=1GiB name=scratch"})) is not None


LOAD_BY_PATH = """
import importlib.util, sys
spec = importlib.util.spec_from_file_location("validator", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
print(sys.modules["flux_dws"].__file__)
print(module.validate_attributes({"dw": "#DW jobdw type=xfs capacity=1GiB"}, module.Policy(), 0, 0))
print("kubernetes" in sys.modules)
"""


def test_loaded_by_path_it_works_in_a_python_without_flux_dws(tmp_path: Path) -> None:
    """As job-ingest loads it: by file path, in a Python where flux-dws is not installed."""
    path = Path(validator_module.__file__)
    bare = subprocess.run(  # -S: no site-packages, so neither flux_dws nor kubernetes
        [sys.executable, "-S", "-c", "import flux_dws"], capture_output=True, cwd=tmp_path
    )
    assert bare.returncode != 0
    done = subprocess.run(
        [sys.executable, "-S", "-c", LOAD_BY_PATH, str(path)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    where, reason, kubernetes = done.stdout.splitlines()
    assert where == str(path.parent / "__init__.py")
    assert "missing required key 'name'" in reason
    assert kubernetes == "False"


# --------------------------------------------------------------------------- check-validator


def test_check_judges_what_flux_job_validator_answered() -> None:
    from flux_dws.cli.checkvalidator import judge

    accepted, refused = '{"errnum": 0}', '{"errnum": 22, "errstr": "system.dw: bad"}'
    assert judge("v.py", f"{accepted}\n{refused}\n", "").ok
    crashed = judge("v.py", "", "Traceback...\nModuleNotFoundError: No module named 'yaml'\n")
    assert not crashed.ok and "No module named 'yaml'" in crashed.message
    assert "every submission would fail" in crashed.message
    assert not judge("v.py", f"{refused}\n{refused}\n", "").ok  # a plain job refused
    assert not judge("v.py", f"{accepted}\n{accepted}\n", "").ok  # #DW not checked
    bad_table = '{"errnum": 22, "errstr": "this instance\'s DWS configuration is invalid (x)"}'
    assert not judge("v.py", f"{accepted}\n{bad_table}\n", "", under_instance=True).ok
    assert judge("v.py", f"{accepted}\n{bad_table}\n", "", under_instance=False).ok


@pytest.mark.realflux
def test_check_validator_runs_job_ingest_s_own_loader(tmp_path: Path) -> None:
    from flux_dws.cli.checkvalidator import check
    from flux_dws.testing.fluxsetup import real_flux_problem

    if real_flux_problem():
        pytest.skip(real_flux_problem())
    assert check().ok, check().message
    broken = tmp_path / "validator.py"
    broken.write_text("import kubernetes_is_not_here\n")
    verdict = check(str(broken))
    assert not verdict.ok and str(broken) in verdict.message


# ---- ssd and shapes, with rabbit scheduling (issue 22) -------------------------------------

RABBITS = {"dws": {"rabbit-scheduling": True}}
TASK = {"type": "slot", "count": 1, "label": "task", "with": [{"type": "core", "count": 1}]}
WHOLE = [{"type": "node", "count": 2, "with": [TASK]}]  # flux run -N2
WITH_SSD = [{"type": "node", "count": 1, "with": [TASK, {"type": "ssd", "count": 100}]}]


def spec(system: Any, resources: Any) -> SimpleNamespace:
    jobspec = {"version": 1, "attributes": {"system": system}, "tasks": [], "resources": resources}
    return SimpleNamespace(jobspec=jobspec, userid=USER, flags=0, urgency=16)


def test_a_job_without_dw_that_asks_for_ssd_is_refused_where_fluxion_holds_the_rabbits() -> None:
    """Such a job took rabbit SSD in Fluxion that DWS knew nothing of (it passed untouched)."""
    plugin = configured(RABBITS)
    ssd = [{"type": "slot", "count": 1, "label": "task", "with": [WITH_SSD[0]]}]
    for resources in (WITH_SSD, ssd, [{"type": "ssd", "count": 1}]):
        assert plugin.validate(spec({"duration": 60}, resources)) == (errno.EINVAL, OWN_SSD)
    assert plugin.validate(spec({"duration": 60}, WHOLE)) is None
    assert plugin.validate(spec(None, [TASK])) is None
    # where Fluxion does not hold the rabbits, ssd is not flux-dws's to refuse
    assert configured({"dws": {}}).validate(spec({}, WITH_SSD)) is None
    # a typo elsewhere in the table does not let such a job by
    broken = configured({"dws": {"rabbit-scheduling": True, "namespce": "x"}})
    assert broken.validate(spec({}, WITH_SSD)) == (errno.EINVAL, OWN_SSD)
    assert broken.validate(spec({}, WHOLE)) is None
    assert validate_attributes({}, policy_from_table(RABBITS["dws"]), USER, OWNER, WITH_SSD) == (
        OWN_SSD
    )


@pytest.mark.parametrize(
    "resources",
    [
        [TASK],  # flux run -n1: no node at all
        [{"type": "cluster", "count": 1, "with": WHOLE}],
        WHOLE + WHOLE,  # two top-level entries
        [{"type": "slot", "count": 2, "label": "task", "with": [{"type": "core", "count": 1}]}],
    ],
)
def test_a_shape_the_rewrite_cannot_take_is_refused_at_submit_with_the_release_s_words(
    resources: Any,
) -> None:
    """It passed at submit and failed only at release, after its workflow was made."""
    plugin = configured(RABBITS)
    with pytest.raises(StorageError) as release:
        rabbit_resources(resources, [AllocationNeed("bd", ("d", "s"), "xfs", PER_COMPUTE, 1)], {})
    assert str(release.value) == WHOLE_NODES
    assert plugin.validate(spec({"dw": JOBDW}, resources)) == (errno.EINVAL, WHOLE_NODES)
    # a #DW job with no rabbit storage is not rewritten: any shape goes
    assert plugin.validate(spec({"dw": "#DW Setup action=complete"}, resources)) is None
    # and without rabbit scheduling nothing is rewritten either
    assert configured({"dws": {}}).validate(spec({"dw": JOBDW}, resources)) is None


def test_shapes_the_rewrite_takes_pass() -> None:
    plugin = configured(RABBITS)
    chassis = [{"type": "chassis", "count": 1, "with": WHOLE}]
    node_and_ssd = [{"type": "node", "count": 1}, {"type": "ssd", "count": 1}]
    users_own = [{"type": "slot", "count": 2, "label": "task", "with": node_and_ssd}]
    for resources in (WHOLE, chassis, users_own, None):
        assert plugin.validate(spec({"dw": JOBDW}, resources)) is None, resources


def test_a_jobspec_nested_as_deep_as_json_allows_is_answered_not_crashed() -> None:
    """has_ssd recursed, two frames a level: resources nested 480 deep (960 JSON levels,
    which job-ingest's Python still reads) raised RecursionError in the validator."""

    def nested(bottom: dict[str, Any]) -> list[dict[str, Any]]:
        deep = bottom
        for _ in range(480):
            deep = {"type": "slot", "count": 1, "label": "task", "with": [deep]}
        return [{"type": "node", "count": 1, "with": [deep]}]

    plugin = configured(RABBITS)
    too_deep = (errno.EINVAL, f"the job's resources nest more than {MAX_NESTING} levels deep")
    plain = nested({"type": "core", "count": 1})
    assert plugin.validate(spec({}, plain)) is None
    assert plugin.validate(spec({"dw": JOBDW}, plain)) == too_deep
    ssd = nested({"type": "ssd", "count": 1})
    assert plugin.validate(spec({}, ssd)) == (errno.EINVAL, OWN_SSD)
    assert plugin.validate(spec({"dw": JOBDW}, ssd)) == (errno.EINVAL, OWN_SSD)
