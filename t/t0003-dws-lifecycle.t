#!/bin/sh
# SPDX-License-Identifier: LGPL-3.0-only

test_description='the whole #DW life cycle on a real Flux instance, with the real service

The dws jobtap plugin, the dws-env job shell plugin, the flux_dws ingest validator and the
flux-dws service (python -m flux_dws.daemon, a process of its own, so killing it is a real
SIGKILL) drive workflows in kubeapi + dwssim.  Each test checks what a user sees (flux run
and its exit status, flux jobs, flux job eventlog) and that no workflow is left behind.'

. "${SHARNESS:-/usr/share/sharness/sharness.sh}"
. "$SHARNESS_TEST_DIRECTORY/lib.sh"

if ! make -C "$DWS_SRCDIR/shell" --no-print-directory >shell-build.log 2>&1; then
    cat shell-build.log >&2
    error "building the dws-env shell plugin failed (make -C shell)"
fi
if ! test -f "$DWS_SRCDIR/shell/dws-env.so"; then
    skip_all="$(cat shell-build.log): skipping t0003"
    test_done
fi

# compute-01.. are the nodes dwssim's SystemConfiguration knows (--computes 4).
DWS_TEST_HOSTS="compute-[01-04]"
dws_test_under_flux 4 \
    -Sconf.shell_pluginpath="$DWS_SRCDIR/shell:$(flux config builtin shell_pluginpath)"

command -v kubectl >/dev/null 2>&1 && test_set_prereq KUBECTL

INSTANCE=t3
DW='#DW jobdw type=xfs capacity=1GiB name=scratch'
GFS2='#DW jobdw type=gfs2 capacity=10GiB name=shared'
ALL_STATES="Proposal Setup DataIn PreRun PostRun DataOut Teardown"

# dw_list LINE...: the #DW lines as the JSON list -S dw= takes.
dw_list() {
    flux python -c 'import json, sys; print(json.dumps(sys.argv[1:]))' "$@"
}

# container_dw PROFILE: storage and a container using it.
container_dw() {
    dw_list "$GFS2" "#DW container name=app profile=$1 DW_JOB_local_storage=shared"
}

workflow_of() {
    echo "fluxjob-$INSTANCE-$(dws_dec $1)"
}

# states_of JOBID: the states the service asked the job's workflow for, on one line.
states_of() {
    flux job eventlog $1 | sed -n "s/^[0-9.]* dws-state state=\"\([A-Za-z]*\)\".*/\1/p" | xargs
}

# outcome_of JOBID: result, exception type and note, as flux jobs shows them.
outcome_of() {
    flux jobs -n -o "{result} {exception.type} {exception.note}" $1 | sed "s/ *$//"
}

ends() {
    flux job wait-event -t 60 $1 clean >/dev/null
}

# has_states JOBID STATE...: the job's workflow went through exactly these states.
has_states() {
    local id=$1
    shift
    echo "$*" >states.expected &&
    states_of $id >states.out &&
    test_cmp states.expected states.out
}

# has_outcome JOBID TEXT: flux jobs shows this result, exception type and note.
has_outcome() {
    echo "$2" >outcome.expected &&
    outcome_of $1 >outcome.out &&
    test_cmp outcome.expected outcome.out
}

# no_workflow_left JOBID: the job's workflow is gone from Kubernetes, within DWS_TIMEOUT: a
# job ends once flux-dws lets go of its workflow, and DWS's finalizer (and, for a job that
# never started, Teardown) may still be running then.
no_workflow_left() {
    local name="default/$(workflow_of $1)" deadline=$(($(date +%s) + DWS_TIMEOUT))
    while :; do
        dws_kube workflows >workflows.out || return 1
        grep -qx "$name" workflows.out || return 0
        test $(date +%s) -lt $deadline || return 1
        sleep 0.2
    done
}

dws_setup 'setup: kubeapi + dwssim, [dws] config, the plugin and the service' '
    dws_dwssim_start 4 &&
    cat >"$DWS_CONF_DIR/conf.d/dws.toml" <<-EOF &&
	[dws]
	instance = "$INSTANCE"
	kubeconfig = "$DWS_KUBECONFIG"
	heartbeat = "1s"

	[dws.timeouts.prerun]
	max = "1h"

	[ingest.validator]
	plugins = ["jobspec", "$DWS_SRCDIR/flux_dws/validator.py"]
	EOF
    flux config reload &&
    dws_load_plugin &&
    dws_service_start
'

# --------------------------------------------------------------------- success

test_expect_success 'a #DW job runs with its storage: every task sees DW_JOB_scratch' '
    flux run -N2 -n2 -S dw="$DW" printenv DW_JOB_scratch DW_WORKFLOW_NAME \
        >env.out 2>env.err &&
    id=$(flux job last) &&
    ends $id &&
    test_must_be_empty env.err &&
    path=$(head -1 env.out) &&
    case "$path" in /mnt/nnf/?*-0) ;; *) false ;; esac &&
    printf "%s\n%s\n%s\n%s\n" "$path" "$path" $(workflow_of $id) $(workflow_of $id) \
        >env.expected &&
    sort env.out >env.sorted &&
    test_cmp env.expected env.sorted &&
    flux job eventlog $id | grep -F "\"DW_JOB_scratch\":\"$path\"" &&
    has_states $id $ALL_STATES &&
    has_outcome $id COMPLETED &&
    no_workflow_left $id
'

# --------------------------------------------------------------------- containers

# fails_before_run PROFILE TEXT: the containers never start: the job gets a dws exception
# and never runs; PostRun and DataOut are skipped.
fails_before_run() {
    test_must_fail flux run -S dw="$(container_dw $1)" true 2>$1.err &&
    id=$(flux job last) &&
    ends $id &&
    grep -F "type=dws severity=0 PreRun failed: " $1.err &&
    grep -F "$2" $1.err &&
    outcome_of $id >$1.outcome &&
    grep -F "FAILED dws PreRun failed: " $1.outcome &&
    grep -F "$2" $1.outcome &&
    flux job eventlog $id >$1.eventlog &&
    grep "exception type=\"dws\" severity=0 note=\"PreRun failed: " $1.eventlog &&
    grep "dws-container .*phase=\"PreRun\"" $1.eventlog &&
    ! awk "{print \$2}" $1.eventlog | grep -x start &&
    has_states $id Proposal Setup DataIn PreRun Teardown &&
    no_workflow_left $id
}

test_expect_success 'a container that cannot start (image pull) fails the job before it runs' '
    fails_before_run start-fail "user container(s) failed to start"
'

test_expect_success 'a container still starting at the PreRun timeout fails the job before it runs' '
    fails_before_run never-start "user container(s) failed to start after 300 seconds"
'

# fails_after_run PROFILE TEXT: the tasks ran and exited 0, then PostRun failed: Flux keeps
# the result COMPLETED (and {success} True: both are fixed at finish), but flux run and
# flux job status exit 1, the dws memo says FAILED and why, and so does flux dws status,
# every failure line in the one form; DataOut is skipped.
fails_after_run() {
    test_must_fail flux run -S dw="$(container_dw $1)" true 2>$1.err &&
    id=$(flux job last) &&
    ends $id &&
    grep -F "type=dws severity=0 PostRun failed: " $1.err &&
    grep -F "$2" $1.err &&
    outcome_of $id >$1.outcome &&
    grep -F "COMPLETED dws PostRun failed: #DW container name=" $1.outcome &&
    grep -F "$2" $1.outcome &&
    test_must_fail flux job status $id &&
    test "$(flux jobs -n -o "{success}" $id)" = True &&
    flux jobs -n -o "{user.dws.result}" $id >$1.memo &&
    test "$(cat $1.memo)" = FAILED &&
    flux jobs -n -o "{user.dws.reason}" $id >$1.reason &&
    grep -F "PostRun failed: #DW container name=app profile=$1 DW_JOB_local_storage=shared: " $1.reason &&
    grep -F "$2" $1.reason &&
    "$DWS_PYTHON" -m flux_dws status $id >$1.status &&
    grep "^STATE  *INACTIVE (FAILED); flux jobs shows COMPLETED" $1.status &&
    grep -F "EXCEPTION  dws: $(cat $1.reason)" $1.status &&
    grep -F "CONTAINER  $(cat $1.reason)" $1.status &&
    flux job eventlog $id >$1.eventlog &&
    grep "finish status=0" $1.eventlog &&
    grep "dws-container .*phase=\"PostRun\"" $1.eventlog &&
    has_states $id Proposal Setup DataIn PreRun PostRun Teardown &&
    no_workflow_left $id
}

test_expect_success 'a container exiting non-zero fails the job after it ran' '
    fails_after_run exit-nonzero "container job Failed"
'

test_expect_success 'flux dws logs shows the failed container: exit code and last lines' '
    id=$(flux job last) &&
    "$DWS_PYTHON" -m flux_dws logs $id >exit-nonzero.logs &&
    grep "container app in pod .*: exit code 1 (Error)" exit-nonzero.logs &&
    grep -A1 "cannot open input /mnt/nnf/data/missing.dat" exit-nonzero.logs | tail -1 |
        grep "exiting with status 1" &&
    flux job eventlog $id | grep "dws-container .*\"exit_code\":1" &&
    flux job info $id dws.output >exit-nonzero.saved &&
    test_must_fail env FLUX_HANDLE_ROLEMASK=0x2 FLUX_HANDLE_USERID=4242 \
        flux job info $id dws.output 2>guest.err &&
    grep "access is restricted to job/instance owner" guest.err
'

test_expect_success 'a crash-looping container fails the job after it ran' '
    fails_after_run crash-loop "user container(s) failed to run successfully after 7 attempts"
'

test_expect_success 'a container that never exits fails the job at the PostRun timeout' '
    fails_after_run hang "user container(s) failed to complete after 300 seconds"
'

# --------------------------------------------------------------------- errors and timeouts

test_expect_success 'an Error in Setup fails the job with the driver message' '
    test_must_fail flux run \
        -S dw="$(dw_list "$DW" "#DW Setup action=error message=no_space_left severity=Fatal")" \
        true 2>setup.err &&
    id=$(flux job last) &&
    ends $id &&
    grep -F "type=dws severity=0 Setup failed: " setup.err &&
    outcome_of $id >setup.outcome &&
    grep -F "FAILED dws Setup failed: " setup.outcome &&
    grep -F no_space_left setup.outcome &&
    ! dws_event_names $id | grep -x start &&
    has_states $id Proposal Setup Teardown &&
    no_workflow_left $id
'

test_expect_success 'a state timeout set with -S fails the job naming the state' '
    id=$(flux submit -S dw="$(dw_list "$DW" "#DW PreRun action=wait")" \
        -S dw_timeout.prerun=2s true) &&
    ends $id &&
    outcome_of $id >timeout.outcome &&
    grep -F "FAILED dws PreRun failed: did not complete within 2s; flux dws status " timeout.outcome &&
    flux job eventlog $id >timeout.eventlog &&
    grep "dws-workflow .*\"prerun\":\"2s\"" timeout.eventlog &&
    grep "dws-state state=\"PreRun\" timeout=\"2s\"" timeout.eventlog &&
    ! awk "{print \$2}" timeout.eventlog | grep -x start &&
    no_workflow_left $id
'

test_expect_success 'a timeout above the site maximum is rejected at submit, in one line' '
    flux jobs -a -n -o "{id}" >before.ids &&
    test_must_fail flux submit -S dw="$DW" -S dw_timeout.prerun=2h true 2>max.err &&
    grep "dw_timeout.prerun=2h exceeds the site maximum of 1h" max.err &&
    test $(wc -l <max.err) -eq 1 &&
    flux jobs -a -n -o "{id}" >after.ids &&
    test_cmp before.ids after.ids
'

# --------------------------------------------------------------------- cancel

test_expect_success 'one cancel during PreRun ends the job before it runs' '
    id=$(flux submit -S dw="$(dw_list "$DW" "#DW PreRun action=wait")" true) &&
    dws_kube wait-state $(workflow_of $id) PreRun &&
    flux cancel $id &&
    ends $id &&
    has_outcome $id "CANCELED cancel" &&
    test_must_fail flux job attach $id &&
    ! dws_event_names $id | grep -x start &&
    has_states $id Proposal Setup DataIn PreRun Teardown &&
    no_workflow_left $id
'

test_expect_success 'one cancel during DataOut ends it; the tasks keep their result' '
    id=$(flux submit -S dw="$(dw_list "$DW" "#DW DataOut action=wait")" true) &&
    dws_kube wait-state $(workflow_of $id) DataOut &&
    flux cancel $id &&
    ends $id &&
    has_outcome $id "COMPLETED cancel" &&
    test_must_fail flux job attach $id 2>attach.err &&
    grep "job.exception .* type=cancel" attach.err &&
    has_states $id $ALL_STATES &&
    no_workflow_left $id
'

# --------------------------------------------------------------------- service down

test_expect_success 'a job submitted while the service is down waits, then runs' '
    dws_service_kill &&
    id=$(flux submit -S dw="$DW" printenv DW_JOB_scratch) &&
    flux job wait-event -t $DWS_TIMEOUT $id dws-waiting >down.event &&
    grep -F "reason=\"flux-dws service is not running\"" down.event &&
    test "$(flux jobs -n -o "{state}" $id)" = DEPEND &&
    ! dws_event_names $id | grep -x dws-workflow &&
    dws_service_start &&
    ends $id &&
    has_outcome $id COMPLETED &&
    flux job attach $id >down.out &&
    grep "^/mnt/nnf/..*-0$" down.out &&
    no_workflow_left $id
'

test_expect_success 'the service is killed with jobs in DEPEND, prolog and epilog: they stay held' '
    dep=$(flux submit -S dw="$(dw_list "$DW" "#DW Proposal action=wait")" true) &&
    pro=$(flux submit -S dw="$(dw_list "$DW" "#DW PreRun action=wait")" \
        printenv DW_JOB_scratch) &&
    epi=$(flux submit -S dw="$(dw_list "$DW" "#DW DataOut action=wait")" true) &&
    dws_kube wait-state $(workflow_of $dep) Proposal &&
    dws_kube wait-state $(workflow_of $pro) PreRun &&
    dws_kube wait-state $(workflow_of $epi) DataOut &&
    dws_service_kill &&
    flux job wait-event -t $DWS_TIMEOUT $dep dws-waiting &&
    test "$(flux jobs -n -o "{state}" $dep $pro $epi | xargs)" = "DEPEND RUN CLEANUP" &&
    ! dws_event_names $pro | grep -x start &&
    for j in $dep $pro $epi; do
        ! dws_event_names $j | grep -x exception || return 1
    done
'

test_expect_success 'restarted, the service picks them up: each ends once its state is ready' '
    dws_service_start &&
    dws_kube force-ready $(workflow_of $dep) &&
    dws_kube force-ready $(workflow_of $pro) &&
    dws_kube force-ready $(workflow_of $epi) &&
    for j in $dep $pro $epi; do
        ends $j &&
        has_outcome $j COMPLETED &&
        has_states $j $ALL_STATES &&
        no_workflow_left $j || return 1
    done &&
    flux job attach $pro >pro.out &&
    grep "^/mnt/nnf/..*-0$" pro.out
'

# --------------------------------------------------------------------- nothing left

test_expect_success 'no job is held and no workflow is left behind' '
    dws_rpc list >held.json &&
    dws_json held.json "r[\"jobs\"] == []" &&
    dws_kube workflows >left.out &&
    test_must_be_empty left.out
'

test_expect_success KUBECTL 'kubectl agrees: no workflow in any namespace' '
    kubectl --kubeconfig="$DWS_KUBECONFIG" get workflows -A -o name >kubectl.out &&
    test_must_be_empty kubectl.out
'

test_expect_success 'the service and the plugin logged no errors' '
    ! grep -E "ERROR|CRITICAL|Traceback" service.log &&
    flux dmesg >dmesg.log &&
    grep "dws" dmesg.log >dws.log;
    ! grep -E "\.(err|crit|alert|emerg)\[" dws.log
'

test_expect_success 'cleanup: stop the service and dwssim' '
    dws_stop_background
'

test_done
