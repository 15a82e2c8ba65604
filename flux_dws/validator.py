# SPDX-License-Identifier: LGPL-3.0-only
"""Reject a bad #DW job at submit time: a flux-core job-ingest validator plugin.

Everything :func:`flux_dws.core.request.request_from_attributes` refuses (a bad directive, an
unknown preset, a timeout above the site maximum, ...) would otherwise fail the job later,
in DEPEND.  Checking at ingest turns that into an error from ``flux submit`` itself, with the
same one-line message.  Enable it in the instance config (flux-core loads plugins that are
not in its namespace by file path)::

    [ingest.validator]
    plugins = ["jobspec", "/path/to/flux_dws/validator.py"]

It needs nothing but the standard library and this package, which it loads from beside
itself when flux-core loads it by path, so it works in job-ingest's Python even when
flux-dws was installed into another one.

The policy is the instance's ``[dws]`` table, read once when the validator process starts.
job-ingest restarts its validators on ``flux config reload`` (and whenever they were idle),
so a changed table is picked up there.  A bad table rejects every #DW job with a message
that names the bad key (and tells the admin, through the broker log) rather than accepting
jobs the service will refuse; jobs without #DW pass untouched either way, but for one
rule: with ``rabbit-scheduling`` (read from the table even when the rest of it is bad), a
job without #DW that asks for ``ssd`` is refused, since only flux-dws's rewrite of a #DW job
may ask Fluxion for rabbit storage.

The checks themselves are :func:`flux_dws.core.request.validate_attributes`.  flux is imported
only when flux-core instantiates the plugin, so they and :class:`DwsValidator` import and test
without flux-core.
"""

from __future__ import annotations

import errno
import importlib.util
import logging
import os
import sys
from collections.abc import Mapping
from typing import Any


def _load_own_package() -> None:
    """When job-ingest loads this file by path, import ``flux_dws`` from beside it.

    flux-core imports a validator file as a lone module, in its own Python, which need not
    be the Python flux-dws was installed into.  What the validator uses (the modules below)
    is standard library only, so loading the package this file belongs to, by path, makes
    the validator work in any Python 3.9+, without putting another Python's site-packages on
    ``sys.path``.  ``flux dws check-validator`` checks it in job-ingest's Python.
    """
    if __name__ == "flux_dws.validator" or "flux_dws" in sys.modules:
        return
    here = os.path.dirname(os.path.abspath(__file__))
    spec = importlib.util.spec_from_file_location(
        "flux_dws", os.path.join(here, "__init__.py"), submodule_search_locations=[here]
    )
    assert spec is not None and spec.loader is not None
    package = importlib.util.module_from_spec(spec)
    sys.modules["flux_dws"] = package
    spec.loader.exec_module(package)


_load_own_package()

from flux_dws.base.errors import PolicyError  # noqa: E402 - needs the package above
from flux_dws.core.jobspec import OWN_SSD, has_ssd  # noqa: E402
from flux_dws.core.policy import TABLE, Policy, policy_from_table  # noqa: E402
from flux_dws.core.request import (  # noqa: E402
    DW_ATTR,
    RELEASE_ATTR,
    TIMEOUT_ATTR,
    TOLERANCE_ATTR,
    validate_attributes,
)

LOG = logging.getLogger("flux-dws.validator")
#: Seconds to wait for the broker's answer to config.get.
CONFIG_TIMEOUT = 30.0


def is_dws_job(system: object) -> bool:
    """True for attributes.system naming any DWS attribute: only such jobs are checked."""
    dws = (DW_ATTR, TIMEOUT_ATTR, TOLERANCE_ATTR, RELEASE_ATTR)
    return isinstance(system, Mapping) and any(attr in system for attr in dws)


def site_policy(config: Mapping[str, Any]) -> Policy | PolicyError:
    """The instance's policy from its whole config, or the error that makes #DW jobs fail."""
    try:
        return policy_from_table(config.get(TABLE))
    except PolicyError as exc:
        return exc


class DwsValidator:
    """The validator's behaviour, free of flux: configured from a config dict and an owner."""

    def __init__(self, parser: Any = None) -> None:
        self.policy: Policy | PolicyError = PolicyError("flux-dws validator: not configured")
        self.owner_uid = -1
        # Fluxion's graph holds the rabbits: a job without #DW may not ask for ssd.  Read
        # from the table even when the rest of it is bad, so a typo elsewhere lets none by.
        self.rabbit_scheduling = False

    def configure(self, args: Any) -> None:
        """flux-core's hook, run once per validator process: read the config and owner."""
        import flux  # late: only a running instance has it

        try:
            handle = flux.Flux()
            config = handle.rpc("config.get").wait_for(CONFIG_TIMEOUT).get()
            owner_uid = int(handle.attr_get("security.owner"))
        except (OSError, ValueError) as exc:
            self.policy = PolicyError(f"cannot read the instance config: {exc}")
            LOG.error("%s: every #DW job is rejected until the validator restarts", self.policy)
            return
        self.use_config(config, owner_uid)

    def use_config(self, config: Mapping[str, Any], owner_uid: int) -> None:
        """Adopt the instance's config; a bad [dws] table is logged for the admin, once."""
        self.policy = site_policy(config)
        self.owner_uid = owner_uid
        if isinstance(self.policy, PolicyError):
            LOG.error("%s: every #DW job is rejected until the config is fixed", self.policy)
            table = config.get(TABLE)
            self.rabbit_scheduling = (
                isinstance(table, Mapping) and table.get("rabbit-scheduling") is True
            )
        else:
            self.rabbit_scheduling = self.policy.rabbit_scheduling

    def validate(self, job: Any) -> tuple[int, str] | None:
        """(EINVAL, reason) for a job to reject, None to accept (flux-core's contract)."""
        attributes = job.jobspec.get("attributes") if isinstance(job.jobspec, Mapping) else None
        system = attributes.get("system") if isinstance(attributes, Mapping) else None
        resources = job.jobspec.get("resources") if isinstance(job.jobspec, Mapping) else None
        if not is_dws_job(system):
            if self.rabbit_scheduling and has_ssd(resources):
                return (errno.EINVAL, OWN_SSD)
            return None
        if isinstance(self.policy, PolicyError):
            return (
                errno.EINVAL,
                f"#DW jobs are not accepted: this instance's DWS configuration is invalid "
                f"({self.policy}); contact the administrator",
            )
        reason = validate_attributes(system, self.policy, job.userid, self.owner_uid, resources)
        return None if reason is None else (errno.EINVAL, reason)


_validator_class: type | None = None


def __getattr__(name: str) -> Any:
    """``Validator``, the class flux-core instantiates, built on first use so flux loads late."""
    global _validator_class
    if name != "Validator":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if _validator_class is None:
        from flux.job.validator import ValidatorPlugin

        class Validator(DwsValidator, ValidatorPlugin):
            """flux-dws: reject #DW jobs whose directives or timeouts the site refuses."""

        _validator_class = Validator
    return _validator_class
