# SPDX-License-Identifier: LGPL-3.0-only
# t/lib.sh: shared setup for the sharness tests that run against a real Flux instance.
#
# Source it from a t/tNNNN-*.t script right after sharness:
#
#   . "${SHARNESS:-/usr/share/sharness/sharness.sh}"
#   . "$SHARNESS_TEST_DIRECTORY/lib.sh"
#   dws_test_under_flux 2          # re-runs this script inside `flux start`
#
# Without flux-core every test file is skipped with one line (skip_all).  Helpers:
#
#   dws_build_plugin              make -C jobtap (skips the file when flux-core's
#                                 development files are missing)
#   dws_test_under_flux [SIZE] [FLUX-START-OPTIONS...]
#                                 run this script inside a test instance of SIZE brokers
#                                 (default 1) whose nodes are called fake0..fakeN-1, or
#                                 the hostlist in DWS_TEST_HOSTS (e.g. "compute-[01-04]",
#                                 set before the call); its config is
#                                 "$DWS_CONF_DIR/conf.d" (flux config reload)
#   dws_load_plugin [KEY=VAL...]  flux jobtap load the freshly built dws-jobtap.so
#   dws_remove_plugin             flux jobtap remove it
#   dws_dec JOBID                 a job ID as the decimal integer the protocol uses
#   dws_f58 JOBID                 a job ID as the plugin writes it in messages (f58)
#   dws_rpc METHOD [JSON]         one job-manager.dws.METHOD request: prints the response,
#                                 or "error: ERRNO: message" and fails
#   dws_expect TABLE              requests and their answers, one per line:
#                                 METHOD<TAB>JSON<TAB>ok (or ERRNO: message)
#   dws_watch_start NAME [--service] [--heartbeat SECONDS]
#                                 a watch stream in the background, one response per line
#                                 in NAME.log (returns once the snapshot arrived)
#   dws_watch_stop NAME
#   dws_wait_phase NAME JOBID PHASE [EXPR]
#                                 wait for the stream to show JOBID in PHASE; prints the
#                                 record (JSON); python EXPR about it (bound to r) is true
#   dws_json FILE EXPR            python EXPR about the JSON in FILE (bound to r) is true
#   dws_event_names JOBID         the names in the job's eventlog, one per line
#   dws_drain                     end every job the plugin holds (for test cleanup)
#   dws_setup DESCRIPTION BODY    test_expect_success for a set-up step: if it fails, the
#                                 script stops at once and shows the step's output and the
#                                 service's and dwssim's logs (no later test could pass)
#
# The real service against the DWS simulator, under $DWS_PYTHON (the Python that runs the
# tests, which has flux_dws and kubernetes; default python3), never under `flux python`,
# whose interpreter is flux-core's and may lack them.  flux_dws finds flux-core's bindings
# by itself (flux_dws/flux/bindings.py):
#
#   dws_dwssim_start COMPUTES     kubeapi + dwssim ($DWS_PYTHON -m flux_dws.testing.dwssim, no
#                                 delays, container seconds x0.01) in the background for
#                                 compute-01..COMPUTES; exports DWS_KUBECONFIG
#   dws_service_start             the flux-dws service ($DWS_PYTHON -m flux_dws.daemon) in the
#                                 background, logging to service.log; returns once it has
#                                 the plugin's job snapshot
#   dws_service_kill [SIGNAL]     stop it (default KILL: a crash, no goodbye)
#   dws_stop_background           stop the service and dwssim (a script's last test: on
#                                 success sharness removes their pid files with the trash)
#   dws_kube workflows            every Workflow in Kubernetes, namespace/name, one a line
#   dws_kube wait-state NAME STATE
#                                 wait (DWS_TIMEOUT) for workflow NAME's status.state
#   dws_kube force-ready NAME     what an administrator does: spec.forceReady = true

DWS_SRCDIR=${DWS_SRCDIR:-$(cd "$SHARNESS_TEST_DIRECTORY/.." && pwd)}
DWS_JOBTAP_DIR=$DWS_SRCDIR/jobtap
DWS_PLUGIN=$DWS_JOBTAP_DIR/dws-jobtap.so
DWS_TIMEOUT=${DWS_TIMEOUT:-60}  # a bound on waits, never on speed: CI machines are slow at times
export DWS_SRCDIR DWS_PLUGIN DWS_TIMEOUT

if command -v flux >/dev/null 2>&1; then
    :
elif test -x /opt/flux/bin/flux; then
    PATH=/opt/flux/bin:$PATH
    export PATH
else
    skip_all="flux-core is not installed: skipping t/ (real Flux tests)"
    test_done
fi

# flux's own commands put its Python bindings on the path; add this package.
PYTHONPATH=$DWS_SRCDIR${PYTHONPATH:+:$PYTHONPATH}
export PYTHONPATH
DWS_PYTHON=${DWS_PYTHON:-python3}
export DWS_PYTHON

dws_build_plugin() {
    if ! make -C "$DWS_JOBTAP_DIR" --no-print-directory >dws-build.log 2>&1; then
        cat dws-build.log >&2
        error "building the dws jobtap plugin failed (make -C jobtap)"
    fi
    if ! test -f "$DWS_PLUGIN"; then
        skip_all="$(cat dws-build.log): skipping t/"
        test_done
    fi
}

dws_test_under_flux() {
    local size=${1:-1}
    test $# -gt 0 && shift
    if test -n "$DWS_UNDER_FLUX"; then
        return 0
    fi
    dws_build_plugin
    local flags="" hosts="fake[0-$((size - 1))]" test_hosts=""
    if test -n "$DWS_TEST_HOSTS"; then
        hosts=$DWS_TEST_HOSTS
        test_hosts="--test-hosts=$hosts"
    fi
    test "$verbose" = "t" && flags="$flags --verbose"
    test "$debug" = "t" && flags="$flags --debug"
    test "$immediate" = "t" && flags="$flags --immediate"
    # The broker reads its config at startup, from outside the trash directory
    # (the re-run script empties that).
    local conf
    conf=$(mktemp -d "${TMPDIR:-/tmp}/dws-t-conf.XXXXXX") || error "mktemp failed"
    mkdir "$conf/conf.d"
    flux R encode --hosts="$hosts" -r "0-$((size - 1))" -c 0-1 \
        >"$conf/R" || error "flux R encode failed"
    cat >"$conf/conf.d/resource.toml" <<-EOF
	[resource]
	path = "$conf/R"
	noverify = true
	EOF
    cd "$SHARNESS_TEST_DIRECTORY" || error "cd $SHARNESS_TEST_DIRECTORY failed"
    # Jobs still held when a test fails must not stall the instance's shutdown:
    # the script drains them on exit (dws_teardown), the cleanup timeout is the
    # backstop.
    DWS_UNDER_FLUX=t DWS_CONF_DIR="$conf" \
        flux start --test-size="$size" ${test_hosts:+"$test_hosts"} -c "$conf/conf.d" \
        -o,-Sbroker.cleanup-timeout=10 "$@" \
        bash "$SHARNESS_TEST_FILE" $flags
    local rc=$?
    rm -rf "$conf"
    EXIT_OK=t
    exit $rc
}

# On an exit inside the instance after a failure: end the jobs the plugin still holds
# (loading it again if a test removed it), then let sharness report.  Only in scripts
# that loaded the plugin.
dws_teardown() {
    dws_exit_code=$?
    for pidfile in *.pid; do
        test -f "$pidfile" && kill "$(cat "$pidfile")" 2>/dev/null
    done
    if test -n "$DWS_PLUGIN_USED" && test "$dws_exit_code$test_failure" != 00; then
        if flux jobtap list 2>/dev/null | grep -qx "$(basename "$DWS_PLUGIN")" ||
            dws_load_plugin >/dev/null 2>&1; then
            dws_drain >/dev/null 2>&1
        fi
    fi
    (exit $dws_exit_code)
    die
}

if test -n "$DWS_UNDER_FLUX"; then
    trap 'dws_teardown' EXIT
fi

dws_setup() {
    local failed_before=$test_failure
    test_expect_success "$1" "{
$2
} >dws-setup.log 2>&1"
    if test "$test_failure" != "$failed_before"; then
        {
            echo "--- what the set-up printed:"
            tail -40 dws-setup.log
            for log in dwssim.log service.log; do
                if test -s "$log"; then
                    echo "--- $log:"
                    tail -20 "$log"
                fi
            done
        } >&5 2>/dev/null
        error "set-up failed: stopping here instead of running tests that cannot pass"
    fi
}

dws_load_plugin() {
    DWS_PLUGIN_USED=t
    flux jobtap load "$DWS_PLUGIN" "$@"
}

dws_remove_plugin() {
    flux jobtap remove "$(basename "$DWS_PLUGIN")"
}

dws_dec() {
    flux job id --to=dec "$1"
}

dws_f58() {
    flux job id --to=f58 "$1"
}

# The Python side of the helpers: plain flux bindings, nothing from flux_dws.
DWS_HELPER=$SHARNESS_TRASH_DIRECTORY/dws-helper.py
export DWS_HELPER
cat >"$DWS_HELPER" <<'EOF'
import errno
import json
import sys
import time

import flux
import flux.constants

TOPIC = "job-manager.dws."


def errname(num):
    return errno.errorcode.get(num, str(num))


def rpc(method, payload="{}"):
    h = flux.Flux()
    try:
        response = h.rpc(TOPIC + method, json.loads(payload)).get()
    except OSError as exc:
        print(f"error: {errname(exc.errno)}: {exc.strerror}")
        return 1
    print(json.dumps(response))
    return 0


def expect(table):
    """Requests and their expected answers, one per line of table:
    METHOD<TAB>PAYLOAD<TAB>EXPECTED, EXPECTED being "ok" or "ERRNO: message"."""
    h = flux.Flux()
    failures = 0
    with open(table) as fp:
        rows = [line.rstrip("\n").split("\t") for line in fp if line.strip()]
    for method, payload, expected in rows:
        try:
            h.rpc(TOPIC + method, json.loads(payload)).get()
            got = "ok"
        except OSError as exc:
            got = f"{errname(exc.errno)}: {exc.strerror}"
        if got != expected:
            failures += 1
            print(f"{method} {payload}\n  expected: {expected}\n  got:      {got}")
    return 1 if failures else 0


def watch(log, *opts):
    """Stream watch responses into log, one per line; --once prints the first and stops."""
    service = "--service" in opts
    once = "--once" in opts
    beat = float(opts[opts.index("--heartbeat") + 1]) if "--heartbeat" in opts else 0.0
    payload = {"service": service}
    if "--payload" in opts:
        payload = json.loads(opts[opts.index("--payload") + 1])
    h = flux.Flux()
    out = sys.stdout if log == "-" else open(log, "a", buffering=1)  # noqa: SIM115
    f = h.rpc(TOPIC + "watch", payload, flags=flux.constants.FLUX_RPC_STREAMING)

    def on_response(f):
        try:
            out.write(json.dumps(f.get()) + "\n")
        except OSError as exc:
            out.write(json.dumps({"error": errname(exc.errno), "message": exc.strerror}) + "\n")
            h.reactor_stop()
            return
        if once:
            h.reactor_stop()
        f.reset()

    f.then(on_response)
    if beat > 0:
        timer = h.timer_watcher_create(beat, lambda *a: h.rpc(TOPIC + "heartbeat", {}), repeat=beat)
        timer.start()
    h.reactor_run()
    return 0


def lines(log):
    try:
        with open(log) as fp:
            return [json.loads(line) for line in fp if line.strip()]
    except (OSError, ValueError):
        return []


def wait_lines(log, count, timeout):
    deadline = time.monotonic() + float(timeout)
    while len(lines(log)) < int(count):
        if time.monotonic() > deadline:
            print(f"{log}: fewer than {count} responses after {timeout}s")
            return 1
        time.sleep(0.05)
    return 0


def latest(log):
    records = {}
    for response in lines(log):
        for record in response.get("jobs", []):
            records[record["id"]] = record
    return records


def wait_phase(log, jobid, phase, timeout, expr=None):
    deadline = time.monotonic() + float(timeout)
    jobid = int(jobid)
    while True:
        record = latest(log).get(jobid)
        if record is not None and record["phase"] == phase:
            print(json.dumps(record))
            if expr and not eval(expr, {"r": record}):
                print(f"false: {expr}")
                return 1
            return 0
        if time.monotonic() > deadline:
            print(f"job {jobid} not in phase {phase} after {timeout}s: {json.dumps(record)}")
            return 1
        time.sleep(0.05)


def check(path, expr):
    with open(path) as fp:
        r = json.load(fp)
    if eval(expr, {"r": r}):
        return 0
    print(f"false: {expr}\n  r = {json.dumps(r)}")
    return 1


COMMANDS = {
    "rpc": rpc,
    "expect": expect,
    "watch": watch,
    "wait-lines": wait_lines,
    "wait-phase": wait_phase,
    "check": check,
}

if __name__ == "__main__":
    sys.exit(COMMANDS[sys.argv[1]](*sys.argv[2:]))
EOF

dws_rpc() {
    flux python "$DWS_HELPER" rpc "$@"
}

dws_expect() {
    flux python "$DWS_HELPER" expect "$@"
}

dws_watch_start() {
    local name=$1
    shift
    rm -f "$name.log"
    flux python "$DWS_HELPER" watch "$name.log" "$@" >"$name.out" 2>&1 &
    echo $! >"$name.pid"
    flux python "$DWS_HELPER" wait-lines "$name.log" 1 "$DWS_TIMEOUT"
}

dws_watch_stop() {
    if test -f "$1.pid"; then
        kill "$(cat "$1.pid")" 2>/dev/null
        wait "$(cat "$1.pid")" 2>/dev/null
        rm -f "$1.pid"
    fi
    return 0
}

dws_wait_phase() {
    flux python "$DWS_HELPER" wait-phase "$1.log" "$(dws_dec "$2")" "$3" \
        "$DWS_TIMEOUT" ${4:+"$4"}
}

dws_json() {
    flux python "$DWS_HELPER" check "$@"
}

dws_event_names() {
    flux job eventlog "$1" | awk '{print $2}'
}

dws_drain() {
    local tries=0 ids id
    flux cancel --all >/dev/null 2>&1
    while test $tries -lt 50; do
        ids=$(dws_rpc list | flux python -c '
import json, sys
for r in json.load(sys.stdin)["jobs"]:
    print(r["id"], r["phase"])')
        test -z "$ids" && return 0
        echo "$ids" | while read id phase; do
            case $phase in
                prolog) dws_rpc prolog-finish "{\"id\": $id, \"success\": false}" ;;
                epilog) dws_rpc epilog-finish "{\"id\": $id}" ;;
                *) flux cancel "$id" ;;
            esac
        done >/dev/null 2>&1
        tries=$((tries + 1))
        sleep 0.1
    done
    dws_rpc list
    return 1
}

# ------------------------------------------------------------------ service and simulator

dws_dwssim_start() {
    local tries=0
    DWS_KUBECONFIG=$PWD/kubeconfig
    export DWS_KUBECONFIG
    rm -f dwssim.out
    "$DWS_PYTHON" -m flux_dws.testing.dwssim --no-delays --time-scale 0.01 \
        --computes "$1" --kubeconfig "$DWS_KUBECONFIG" >dwssim.out 2>dwssim.log &
    echo $! >dwssim.pid
    while test "$(wc -l <dwssim.out)" -lt 2; do
        tries=$((tries + 1))
        if test $tries -gt $((DWS_TIMEOUT * 10)) || ! kill -0 "$(cat dwssim.pid)" 2>/dev/null
        then
            cat dwssim.log >&2
            return 1
        fi
        sleep 0.1
    done
}

dws_service_start() {
    local before tries=0
    before=$(cat service.log 2>/dev/null | grep -c "job snapshot")
    "$DWS_PYTHON" -m flux_dws.daemon >>service.log 2>&1 &
    echo $! >service.pid
    while test "$(grep -c "job snapshot" service.log)" -le "$before"; do
        tries=$((tries + 1))
        if test $tries -gt $((DWS_TIMEOUT * 10)) || ! kill -0 "$(cat service.pid)" 2>/dev/null
        then
            tail -20 service.log >&2
            return 1
        fi
        sleep 0.1
    done
}

dws_service_kill() {
    if test -f service.pid; then
        kill -"${1:-KILL}" "$(cat service.pid)" 2>/dev/null
        wait "$(cat service.pid)" 2>/dev/null
        rm -f service.pid
    fi
    return 0
}

dws_stop_background() {
    dws_service_kill TERM
    if test -f dwssim.pid; then
        kill "$(cat dwssim.pid)" 2>/dev/null
        wait "$(cat dwssim.pid)" 2>/dev/null
        rm -f dwssim.pid
    fi
    return 0
}

# Workflows through the kubernetes client (a dependency of flux-dws itself, so always
# there when the service can run): no kubectl needed.
DWS_KUBE_HELPER=$SHARNESS_TRASH_DIRECTORY/dws-kube.py
export DWS_KUBE_HELPER
cat >"$DWS_KUBE_HELPER" <<'EOF'
from __future__ import annotations

import os
import sys
import time

from kubernetes import client, config

from flux_dws.k8s.resources import DWS_GROUP, WORKFLOWS

MERGE_PATCH = "application/merge-patch+json"
BOUND = 10  # seconds per request

api = config.new_client_from_config(config_file=os.environ["DWS_KUBECONFIG"])
groups = client.ApisApi(api).get_api_versions(_request_timeout=BOUND).groups
VERSION = next(g.preferred_version.version for g in groups if g.name == DWS_GROUP)
custom = client.CustomObjectsApi(api)


def workflows():
    found = custom.list_cluster_custom_object(DWS_GROUP, VERSION, WORKFLOWS.plural, _request_timeout=BOUND)
    for wf in found["items"]:
        print(f"{wf['metadata']['namespace']}/{wf['metadata']['name']}")
    return 0


def wait_state(name, state):
    deadline = time.monotonic() + float(os.environ.get("DWS_TIMEOUT", "60"))
    while True:
        wf = custom.get_namespaced_custom_object(
            DWS_GROUP, VERSION, "default", WORKFLOWS.plural, name, _request_timeout=BOUND
        )
        got = (wf.get("status") or {}).get("state")
        if got == state:
            return 0
        if time.monotonic() > deadline:
            print(f"workflow {name} is in {got}, not {state}")
            return 1
        time.sleep(0.05)


def force_ready(name):
    custom.patch_namespaced_custom_object(
        DWS_GROUP,
        VERSION,
        "default",
        WORKFLOWS.plural,
        name,
        {"spec": {"forceReady": True}},
        _content_type=MERGE_PATCH,
        _request_timeout=BOUND,
    )
    return 0


COMMANDS = {"workflows": workflows, "wait-state": wait_state, "force-ready": force_ready}

if __name__ == "__main__":
    sys.exit(COMMANDS[sys.argv[1]](*sys.argv[2:]))
EOF

dws_kube() {
    "$DWS_PYTHON" "$DWS_KUBE_HELPER" "$@"
}
