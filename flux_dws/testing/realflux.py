# SPDX-License-Identifier: LGPL-3.0-only
"""A real Flux instance for the scenario suite, with fakeflux's user-side API.

``RealFlux`` starts `flux start --test-size=N --test-hosts=...` with the dws jobtap plugin, the
dws-env shell plugin and the flux-dws ingest validator configured, and offers the same methods
the scenarios use on FakeFlux (submit, cancel, info, wait, wait_event), built from the job's
real eventlog and Flux's own job-list result.  The service runs as a real process
(``python -m flux_dws.daemon``), so killing it is a real SIGKILL.  Used only where flux-core is
installed; nothing here imports ``flux`` at module load.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from flux_dws.flux.bindings import FluxUnavailable, flux_command
from flux_dws.flux.bindings import import_flux as _import_flux
from flux_dws.testing.fakeflux import JobInfo, SubmitError
from flux_dws.testing.fluxsetup import ROOT, build_plugins, flux_pythonpath, write_toml

__all__ = ["RealFlux"]

STATE_ORDER = ("NEW", "DEPEND", "PRIORITY", "SCHED", "RUN", "CLEANUP", "INACTIVE")
#: Seconds `flux start` may take to run its initial program.
START_TIMEOUT = 60.0


class RealFlux:
    """A `flux start` test instance; see the module docstring."""

    def __init__(
        self,
        hosts: Sequence[str],
        dws_table: Mapping[str, Any],
        *,
        flux: str | None = None,
        persist: bool = False,
        broker_env: Mapping[str, str] | None = None,
        R: Mapping[str, Any] | None = None,
        queue_policy: str | None = None,
    ) -> None:
        """``persist``: keep the instance's content in a statedir, so :meth:`restart` brings
        its jobs back; ``broker_env``: extra environment for the brokers (for example
        FLUX_DISABLE_JOB_CLEANUP, so running jobs cross a restart); ``queue_policy``:
        Fluxion's ``[sched-fluxion-qmanager] queue-policy`` (None: Fluxion's default, fcfs)."""
        found = flux or flux_command()
        if found is None:
            raise FluxUnavailable("flux-core is not installed (no flux on PATH or /opt/flux/bin)")
        self.flux = found
        _import_flux()  # this process talks to the instance too; one line if it cannot
        self.hosts = list(hosts)
        self.dws_table = dict(dws_table)
        self.R = R  # the instance's resources (with a JGF for Fluxion), or hosts from config
        self._tmp = tempfile.TemporaryDirectory(prefix="flux-dws-real-")
        self.workdir = Path(self._tmp.name)
        bindings = flux_pythonpath(self.flux)
        self.pythonpath = f"{bindings}:{ROOT}"
        self.uri = ""
        self._instance: subprocess.Popen[str] | None = None
        self._service: subprocess.Popen[str] | None = None
        self._handle: Any = None
        self.persist = persist
        self.broker_env = dict(broker_env or {})
        self.queue_policy = queue_policy
        self._plugins: dict[str, str] = {}

    # ------------------------------------------------------------------ instance

    def start(self) -> RealFlux:
        """Start the instance; on any failure nothing of it is left running."""
        try:
            return self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> RealFlux:
        self._plugins = plugins = build_plugins(self.flux)
        confdir = self.workdir / "conf"
        confdir.mkdir()
        write_toml(
            {
                "dws": self.dws_table,
                "ingest": {
                    "validator": {"plugins": ["jobspec", str(ROOT / "flux_dws" / "validator.py")]}
                },
            },
            confdir / "dws.toml",
        )
        (confdir / "jobtap.toml").write_text(
            f'[job-manager]\nplugins = [ {{ load = "{plugins["dws-jobtap.so"]}" }} ]\n'
        )
        # R names the fake hosts (and --test-hosts names the brokers to match), so the
        # compute nodes the plugin reports are the ones dwssim's SystemConfiguration knows.
        if self.R is not None:  # Fluxion reads the rabbits from R's scheduling key
            (self.workdir / "R.json").write_text(json.dumps(self.R))
            (confdir / "resource.toml").write_text(
                f'[resource]\nnoverify = true\npath = "{self.workdir / "R.json"}"\n'
                '[sched-fluxion-resource]\nmatch-format = "rv1"\n'
            )
        else:
            (confdir / "resource.toml").write_text(
                "[resource]\nnoverify = true\n[[resource.config]]\n"
                f'hosts = "{",".join(self.hosts)}"\ncores = "0"\n'
            )
        if self.queue_policy is not None:  # read by Fluxion's qmanager only
            write_toml(
                {"sched-fluxion-qmanager": {"queue-policy": self.queue_policy}},
                confdir / "sched.toml",
            )
        return self._launch()

    def _launch(self) -> RealFlux:
        shell_path = f"{os.path.dirname(self._plugins['dws-env.so'])}"
        uri_file = self.workdir / "uri"
        uri_file.unlink(missing_ok=True)
        self.uri = ""
        hostlist = ",".join(self.hosts)
        # The initial program lives as long as this process: if it dies without stop()
        # (SIGKILL, a crash), it ends the instance's whole process group (that of `flux
        # start`, the session leader), since a shutdown would wait for jobs held by the
        # dws plugin that no service will ever let go.
        group_file = self.workdir / "pgid"
        watch = (
            f"while kill -0 {os.getpid()} 2>/dev/null; do sleep 1; done;"
            f' kill -9 "-$(cat {group_file})"'
        )
        cmd = [
            self.flux,
            "start",
            f"--test-size={len(self.hosts)}",
            f"--test-hosts={hostlist}",
            f"--config-path={self.workdir / 'conf'}",
            f"-Sconf.shell_pluginpath={shell_path}:{self._default_shell_path()}",
            "-Sbroker.cleanup-timeout=10",
        ]
        if self.persist:
            (self.workdir / "state").mkdir(exist_ok=True)
            cmd.append(f"-Sstatedir={self.workdir / 'state'}")
        cmd += ["sh", "-c", f'echo "$FLUX_URI" > {uri_file}; {watch}']
        log = open(self.workdir / "instance.log", "w")  # noqa: SIM115 - the child keeps it
        with log:
            self._instance = subprocess.Popen(
                cmd,
                env={**self._env(), **self.broker_env},
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: nothing outlives stop()
            )
        group_file.write_text(str(self._instance.pid))
        deadline = time.monotonic() + START_TIMEOUT
        while not (uri_file.exists() and uri_file.read_text().strip()):
            if self._instance.poll() is not None or time.monotonic() > deadline:
                said = (self.workdir / "instance.log").read_text()[-2000:]
                raise FluxUnavailable(f"flux start failed: {' '.join(said.split()) or 'no output'}")
            time.sleep(0.05)
        self.uri = uri_file.read_text().strip()
        import flux as flux_bindings

        self._handle = flux_bindings.Flux(self.uri)
        return self

    def _default_shell_path(self) -> str:
        out = subprocess.run(
            ["pkg-config", "--variable=fluxshellpluginpath", "flux-core"],
            capture_output=True,
            text=True,
            env=self._env(),
        )
        return out.stdout.strip() or "/opt/flux/lib/flux/shell/plugins"

    def _env(self) -> dict[str, str]:
        prefix = os.path.dirname(os.path.dirname(self.flux))
        env = dict(os.environ)
        env["PATH"] = f"{os.path.dirname(self.flux)}:{env.get('PATH', '')}"
        env["PYTHONPATH"] = self.pythonpath
        env.setdefault("PKG_CONFIG_PATH", os.path.join(prefix, "lib", "pkgconfig"))
        if self.uri:
            env["FLUX_URI"] = self.uri
        return env

    def shutdown(self, timeout: float = 60.0) -> None:
        """`flux shutdown` and wait for the brokers to exit; the service is left alone."""
        if self._instance is None:
            return
        subprocess.run(
            [self.flux, "shutdown", "--quiet"],
            env=self._env(),
            capture_output=True,
            timeout=timeout,
            check=False,
        )
        self._instance.wait(timeout)
        self._instance = None
        self._handle = None

    def restart(self) -> RealFlux:
        """Shut the instance down and start it again from its statedir (``persist``)."""
        if not self.persist:
            raise RuntimeError("restart() needs RealFlux(persist=True)")
        self.shutdown()
        return self._launch()

    def stop(self) -> None:
        """Shut the instance down (`flux shutdown`), then make sure no broker is left."""
        self.kill_service()
        if self._instance is not None:
            if self.uri:  # a shutdown that hangs (a job stuck in CLEANUP) ends in SIGKILL
                with contextlib.suppress(subprocess.TimeoutExpired):
                    subprocess.run(
                        [self.flux, "shutdown", "--quiet"],
                        env=self._env(),
                        capture_output=True,
                        timeout=60,
                        check=False,
                    )
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._instance.wait(30)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._instance.pid, signal.SIGKILL)
            self._instance.wait(10)
            self._instance = None
        self._tmp.cleanup()

    # ------------------------------------------------------------------ the service

    def start_service(self) -> None:
        """The service under this very Python, never under `flux python`'s."""
        with open(self.workdir / "service.log", "a") as log:  # the child keeps its own copy
            self._service = subprocess.Popen(
                [sys.executable, "-m", "flux_dws.daemon"],
                env=self._env(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                text=True,
            )

    def kill_service(self) -> None:
        """SIGKILL: no goodbye, exactly as a crash."""
        if self._service is not None:
            self._service.kill()
            self._service.wait(10)
            self._service = None

    def service_running(self) -> bool:
        return self._service is not None and self._service.poll() is None

    def service_exit(self, timeout: float) -> int | None:
        """The service's exit status once it exits within ``timeout``; None if it is running."""
        if self._service is None:
            return None
        try:
            return self._service.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def service_log(self) -> str:
        path = self.workdir / "service.log"
        return path.read_text() if path.exists() else ""

    # ------------------------------------------------------------------ nodes (the admin's side)

    def drain(self, targets: str, reason: str = "", mode: str | None = None) -> None:
        """``flux resource drain``: OSError as flux-core refuses (EEXIST: already drained)."""
        payload = {"targets": targets, "reason": reason}
        if mode:
            payload["mode"] = mode
        self._handle.rpc("resource.drain", payload, nodeid=0).get()

    def undrain(self, targets: str, mode: str | None = None) -> None:
        payload = {"targets": targets, **({"mode": mode} if mode else {})}
        self._handle.rpc("resource.undrain", payload, nodeid=0).get()

    def drained(self) -> dict[str, str]:
        """Drained host -> reason, from resource.status."""
        from flux_dws.flux.resource import expand_nodelist, parse_resource_status

        response = self._handle.rpc("resource.status", {}, nodeid=0).get()
        return parse_resource_status(response, expand_nodelist).drained_hosts()

    def drain_table(self) -> str:
        """What `flux resource drain -o "{nodelist} {reason}"` prints (reasons not cut)."""
        out = subprocess.run(
            [self.flux, "resource", "drain", "-no", "{nodelist} {reason}"],
            env=self._env(),
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        return out.stdout

    # ------------------------------------------------------------------ the user's side

    def submit(
        self,
        attributes: Mapping[str, Any],
        *,
        userid: int | None = None,
        nnodes: int = 1,
        runtime: float | None = 0.0,
        exit_status: int = 0,
        resources: Sequence[Mapping[str, Any]] | None = None,
    ) -> int:
        """`flux run -S dw=...` with a command that records its environment; ``resources``,
        when given, replace the jobspec's (one task per slot labelled ``task``)."""
        from flux.job import JobspecV1, submit

        sleep = "inf" if runtime is None else repr(runtime)
        envfile = self.workdir / "$FLUX_JOB_ID.env"
        script = f'env > "{envfile}"; sleep {sleep}; exit {exit_status}'
        jobspec = JobspecV1.from_command(["sh", "-c", script], num_nodes=nnodes, num_tasks=nnodes)
        if resources is not None:
            jobspec.jobspec["resources"] = json.loads(json.dumps(resources))
        for key, value in attributes.items():
            jobspec.setattr(f"system.{key}", value)
        try:
            return int(submit(self._handle, jobspec))
        except OSError as exc:
            raise SubmitError(" ".join(str(exc.strerror or exc).split())) from None

    def dws_list(self) -> dict[str, Any]:
        """The dws plugin's ``list`` response (job-manager.dws.list)."""
        return self._handle.rpc("job-manager.dws.list", {}).get()

    def command(self, *argv: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        """``flux ARGV...`` in the instance, its output captured."""
        return subprocess.run(
            [self.flux, *argv], capture_output=True, text=True, env=self._env(), timeout=timeout
        )

    def cancel(self, jobid: int, note: str = "") -> None:
        from flux.job import cancel

        cancel(self._handle, jobid, note or None)

    def end_active_jobs(self, timeout: float = 60.0) -> list[int]:
        """Cancel every job not yet inactive and wait for them to end; their IDs.  A test that
        failed may leave one running, which would hold the nodes of the next tests of a
        module that shares this instance."""
        from flux.job import JobList

        listed = JobList(self._handle, filters=["pending", "running"], user="all").jobs()
        active = [int(job.id) for job in listed]
        for jobid in active:
            with contextlib.suppress(OSError):  # it ended meanwhile
                self.cancel(jobid, "left active by an earlier test")
        for jobid in active:
            self.wait(jobid, timeout=timeout)
        return active

    def eventlog(self, jobid: int) -> list[dict[str, Any]]:
        payload = {"id": jobid, "keys": ["eventlog"], "flags": 0}
        text = self._handle.rpc("job-info.lookup", payload).get()["eventlog"]
        return [json.loads(line) for line in text.splitlines() if line.strip()]

    def job_R(self, jobid: int) -> dict[str, Any]:
        """The job's R (with the JGF Fluxion wrote into it, where it did)."""
        payload = {"id": jobid, "keys": ["R"], "flags": 0}
        found = self._handle.rpc("job-info.lookup", payload).get()["R"]
        return json.loads(found) if isinstance(found, str) else found

    def kvs_lookup(self, jobid: int, key: str, *, userid: int | None = None) -> str:
        """``flux job info ID KEY`` (job-info.lookup), as ``userid`` when given: the instance
        owner's connection then carries that user's credentials with the plain user role
        (FLUX_HANDLE_USERID / FLUX_HANDLE_ROLEMASK, flux-core's own way of testing guest
        access).  PermissionError or FileNotFoundError as FakeFlux raises them."""
        env = self._env()
        if userid is not None and userid != os.getuid():
            env["FLUX_HANDLE_USERID"] = str(userid)
            env["FLUX_HANDLE_ROLEMASK"] = "0x2"  # FLUX_ROLE_USER
        done = subprocess.run(
            [self.flux, "job", "info", str(jobid), key],
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        if done.returncode == 0:
            return done.stdout.rstrip("\n")
        error = done.stderr.strip()
        if "restricted" in error or "Operation not permitted" in error:
            raise PermissionError(errno.EPERM, error)
        if "not found" in error or "No such file" in error:
            raise FileNotFoundError(errno.ENOENT, error)
        raise OSError(errno.EIO, error or f"flux job info exited {done.returncode}")

    def info(self, jobid: int) -> JobInfo:
        from flux.job import job_list_id

        eventlog = self.eventlog(jobid)
        listed = job_list_id(self._handle, jobid, attrs=["state", "result"]).get_jobinfo()
        state = listed.state_single if hasattr(listed, "state_single") else str(listed.state)
        state = _STATE_NAMES.get(state, state)
        inactive = any(e["name"] == "clean" for e in eventlog)
        result = listed.result if inactive else None
        from flux.job import JobID

        env = {}
        ids = JobID(jobid)  # tasks see FLUX_JOB_ID in f58 form
        for name in (ids.f58, ids.f58plain, str(jobid)):
            envfile = self.workdir / f"{name}.env"
            if not envfile.exists():
                continue
            for line in envfile.read_text().splitlines():
                key, sep, value = line.partition("=")
                if sep:
                    env[key] = value
        exceptions = [e["context"] for e in eventlog if e["name"] == "exception"]
        fatal = [e for e in exceptions if e.get("severity") == 0]
        return JobInfo(
            id=jobid,
            userid=int(eventlog[0]["context"]["userid"]) if eventlog else -1,
            state="INACTIVE" if inactive else state,
            result=result or None,
            eventlog=eventlog,
            hosts=[],
            env=env,
            exception=fatal[0] if fatal else None,
            holds=_open_holds(eventlog),
            jobspec={},
        )

    def wait(self, jobid: int, state: str = "INACTIVE", timeout: float = 30.0) -> JobInfo:
        rank = STATE_ORDER.index(state)
        deadline = time.monotonic() + timeout
        while True:
            info = self.info(jobid)
            if STATE_ORDER.index(info.state) >= rank and (state != "INACTIVE" or info.result):
                return info
            if time.monotonic() > deadline:
                names = ", ".join(e["name"] for e in info.eventlog[-8:])
                raise TimeoutError(
                    f"job {jobid} did not reach {state} within {timeout}s: it is {info.state} "
                    f"after {names}\n--- service log ---\n{self.service_log()[-3000:]}"
                    f"{self.job_diagnostics(jobid)}"
                )
            time.sleep(0.1)

    def job_diagnostics(self, jobid: int) -> str:
        """The job's exec and output eventlogs and the broker's log tail, for a failure message:
        a job stuck after ``start`` is stuck in its shell, which only these show."""
        parts = []
        for what, argv in (
            ("exec eventlog", ("job", "eventlog", "-p", "exec", str(jobid))),
            ("output eventlog", ("job", "eventlog", "-p", "output", str(jobid))),
            ("broker log", ("dmesg",)),
        ):
            try:
                done = self.command(*argv, timeout=10)
                text = (done.stdout + done.stderr).strip()
            except (OSError, subprocess.SubprocessError) as exc:
                text = f"(unavailable: {exc})"
            parts.append(f"\n--- {what} ---\n{text[-2000:]}")
        parts.append(f"\n--- job shells ---\n{_shell_processes(jobid)}")
        return "".join(parts)

    def wait_event(self, jobid: int, name: str, timeout: float = 30.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            eventlog = self.eventlog(jobid)
            for entry in eventlog:
                if entry["name"] == name:
                    return entry
            if any(e["name"] == "clean" for e in eventlog):
                raise LookupError(f"job {jobid} ended without a {name} event")
            time.sleep(0.05)
        raise TimeoutError(f"job {jobid}: no {name} event within {timeout}s")


def _shell_processes(jobid: int) -> str:
    """The job's flux-shell processes and their children on this machine, each with its
    state and the kernel function it waits in: where a shell that never reached shell.init
    is stuck, when its log says nothing."""
    lines = []
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            if not (argv[0].endswith(b"flux-shell") and argv[1:2] == [str(jobid).encode()]):
                continue
            stat = (proc / "stat").read_text().rsplit(")", 1)[1].split()
            wchan = (proc / "wchan").read_text() or "-"
            children = (proc / "task" / proc.name / "children").read_text().split()
        except (OSError, IndexError):
            continue
        lines.append(f"pid {proc.name} state {stat[0]} waiting in {wchan}; children {children}")
    return "\n".join(lines) or "(no flux-shell process of this job)"


_STATE_NAMES = {
    "D": "DEPEND",
    "P": "PRIORITY",
    "S": "SCHED",
    "R": "RUN",
    "C": "CLEANUP",
    "I": "INACTIVE",
}


def _open_holds(eventlog: list[dict[str, Any]]) -> set[str]:
    """Dependencies, prologs and epilogs started and not finished, as fakeflux names them.

    A dependency only holds a job in DEPEND: once the job leaves it (the depend event, or a
    fatal exception sending it to CLEANUP) Flux never posts its removal.
    """
    holds: set[str] = set()
    pairs = {
        "dependency-add": ("dependency", True),
        "dependency-remove": ("dependency", False),
        "prolog-start": ("prolog", True),
        "prolog-finish": ("prolog", False),
        "epilog-start": ("epilog", True),
        "epilog-finish": ("epilog", False),
    }
    for entry in eventlog:
        context = entry.get("context") or {}
        if entry["name"] == "depend" or (
            entry["name"] == "exception" and context.get("severity") == 0
        ):
            holds = {h for h in holds if not h.startswith("dependency:")}
        if entry["name"] in pairs:
            kind, opened = pairs[entry["name"]]
            hold = f"{kind}:{(entry.get('context') or {}).get('description', '')}"
            if opened:
                holds.add(hold)
            else:
                holds.discard(hold)
    return holds
