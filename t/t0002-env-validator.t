#!/bin/sh
# SPDX-License-Identifier: LGPL-3.0-only

test_description='the dws-env job shell plugin and the ingest validator on a real Flux instance

dws-env puts the last dws-environment event into every task of a #DW job.  The dws jobtap
plugin is NOT loaded here (it would hold #DW jobs in DEPEND): the events it would post are
posted by hand through flux-core'"'"'s post-event service, in the same order.  The validator
is flux_dws/validator.py loaded by job-ingest from [ingest.validator].'

. "${SHARNESS:-/usr/share/sharness/sharness.sh}"
. "$SHARNESS_TEST_DIRECTORY/lib.sh"

DWS_SHELL_PLUGIN=$DWS_SRCDIR/shell/dws-env.so
if ! make -C "$DWS_SRCDIR/shell" --no-print-directory >shell-build.log 2>&1; then
    cat shell-build.log >&2
    error "building the dws-env shell plugin failed (make -C shell)"
fi
if ! test -f "$DWS_SHELL_PLUGIN"; then
    skip_all="$(cat shell-build.log): skipping t0002"
    test_done
fi

dws_test_under_flux 2

DW='#DW jobdw type=xfs capacity=1GiB name=scratch'
ENV='{"DW_JOB_scratch": "/mnt/nnf/x-0", "DW_WORKFLOW_NAME": "w"}'

cat >dws-env.lua <<EOF
plugin.load{file="$DWS_SHELL_PLUGIN"}
EOF
USERRC=$PWD/dws-env.lua  # the trash directory name has a space: always quote it

# post_events JOBID NAME JSON [NAME JSON...]: post events back to back from one process,
# as the dws jobtap plugin does (the job-manager may commit them in one batch).
cat >post-events.py <<'EOF'
import json
import sys

import flux
from flux.job import JobID

h = flux.Flux()
jobid = JobID(sys.argv[1])
pairs = zip(sys.argv[2::2], sys.argv[3::2])
futures = [
    h.rpc("job-manager.post-event.post", {"id": jobid, "name": n, "context": json.loads(c)})
    for n, c in pairs
]
for f in futures:
    f.get()
EOF
post_events() {
    flux python post-events.py "$@"
}

# held_job [RUN-OPTIONS...] -- COMMAND...: submit with urgency 0, print the job ID.
held_job() {
    flux run --dry-run -o userrc="$USERRC" "$@" | flux job submit --urgency=0
}

# finish_job JOBID OUT ERR: release the hold, wait for the job, collect its output.
finish_job() {
    flux job urgency $1 default &&
    flux job wait-event -t $DWS_TIMEOUT $1 clean >/dev/null &&
    flux job attach -l $1 >$2 2>$3
}

# --------------------------------------------------------------------- the job environment

dws_setup 'make check builds the shell plugin with -Werror' '
    make -C "$DWS_SRCDIR/shell" --no-print-directory check >check.out 2>&1 ||
    { cat check.out; false; }
'

test_expect_success 'every task of a #DW job sees the dws-environment variables' '
    id=$(held_job -N2 -n2 -S dw="$DW" printenv DW_JOB_scratch DW_WORKFLOW_NAME) &&
    post_events $id dws-environment "{\"env\": $ENV}" &&
    finish_job $id env.out env.err &&
    cat >env.expected <<-EOF &&
	0: /mnt/nnf/x-0
	0: w
	1: /mnt/nnf/x-0
	1: w
	EOF
    sort env.out >env.sorted &&
    test_cmp env.expected env.sorted &&
    test_must_fail grep dws-env env.err
'

test_expect_success 'the last dws-environment event wins' '
    id=$(held_job -S dw="$DW" printenv DW_JOB_scratch) &&
    post_events $id dws-environment "{\"env\": {\"DW_JOB_scratch\": \"/old\"}}" \
        dws-environment "{\"env\": {\"DW_JOB_scratch\": \"/new\"}}" &&
    finish_job $id last.out last.err &&
    echo "0: /new" >last.expected &&
    test_cmp last.expected last.out
'

# The dws jobtap plugin adds the dependency "dws", holds the job in prolog "dws", and posts
# dws-environment just before prolog-finish.  The job-manager sends the start request on
# prolog-finish, before that batch of events is committed: the shell must wait for it.
test_expect_success 'a job held in the dws prolog gets the event posted just before prolog-finish' '
    for i in 1 2 3; do
        id=$(held_job -N2 -n2 -S dw="$DW" printenv DW_JOB_scratch) &&
        post_events $id dependency-add "{\"description\": \"dws\"}" \
            prolog-start "{\"description\": \"dws\"}" &&
        flux job urgency $id default &&
        flux job wait-event -t $DWS_TIMEOUT $id alloc >/dev/null &&
        post_events $id dws-environment "{\"env\": {\"DW_JOB_scratch\": \"/mnt/$i\"}}" \
            prolog-finish "{\"description\": \"dws\", \"status\": 0}" &&
        flux job wait-event -t $DWS_TIMEOUT $id clean >/dev/null &&
        flux job attach -l $id >prolog.out &&
        printf "0: /mnt/$i\n1: /mnt/$i\n" >prolog.expected &&
        sort prolog.out >prolog.sorted &&
        test_cmp prolog.expected prolog.sorted || return 1
    done
'

test_expect_success 'a job without dw is unaffected, even with a dws-environment event' '
    id=$(held_job sh -c "echo \${DW_JOB_scratch-unset}") &&
    post_events $id dws-environment "{\"env\": $ENV}" &&
    finish_job $id nodw.out nodw.err &&
    echo "0: unset" >nodw.expected &&
    test_cmp nodw.expected nodw.out &&
    test_must_fail grep dws-env nodw.err
'

test_expect_success 'a #DW job without the event fails with one line; no task starts' '
    test_must_fail flux run -o userrc="$USERRC" -S dw="$DW" sh -c "echo started" \
        >noevent.out 2>noevent.err &&
    test_must_be_empty noevent.out &&
    grep "ERROR: dws-env: #DW job has no dws-environment event: its tasks do not start" \
        noevent.err &&
    test $(grep -c "ERROR: dws-env:" noevent.err) -eq 1
'

# The stall plugin (t/stall-plugin.c) stops the job-manager in the job's start event,
# before it is committed: the shell runs, and the job eventlog it watches stays short of
# its start (prolog-finish of the dws prolog, which nobody posts here, or start).  The job
# has no time limit and no PreRun deadline: only dws-env's own bound ends the wait.  While
# it waits the shell says so in the broker log and on its stderr; at the bound it gives up
# with one line naming the last event it saw, which becomes the job's exception once the
# job-manager goes on.  The test lets the job-manager go only after the broker log shows
# the shell gave up: the order, not time, decides.
dws_setup 'build the stall plugin' '
    pc="pkg-config" &&
    { pkg-config --exists flux-core || pc="env PKG_CONFIG_PATH=/opt/flux/lib/pkgconfig pkg-config"; } &&
    cc -shared -fPIC -Wall -Werror -o stall-plugin.so "$SHARNESS_TEST_DIRECTORY/stall-plugin.c" \
        $($pc --cflags --libs flux-core)
'

# dmesg_all: every broker's log (flux dmesg shows the broker it asks, and a shell logs to
# the broker of its node), read whole before anything greps it.
dmesg_all() {
    flux exec -r all flux dmesg >dmesg.all &&
    cat dmesg.all
}

# dmesg_wait ERE: wait (DWS_TIMEOUT) for a broker log line matching ERE.
dmesg_wait() {
    local deadline=$(($(date +%s) + DWS_TIMEOUT))
    until dmesg_all >dmesg.out && grep -E "$1" dmesg.out; do
        test $(date +%s) -lt $deadline || return 1
        sleep 0.2
    done
}

# release_stall [FIFO]: let the job-manager go on (opening the FIFO read-write never blocks).
release_stall() {
    : <>"${1:-stall.fifo}"
}

test_expect_success 'a shell whose job eventlog stops short of its start gives up at its bound' '
    mkfifo stall.fifo &&
    flux jobtap load "$PWD/stall-plugin.so" fifo="$PWD/stall.fifo" &&
    test_when_finished "release_stall; flux jobtap remove stall-plugin.so" &&
    id=$(held_job -o dws.env-timeout=10s -S dw="$DW" sh -c "echo started") &&
    f58=$(dws_f58 $id) &&
    post_events $id dependency-add "{\"description\": \"dws\"}" &&
    flux job urgency $id default &&
    dmesg_wait "dws-env.*job $f58 \(shell rank 0\): gave up after 10s: the job eventlog did not show prolog-finish of the dws prolog \(last event seen: [a-z-]+\)" \
        >gave-up.out &&
    dmesg_all >dmesg.out &&
    grep "dws-env.*job $f58 (shell rank 0): still waiting after [0-9]*s for the job eventlog to show prolog-finish of the dws prolog (last event seen: [a-z-]*); reading it from rank 0 too; giving up after 10s" dmesg.out &&
    release_stall &&
    flux job wait-event -t $DWS_TIMEOUT $id clean >/dev/null &&
    ! flux job attach -l $id >silent.out 2>silent.err &&
    test_must_be_empty silent.out &&
    grep "stderr: dws-env: still waiting after [0-9]*s for the job eventlog to show prolog-finish of the dws prolog" silent.err &&
    grep "ERROR: dws-env: the job eventlog did not show prolog-finish of the dws prolog within 10s (-o dws.env-timeout); last event seen: [a-z-]*$" silent.err &&
    test $(grep -c "ERROR: dws-env:" silent.err) -eq 1 &&
    flux job eventlog $id >silent.eventlog &&
    grep "exception type=\"exec\" severity=0 note=\"dws-env: the job eventlog did not show prolog-finish of the dws prolog within 10s (-o dws.env-timeout); last event seen: " silent.eventlog &&
    flux job eventlog -p exec $id | grep "log .*still waiting after [0-9]*s"
'

# kvs_rpc RANK TOPIC: a kvs.TOPIC request for the primary namespace to the broker of RANK.
kvs_rpc() {
    flux python -c "import flux, sys; flux.Flux().rpc(sys.argv[2], {\"namespace\": \"primary\"}, nodeid=int(sys.argv[1])).get()" "$@"
}

# A broker other than rank 0 can serve an eventlog a commit behind (flux-core: its KVS
# sets a namespace up on the first request for it and subscribes to its setroot events
# only once that is answered, so a commit in between is never applied there, until the
# next one).  Here on purpose, in order: rank 1 is brought up to date, then its KVS is
# paused (kvs.setroot-pause, flux-core's test hook); dws-environment, prolog-finish and
# start are committed while the job shell waits at a gate (its job_shell), and rank 1 has
# passed their setroot event (flux exec answers after it) with no kvs-watch there to
# follow it; only then does flux-shell start.  Nothing else commits in this instance until
# the job's tasks end, so rank 1 shows the shell an eventlog that stops at alloc.  The
# shell reads it from rank 0 instead, says so, and its tasks start with their environment.
test_expect_success 'a shell whose broker serves an eventlog a commit behind reads rank 0' '
    mkfifo gate.fifo &&
    cat >gate-shell.sh <<-EOF &&
	#!/bin/sh
	cat "$PWD/gate.fifo" >/dev/null
	exec "$(flux config builtin shell_path)" "\$@"
	EOF
    chmod +x gate-shell.sh &&
    id=$(held_job -N1 --requires=rank:1 -S exec.job_shell="$PWD/gate-shell.sh" \
        -S dw="$DW" printenv DW_JOB_scratch) &&
    f58=$(dws_f58 $id) &&
    post_events $id dependency-add "{\"description\": \"dws\"}" \
        prolog-start "{\"description\": \"dws\"}" &&
    flux job urgency $id default &&
    flux job wait-event -t $DWS_TIMEOUT $id alloc >/dev/null &&
    flux exec -r 1 flux kvs wait $(flux kvs version) &&
    kvs_rpc 1 kvs.setroot-pause &&
    test_when_finished "kvs_rpc 1 kvs.setroot-unpause" &&
    post_events $id dws-environment "{\"env\": {\"DW_JOB_scratch\": \"/mnt/behind\"}}" \
        prolog-finish "{\"description\": \"dws\", \"status\": 0}" &&
    flux job wait-event -t $DWS_TIMEOUT $id start >/dev/null &&
    flux exec -r 1 true &&
    timeout $DWS_TIMEOUT sh -c "echo go >gate.fifo" &&
    dmesg_wait "dws-env.*job $f58 \(shell rank 0\): read the job eventlog from rank 0 after [0-9]+s: it shows prolog-finish of the dws prolog there, but this node.s broker still shows it only up to alloc" &&
    kvs_rpc 1 kvs.setroot-unpause &&
    flux job wait-event -t $DWS_TIMEOUT $id clean >/dev/null &&
    flux job attach -l $id >behind.out 2>behind.err &&
    echo "0: /mnt/behind" >behind.expected &&
    test_cmp behind.expected behind.out &&
    grep "stderr: dws-env: read the job eventlog from rank 0 after [0-9]*s" behind.err &&
    test_must_fail grep ERROR behind.err
'

test_expect_success 'a #DW job whose dws.env-timeout is not a duration fails with one line' '
    test_must_fail flux run -o userrc="$USERRC" -o dws.env-timeout=soon -S dw="$DW" \
        sh -c "echo started" >badopt.out 2>badopt.err &&
    test_must_be_empty badopt.out &&
    grep "ERROR: dws-env: shell option dws.env-timeout=\"soon\" is not a duration such as 10m" \
        badopt.err &&
    test $(grep -c "ERROR: dws-env:" badopt.err) -eq 1
'

# malformed CONTEXT MESSAGE: the job fails in shell init, the message says why.
malformed() {
    id=$(held_job -S dw="$DW" printenv DW_JOB_scratch) &&
    post_events $id dws-environment "$1" &&
    flux job urgency $id default &&
    flux job wait-event -t $DWS_TIMEOUT $id clean >/dev/null &&
    ! flux job attach -l $id >bad.out 2>bad.err &&
    grep "ERROR: dws-env: dws-environment event is malformed: $2" bad.err &&
    flux job wait-event -t $DWS_TIMEOUT $id exception >/dev/null &&
    test_must_be_empty bad.out
}

test_expect_success 'a malformed dws-environment event fails the job, naming the fault' '
    malformed "{}" "context.env is missing" &&
    malformed "{\"env\": [\"A\"]}" "context.env is not an object" &&
    malformed "{\"env\": {\"A\": \"x\", \"B\": 1}}" "env.B is not a string" &&
    malformed "{\"env\": {\"A=B\": \"x\"}}" "invalid variable name \"A=B\""
'

test_expect_success 'make install honours DESTDIR' '
    make -C "$DWS_SRCDIR/shell" --no-print-directory install DESTDIR="$PWD/root" \
        >install.out 2>&1 &&
    plugindir=$(PKG_CONFIG_PATH=/opt/flux/lib/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH} \
        pkg-config --variable=fluxshellpluginpath flux-core) &&
    test -f "root$plugindir/dws-env.so"
'

test_expect_success 'without flux-core every make target prints one line and succeeds' '
    for target in all check install clean; do
        make -C "$DWS_SRCDIR/shell" --no-print-directory PKG_CONFIG=false $target \
            >nocore.out 2>&1 &&
        echo "flux-core not found (pkg-config flux-core): skipping the dws-env shell plugin build" \
            >nocore.expected &&
        test_cmp nocore.expected nocore.out || return 1
    done &&
    test -f "$DWS_SHELL_PLUGIN"
'

# ------------------------------------------------------------------------------ the validator

VALIDATOR_TOML=$DWS_CONF_DIR/conf.d/dws-validator.toml

# configure_validator [DWS-TOML-LINES]: enable the validator with this [dws] table; reload.
configure_validator() {
    cat >"$VALIDATOR_TOML" <<-EOF &&
	[ingest.validator]
	plugins = ["jobspec", "$DWS_SRCDIR/flux_dws/validator.py"]

	[dws]
	$1
	EOF
    flux config reload
}

test_expect_success 'the instance python imports flux_dws from this tree' '
    (cd / && flux python -c "import flux_dws, sys; print(flux_dws.__file__)") >where.out &&
    echo "$DWS_SRCDIR/flux_dws/__init__.py" >where.expected &&
    test_cmp where.expected where.out
'

test_expect_success 'configure the validator with a prerun maximum of 1h' '
    configure_validator "timeouts.prerun.max = \"1h\"" &&
    flux config get ingest.validator.plugins | grep validator.py
'

test_expect_success 'a timeout above the site maximum is rejected at submit' '
    test_must_fail flux run -S dw="$DW" -S dw_timeout.prerun=2h hostname 2>long.err &&
    grep "system.dw_timeout.prerun=2h exceeds the site maximum of 1h" long.err &&
    test $(wc -l <long.err) -eq 1
'

test_expect_success 'a bad directive is rejected at submit, naming the directive' '
    test_must_fail flux submit -S dw="#DW jobdw type=xfs name=scratch" hostname 2>dir.err &&
    grep "system.dw: #DW directive 0 (jobdw): missing required key .capacity." dir.err &&
    test $(wc -l <dir.err) -eq 1
'

test_expect_success 'dw_timeout without dw is rejected at submit' '
    test_must_fail flux submit -S dw_timeout.prerun=10m hostname 2>nodw.err &&
    grep "system.dw_timeout is set but system.dw is not" nodw.err
'

test_expect_success 'a good #DW job is accepted (then cancelled)' '
    id=$(flux submit --urgency=0 -S dw="$DW" -S dw_timeout.prerun=30m hostname) &&
    flux job eventlog $id | grep -w validate &&
    flux cancel $id
'

test_expect_success 'a job without dw is accepted' '
    flux run hostname
'

test_expect_success 'a bad [dws] table rejects every #DW job, naming the key' '
    configure_validator "namespce = \"x\"" &&
    test_must_fail flux submit -S dw="$DW" hostname 2>badconf.err &&
    grep "DWS configuration is invalid (\[dws\] unknown key .namespce." badconf.err &&
    test $(wc -l <badconf.err) -eq 1 &&
    flux dmesg | grep "flux-dws.validator: ERROR: \[dws\] unknown key .namespce." &&
    flux run hostname
'

test_expect_success 'with rabbit scheduling, a job without dw that asks for ssd is refused' '
    configure_validator "rabbit-scheduling = true" &&
    flux run --dry-run -N1 hostname >plain.json &&
    flux python -c "import json, sys; j = json.load(sys.stdin); \
j[\"resources\"][0][\"with\"].append({\"type\": \"ssd\", \"count\": 1}); \
print(json.dumps(j))" <plain.json >ssd.json &&
    test_must_fail flux job submit ssd.json 2>ssd.err &&
    grep "the job.s resources ask for ssd themselves; rabbit storage is asked for with #DW jobdw" ssd.err &&
    test $(wc -l <ssd.err) -eq 1 &&
    flux job submit plain.json >plain.id &&
    flux job wait-event $(cat plain.id) clean
'

test_expect_success 'with rabbit scheduling, a #DW job with storage must ask for whole nodes' '
    test_must_fail flux submit -n1 -S dw="$DW" hostname 2>shape.err &&
    grep "a job with rabbit storage must ask for whole nodes (flux run -N)" shape.err &&
    test $(wc -l <shape.err) -eq 1 &&
    id=$(flux submit --urgency=0 -N1 -S dw="$DW" hostname) &&
    flux cancel $id
'

test_expect_success 'remove the validator configuration' '
    rm -f "$VALIDATOR_TOML" &&
    flux config reload &&
    flux submit --urgency=0 -S dw="$DW" -S dw_timeout.prerun=2h hostname >id.out &&
    flux cancel $(cat id.out)
'

test_done
