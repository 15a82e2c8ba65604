#!/bin/sh
# SPDX-License-Identifier: LGPL-3.0-only

test_description='dws jobtap plugin: doc/protocol.rst on a real Flux instance

The flux-dws service is played by hand: raw job-manager.dws.* requests and watch
streams from small flux python scripts (t/lib.sh), checked against what
flux_dws/testing/fakeflux does for the same requests.'

. "${SHARNESS:-/usr/share/sharness/sharness.sh}"
. "$SHARNESS_TEST_DIRECTORY/lib.sh"

dws_test_under_flux 2

DW='#DW jobdw type=xfs capacity=10GiB name=scratch'

# Submit a #DW job (extra flux submit arguments before the command).
submit_dw() {
    flux submit -S dw="$DW" -S dw_timeout.prerun=10m "$@"
}

# Drive a job to the dws prolog: release it, wait for prolog-start.
to_prolog() {
    dws_rpc release "{\"id\": $(dws_dec $1), \"update\": {}}" >/dev/null &&
    flux job wait-event -t $DWS_TIMEOUT $1 prolog-start >/dev/null
}

# set_dws_config [TOML-LINES]: the instance's [dws] table, reloaded.  Always with a 1s
# heartbeat, so the plugin counts a silent service as gone after 3s.
set_dws_config() {
    printf "[dws]\nheartbeat = \"1s\"\n%s\n" "$1" >"$DWS_CONF_DIR/conf.d/dws.toml" &&
    flux config reload
}

# dws_waiting_count JOBID: how many dws-waiting events the job has.
dws_waiting_count() {
    dws_event_names $1 | grep -c "^dws-waiting$"
}

# Check one dws_rpc error: errno name and exact message.
rpc_fails() {
    local errname=$1 message=$2
    shift 2
    test_must_fail dws_rpc "$@" >rpc.out &&
    echo "error: $errname: $message" >rpc.expected &&
    test_cmp rpc.expected rpc.out
}

dws_setup 'load the dws plugin; its methods are job-manager.dws.*' '
    set_dws_config "" &&
    dws_load_plugin &&
    flux jobtap list >list.out &&
    grep "^dws-jobtap.so$" list.out &&
    dws_rpc list >empty.out &&
    echo "{\"jobs\": [], \"service\": {\"active\": null, \"standbys\": 0, \"persistent\": null}}" >empty.expected &&
    test_cmp empty.expected empty.out
'

test_expect_success 'a second load of the same plugin fails' '
    test_must_fail dws_load_plugin 2>again.err &&
    grep "already loaded" again.err
'

# --------------------------------------------------------------- submit-time checks

test_expect_success 'dw_timeout without dw is rejected at submit with one line' '
    test_must_fail flux submit -S dw_timeout.prerun=10m hostname 2>reject.err &&
    grep "attributes.system.dw_timeout requires attributes.system.dw" reject.err &&
    test $(wc -l <reject.err) -eq 1
'

test_expect_success 'malformed dw and dw_timeout are rejected at submit' '
    test_must_fail flux submit -S dw="" hostname 2>empty.err &&
    grep "attributes.system.dw must be a non-empty string or list of strings" empty.err &&
    test_must_fail flux submit -S "dw=[]" hostname 2>list.err &&
    grep "attributes.system.dw must be a non-empty string" list.err &&
    test_must_fail flux submit -S "dw=[\"#DW a\", 3]" hostname 2>mixed.err &&
    grep "attributes.system.dw must be a non-empty string" mixed.err &&
    test_must_fail flux submit -S dw="#DW x" -S dw_timeout=10m hostname 2>table.err &&
    grep "attributes.system.dw_timeout must be a table of state = duration" table.err &&
    test_must_fail flux submit -S dw="#DW x" -S dw_timeout.prerun=-1 hostname 2>neg.err &&
    grep "attributes.system.dw_timeout.prerun must be a duration string or a non-negative number" neg.err &&
    test_must_fail flux submit -S dw="#DW x" -S dw_timeout.setup=true hostname 2>bool.err &&
    grep "attributes.system.dw_timeout.setup must be" bool.err &&
    flux jobs -a -n -o "{id}" >jobs.out &&
    test_must_be_empty jobs.out
'

test_expect_success 'well-formed attributes are accepted and the job waits in DEPEND' '
    a=$(flux submit -S "dw=[\"#DW jobdw type=xfs capacity=1GiB name=a\", \"#DW copy_in source=/a destination=\$DW_JOB_a/\"]" true) &&
    b=$(flux submit -S dw="#DW x" -S dw_timeout.prerun=0 -S dw_timeout.setup=2.5 \
        -S dw_timeout.teardown=1h true) &&
    flux job wait-event -t $DWS_TIMEOUT $a dws-waiting &&
    flux job wait-event -t $DWS_TIMEOUT $b dws-waiting &&
    test "$(flux jobs -n -o "{state}" $a)" = DEPEND &&
    test "$(flux jobs -n -o "{state}" $b)" = DEPEND &&
    flux cancel $a $b
'

test_expect_success 'cancelled DEPEND jobs wait in the dws epilog until epilog-finish' '
    flux job wait-event -t $DWS_TIMEOUT $a epilog-start &&
    flux job wait-event -t $DWS_TIMEOUT $b epilog-start &&
    dws_rpc epilog-finish "{\"id\": $(dws_dec $a)}" &&
    dws_rpc epilog-finish "{\"id\": $(dws_dec $b)}" &&
    flux job wait-event -t $DWS_TIMEOUT $a clean &&
    flux job wait-event -t $DWS_TIMEOUT $b clean &&
    dws_event_names $a | tail -4 >cancelled.names &&
    printf "exception\nepilog-start\nepilog-finish\nclean\n" >cancelled.expected &&
    test_cmp cancelled.expected cancelled.names &&
    ! dws_event_names $a | grep -x -e alloc -e free &&
    test "$(flux jobs -n -o "{result}" $a)" = CANCELED
'

test_expect_success 'a job without dw runs unheld and is not listed' '
    plain=$(flux submit true) &&
    flux job wait-event -t $DWS_TIMEOUT $plain clean &&
    dws_event_names $plain >plain.names &&
    cat >plain.expected <<-EOF &&
	submit
	validate
	depend
	priority
	alloc
	start
	finish
	release
	free
	clean
	EOF
    test_cmp plain.expected plain.names &&
    dws_rpc list >plain.list &&
    test_cmp empty.expected plain.list &&
    rpc_fails ENOENT "job $(dws_f58 $plain) is not held by the dws plugin" \
        post "{\"id\": $(dws_dec $plain), \"name\": \"dws-state\", \"context\": {}}"
'

# --------------------------------------------------------------- without a service

test_expect_success 'without a service, a #DW job gets dependency dws and dws-waiting' '
    waiting=$(submit_dw true) &&
    flux job wait-event -t $DWS_TIMEOUT $waiting dws-waiting >waiting.event &&
    grep "reason=\"flux-dws service is not running\"" waiting.event &&
    dws_event_names $waiting >waiting.names &&
    printf "submit\nvalidate\ndependency-add\ndws-waiting\n" >waiting.expected &&
    test_cmp waiting.expected waiting.names &&
    flux job eventlog $waiting | grep "dependency-add description=\"dws\""
'

test_expect_success 'list describes the waiting job (record contents in depend)' '
    dws_rpc list >list.json &&
    submit_ts=$(flux job eventlog -f json $waiting | head -1 | \
        flux python -c "import json,sys; print(repr(json.load(sys.stdin)[\"timestamp\"]))") &&
    dws_json list.json "len(r[\"jobs\"]) == 1" &&
    dws_json list.json "r[\"jobs\"][0][\"resources\"][0][\"type\"] in (\"node\", \"slot\")" &&
    dws_json list.json "dict(r[\"jobs\"][0], resources=None) == {
        \"id\": $(dws_dec $waiting), \"userid\": $(id -u), \"t_submit\": $submit_ts,
        \"phase\": \"depend\",
        \"attributes\": {\"dw\": \"$DW\", \"dw_timeout\": {\"prerun\": \"10m\"}},
        \"hosts\": [], \"rabbits\": {}, \"ssd\": [], \"resources\": None,
        \"started\": False, \"exception\": None,
        \"dws\": {\"dws-waiting\": {\"reason\": \"flux-dws service is not running\"}}}"
'

test_expect_success 'a non-fatal exception changes nothing' '
    dws_rpc raise "{\"id\": $(dws_dec $waiting), \"type\": \"dws\", \"severity\": 1, \"note\": \"slow\"}" &&
    flux job eventlog $waiting | grep "exception type=\"dws\" severity=1 note=\"slow\"" &&
    test "$(flux jobs -n -o "{state}" $waiting)" = DEPEND &&
    dws_rpc list >nonfatal.json &&
    dws_json nonfatal.json "r[\"jobs\"][0][\"exception\"] is None and r[\"jobs\"][0][\"phase\"] == \"depend\""
'

# --------------------------------------------------------------- malformed requests, strangers

test_expect_success 'malformed requests get EPROTO/EINVAL/ENOENT/ENOSYS, the job untouched' '
    id=$(dws_dec $waiting) &&
    fid=$(dws_f58 $waiting) &&
    nobody=$(dws_f58 12345) &&
    cat >malformed.tsv <<-EOF &&
	post	{"id": $id, "name": "state", "context": {}}	EINVAL: job-manager.dws.post: event name state must be dws-<name>
	post	{"id": $id, "name": "dws-", "context": {}}	EINVAL: job-manager.dws.post: event name dws- must be dws-<name>
	post	{"id": $id}	EINVAL: job-manager.dws.post: name must be dws-<name>
	post	{"id": $id, "name": "dws-state", "context": []}	EPROTO: job-manager.dws.post: context must be an object
	post	{"id": 12345, "name": "dws-state", "context": {}}	ENOENT: job $nobody is not held by the dws plugin
	release	{"id": $id, "update": {"system.dw_storage": {}}}	EPROTO: job-manager.dws.release: update must map attributes.* keys (or resources) to values
	release	{"id": $id, "update": null}	EPROTO: job-manager.dws.release: update must map attributes.* keys (or resources) to values
	release	{"id": "5"}	EPROTO: job-manager.dws.release: id must be a job ID
	release	{"id": true}	EPROTO: job-manager.dws.release: id must be a job ID
	release	{"id": 12345}	ENOENT: job $nobody is not held by the dws plugin
	prolog-finish	{"id": $id}	EPROTO: job-manager.dws.prolog-finish: success must be a boolean
	prolog-finish	{"id": $id, "success": true, "env": {"X": 1}}	EPROTO: job-manager.dws.prolog-finish: env must map names to strings
	prolog-finish	{"id": $id, "success": true}	EINVAL: job $fid has no active dws prolog
	epilog-finish	{"id": $id}	EINVAL: job $fid has no active dws epilog
	epilog-finish	{}	EPROTO: job-manager.dws.epilog-finish: id must be a job ID
	raise	{"id": $id, "type": "two words", "severity": 0}	EPROTO: job-manager.dws.raise: type must be one word
	raise	{"id": $id, "type": "", "severity": 0}	EPROTO: job-manager.dws.raise: type must be one word
	raise	{"id": $id, "type": "dws", "severity": 8}	EPROTO: job-manager.dws.raise: severity must be 0-7 and note a string
	raise	{"id": $id, "type": "dws", "note": 3}	EPROTO: job-manager.dws.raise: severity must be 0-7 and note a string
	frobnicate	{}	ENOSYS: job-manager.dws.frobnicate: no such method
	list	[]	EPROTO: request payload must be a JSON object
	watch	{"service": true}	EPROTO: job-manager.dws.watch: a streaming request is required
	save	{"id": $id, "key": "eventlog", "value": {}}	EINVAL: job-manager.dws.save: key eventlog must be dws.<name>[.<name>...]
	save	{"id": $id, "key": "dws..x", "value": {}}	EINVAL: job-manager.dws.save: key dws..x must be dws.<name>[.<name>...]
	save	{"id": $id, "value": {}}	EINVAL: job-manager.dws.save: key must be dws.<name>[.<name>...]
	save	{"id": $id, "key": "dws.x", "value": []}	EPROTO: job-manager.dws.save: value must be an object
	save	{"id": 12345, "key": "dws.x", "value": {}}	ENOENT: job $nobody is not held by the dws plugin
	EOF
    dws_expect malformed.tsv &&
    test "$(flux jobs -n -o "{state}" $waiting)" = DEPEND &&
    dws_event_names $waiting >untouched.names &&
    printf "submit\nvalidate\ndependency-add\ndws-waiting\nexception\n" >untouched.expected &&
    test_cmp untouched.expected untouched.names
'

test_expect_success 'a watch with service not a boolean is EPROTO' '
    flux python "$DWS_HELPER" watch - --once --payload "{\"service\": 1}" >svc1.out &&
    echo "{\"error\": \"EPROTO\", \"message\": \"job-manager.dws.watch: service must be true or false\"}" >svc1.expected &&
    test_cmp svc1.expected svc1.out
'

test_expect_success 'a guest gets EPERM from every method' '
    id=$(dws_dec $waiting) &&
    only="only the instance owner may use this method" &&
    cat >guest.tsv <<-EOF &&
	list	{}	EPERM: job-manager.dws.list: $only
	release	{"id": $id, "update": {}}	EPERM: job-manager.dws.release: $only
	prolog-finish	{"id": $id, "success": true}	EPERM: job-manager.dws.prolog-finish: $only
	epilog-finish	{"id": $id}	EPERM: job-manager.dws.epilog-finish: $only
	raise	{"id": $id, "type": "dws", "severity": 0, "note": "x"}	EPERM: job-manager.dws.raise: $only
	post	{"id": $id, "name": "dws-state", "context": {}}	EPERM: job-manager.dws.post: $only
	heartbeat	{}	EPERM: job-manager.dws.heartbeat: $only
	save	{"id": $id, "key": "dws.x", "value": {}}	EPERM: job-manager.dws.save: $only
	EOF
    FLUX_HANDLE_ROLEMASK=0x2 FLUX_HANDLE_USERID=4242 dws_expect guest.tsv
'

test_expect_success 'a guest is refused before its payload is read or its method looked up' '
    only="only the instance owner may use this method" &&
    cat >guest-first.tsv <<-EOF &&
	list	[]	EPERM: job-manager.dws.list: $only
	nosuch	{}	EPERM: job-manager.dws.nosuch: $only
	EOF
    FLUX_HANDLE_ROLEMASK=0x2 FLUX_HANDLE_USERID=4242 dws_expect guest-first.tsv
'

test_expect_success 'a guest gets EPERM from watch; nothing happened to the job' '
    FLUX_HANDLE_ROLEMASK=0x2 FLUX_HANDLE_USERID=4242 \
        flux python "$DWS_HELPER" watch - --service --once >guest-watch.out &&
    grep "\"error\": \"EPERM\"" guest-watch.out &&
    grep "only the instance owner may use this method" guest-watch.out &&
    dws_event_names $waiting >guest.names &&
    test_cmp untouched.expected guest.names
'

# --------------------------------------------------------------- the #DW life cycle

test_expect_success 'the service watches: snapshot first, no dws-waiting for new jobs' '
    dws_watch_start svc --service --heartbeat 0.3 &&
    head -1 svc.log >snapshot.json &&
    dws_json snapshot.json "r[\"snapshot\"] is True and [j[\"id\"] for j in r[\"jobs\"]] == [$(dws_dec $waiting)]" &&
    job=$(submit_dw -N2 sleep 300) &&
    dws_wait_phase svc $job depend \
        "r[\"dws\"] == {} and r[\"hosts\"] == [] and r[\"phase\"] == \"depend\"" &&
    test_must_fail flux job wait-event -t 0.5 $job dws-waiting
'

test_expect_success 'post records dws-* events; the record keeps the latest of each' '
    id=$(dws_dec $job) &&
    fid=$(dws_f58 $job) &&
    dws_rpc post "{\"id\": $id, \"name\": \"dws-state\", \"context\": {\"state\": \"Proposal\"}}" &&
    dws_rpc post "{\"id\": $id, \"name\": \"dws-state\", \"context\": {\"state\": \"Setup\", \"deadline\": null}}" &&
    dws_rpc post "{\"id\": $id, \"name\": \"dws-workflow\"}" &&
    flux job wait-event -t $DWS_TIMEOUT -m state=Setup $job dws-state &&
    dws_rpc list >posted.json &&
    dws_json posted.json "[j for j in r[\"jobs\"] if j[\"id\"] == $id][0][\"dws\"] == {
        \"dws-state\": {\"state\": \"Setup\", \"deadline\": None}, \"dws-workflow\": {}}"
'

test_expect_success 'save writes into the job KVS directory, which only its owner may read' '
    dws_rpc save "{\"id\": $id, \"key\": \"dws.output\", \"value\": {\"a\": [1, \"x\"]}}" &&
    flux job info $job dws.output >saved.out &&
    echo "{\"a\":[1,\"x\"]}" >saved.expected &&
    test_cmp saved.expected saved.out &&
    test_must_fail env FLUX_HANDLE_ROLEMASK=0x2 FLUX_HANDLE_USERID=4242 \
        flux job info $job dws.output 2>guest-info.err &&
    grep "access is restricted to job/instance owner" guest-info.err
'

test_expect_success 'release applies the jobspec update and removes the dependency' '
    dws_rpc release "{\"id\": $id, \"update\": {\"attributes.system.dw_storage\": {\"nodes\": [{\"name\": \"rabbit-01\", \"count\": 1}]}}}" &&
    dws_wait_phase svc $job prolog \
        "(r[\"hosts\"] == [\"fake0\", \"fake1\"] and r[\"started\"] is False) and (r[\"attributes\"] == {\"dw\": \"$DW\", \"dw_timeout\": {\"prerun\": \"10m\"}})" &&
    flux job eventlog $job >release.eventlog &&
    grep "jobspec-update attributes.system.dw_storage={\"nodes\":\[{\"name\":\"rabbit-01\",\"count\":1}\]}" release.eventlog &&
    grep "dependency-remove description=\"dws\"" release.eventlog &&
    grep "prolog-start description=\"dws\"" release.eventlog &&
    flux job info $job jobspec | flux python -c "import json,sys; s=json.load(sys.stdin); assert s[\"attributes\"][\"system\"][\"dw_storage\"][\"nodes\"][0][\"name\"] == \"rabbit-01\"" &&
    test_must_fail flux job wait-event -t 0.3 $job start
'

test_expect_success 'duplicate release and early finishes are errors, not exceptions' '
    rpc_fails EINVAL "job $fid is not waiting for its workflow" \
        release "{\"id\": $id, \"update\": {}}" &&
    rpc_fails EINVAL "job $fid has no active dws epilog" epilog-finish "{\"id\": $id}" &&
    ! flux job eventlog $job | grep -w exception
'

test_expect_success 'prolog-finish posts dws-environment and the tasks start' '
    dws_rpc prolog-finish "{\"id\": $id, \"success\": true, \"env\": {\"DW_JOB_scratch\": \"/mnt/nnf/abc-0\"}}" &&
    dws_wait_phase svc $job run \
        "r[\"started\"] is True and r[\"dws\"][\"dws-environment\"] == {\"env\": {\"DW_JOB_scratch\": \"/mnt/nnf/abc-0\"}}" &&
    flux job eventlog $job >run.eventlog &&
    grep "dws-environment env={\"DW_JOB_scratch\":\"/mnt/nnf/abc-0\"}" run.eventlog &&
    grep "prolog-finish description=\"dws\" status=0" run.eventlog &&
    rpc_fails EINVAL "job $fid has no active dws prolog" \
        prolog-finish "{\"id\": $id, \"success\": true, \"env\": {}}"
'

test_expect_success 'once the dws prolog finished, no record puts the job back in the prolog' '
    flux python -c "
import json
records = [j for line in open(\"svc.log\") for j in json.loads(line)[\"jobs\"] if j[\"id\"] == $id]
after = [j[\"phase\"] for j in records if \"dws-environment\" in j[\"dws\"]]
assert after and set(after) == {\"run\"}, after
"
'

test_expect_success 'one cancel: the epilog holds the job, the record has the exception' '
    flux cancel -m "changed my mind" $job &&
    dws_wait_phase svc $job epilog \
        "(r[\"exception\"] == {\"type\": \"cancel\", \"severity\": 0, \"note\": \"changed my mind\"}) and (r[\"started\"] is True and r[\"hosts\"] == [\"fake0\", \"fake1\"])" &&
    test "$(flux jobs -n -o "{state}" $job)" = CLEANUP &&
    flux job eventlog $job | grep "epilog-start description=\"dws\"" &&
    test_must_fail flux job wait-event -t 0.3 $job free
'

test_expect_success 'raise during the epilog; a second fatal raise is refused' '
    rpc_fails EINVAL "job $fid already has a fatal cancel exception" \
        raise "{\"id\": $id, \"type\": \"dws\", \"severity\": 0, \"note\": \"again\"}" &&
    dws_rpc raise "{\"id\": $id, \"type\": \"dws\", \"severity\": 2, \"note\": \"teardown slow\"}"
'

test_expect_success 'epilog-finish: the job ends, watchers get phase gone once' '
    dws_rpc epilog-finish "{\"id\": $id}" &&
    dws_wait_phase svc $job gone &&
    flux job wait-event -t $DWS_TIMEOUT $job clean &&
    test "$(flux jobs -n -o "{result}" $job)" = CANCELED &&
    flux job eventlog $job | tail -3 | awk "{print \$2}" >tail.names &&
    printf "epilog-finish\nfree\nclean\n" >tail.expected &&
    test_cmp tail.expected tail.names &&
    test $(grep -c "\"phase\": \"gone\"" svc.log) -eq 1
'

test_expect_success 'late requests for an inactive job are errors' '
    cat >late.tsv <<-EOF &&
	epilog-finish	{"id": $id}	EINVAL: job $fid has no active dws epilog
	prolog-finish	{"id": $id, "success": true}	EINVAL: job $fid has no active dws prolog
	release	{"id": $id}	EINVAL: job $fid is not waiting for its workflow
	raise	{"id": $id, "type": "dws", "severity": 1, "note": ""}	EINVAL: job $fid is inactive
	post	{"id": $id, "name": "dws-state", "context": {}}	ENOENT: job $fid is not held by the dws plugin
	save	{"id": $id, "key": "dws.output", "value": {}}	ENOENT: job $fid is not held by the dws plugin
	EOF
    dws_expect late.tsv &&
    flux job eventlog $job >late.eventlog &&
    test "$(tail -1 late.eventlog | awk "{print \$2}")" = clean &&
    dws_rpc list >late.json &&
    dws_json late.json "[j[\"id\"] for j in r[\"jobs\"]] == [$(dws_dec $waiting)]"
'

test_expect_success 'an inactive job takes saves under dws.release. only (early release)' '
    dws_rpc save "{\"id\": $id, \"key\": \"dws.release.teardown\", \"value\": {\"status\": \"done\"}}" &&
    flux job info $job dws.release.teardown >release.out &&
    echo "{\"status\":\"done\"}" >release.expected &&
    test_cmp release.expected release.out
'

test_expect_success 'an exception during the prolog waits for prolog-finish, then the epilog' '
    pj=$(submit_dw sleep 300) &&
    pid=$(dws_dec $pj) &&
    fpid=$(dws_f58 $pj) &&
    to_prolog $pj &&
    dws_rpc raise "{\"id\": $pid, \"type\": \"dws\", \"severity\": 0, \"note\": \"PreRun failed\"}" &&
    test "$(flux jobs -n -o "{state}" $pj)" = CLEANUP &&
    dws_rpc list >pe.json &&
    dws_json pe.json "[j for j in r[\"jobs\"] if j[\"id\"] == $pid][0][\"phase\"] == \"prolog\"" &&
    rpc_fails EINVAL "job $fpid has no active dws epilog" epilog-finish "{\"id\": $pid}" &&
    dws_rpc prolog-finish "{\"id\": $pid, \"success\": false}" &&
    dws_wait_phase svc $pj epilog \
        "r[\"started\"] is False and r[\"exception\"][\"note\"] == \"PreRun failed\"" &&
    flux job eventlog $pj >pe.eventlog &&
    grep "prolog-finish description=\"dws\" status=1" pe.eventlog &&
    ! awk "{print \$2}" pe.eventlog | grep -x start &&
    ! grep dws-environment pe.eventlog &&
    dws_rpc epilog-finish "{\"id\": $pid}" &&
    flux job wait-event -t $DWS_TIMEOUT $pj clean &&
    dws_event_names $pj | tail -4 >pe.names &&
    printf "epilog-start\nepilog-finish\nfree\nclean\n" >pe.expected &&
    test_cmp pe.expected pe.names &&
    test "$(flux jobs -n -o "{result}" $pj)" = FAILED
'

test_expect_success 'a cancel in SCHED never allocates; the epilog still holds the job' '
    big=$(flux submit -N2 --exclusive sleep 300) &&
    flux job wait-event -t $DWS_TIMEOUT $big start &&
    sj=$(submit_dw true) &&
    dws_rpc release "{\"id\": $(dws_dec $sj)}" &&
    dws_wait_phase svc $sj sched &&
    flux cancel $sj &&
    dws_wait_phase svc $sj epilog \
        "r[\"hosts\"] == [] and r[\"started\"] is False" &&
    dws_rpc epilog-finish "{\"id\": $(dws_dec $sj)}" &&
    flux job wait-event -t $DWS_TIMEOUT $sj clean &&
    ! flux job eventlog $sj | grep -w alloc &&
    flux cancel $big &&
    flux job wait-event -t $DWS_TIMEOUT $big clean
'

test_expect_success 'a job that exits on its own is held from finish, in phase epilog at release' '
    ok=$(submit_dw true) &&
    to_prolog $ok &&
    dws_rpc prolog-finish "{\"id\": $(dws_dec $ok), \"success\": true}" &&
    dws_wait_phase svc $ok epilog \
        "r[\"exception\"] is None and r[\"started\"] is True and r[\"dws\"][\"dws-environment\"] == {\"env\": {}}" &&
    flux job eventlog $ok | awk "{print \$2}" | grep -A1 "^finish$" | tail -1 >after-finish &&
    echo epilog-start >after-finish.expected &&
    test_cmp after-finish.expected after-finish &&
    flux job eventlog $ok | awk "{print \$2}" | grep -x release &&
    dws_rpc epilog-finish "{\"id\": $(dws_dec $ok)}" &&
    flux job wait-event -t $DWS_TIMEOUT $ok clean &&
    test "$(flux jobs -n -o "{result}" $ok)" = COMPLETED
'

test_expect_success 'a failed prolog without an exception still starts the job, as Flux does' '
    fj=$(submit_dw true) &&
    to_prolog $fj &&
    dws_rpc prolog-finish "{\"id\": $(dws_dec $fj), \"success\": false}" &&
    flux job wait-event -t $DWS_TIMEOUT $fj release &&
    flux job eventlog $fj >fp.eventlog &&
    grep "prolog-finish description=\"dws\" status=1" fp.eventlog &&
    awk "{print \$2}" fp.eventlog | grep -x start &&
    ! grep dws-environment fp.eventlog &&
    dws_rpc epilog-finish "{\"id\": $(dws_dec $fj)}" &&
    flux job wait-event -t $DWS_TIMEOUT $fj clean
'

# --------------------------------------------------------------- service presence

test_expect_success 'a second service watch waits as a standby; the first stays active' '
    lines=$(wc -l <svc.log) &&
    dws_watch_start svc2 --service --heartbeat 0.3 &&
    flux python "$DWS_HELPER" wait-lines svc2.log 1 $DWS_TIMEOUT &&
    head -1 svc2.log >standby.json &&
    dws_json standby.json "r[\"standby\"] is True and \"since\" in r[\"active\"]" &&
    flux python "$DWS_HELPER" wait-lines svc.log $((lines + 1)) $DWS_TIMEOUT &&
    tail -1 svc.log >told.json &&
    dws_json told.json "r[\"snapshot\"] is False and r[\"jobs\"] == [] and \"standby_waiting\" in r" &&
    ! grep error svc.log &&
    flux dmesg | grep "dws: a second flux-dws service (a service that gave no pid) waits as a standby" &&
    dws_rpc list >two.json &&
    dws_json two.json "r[\"service\"][\"standbys\"] == 1 and r[\"service\"][\"active\"] is not None"
'

test_expect_success 'the standby takes over within three heartbeats of the active one dying' '
    dws_watch_stop svc &&
    flux python "$DWS_HELPER" wait-lines svc2.log 2 $DWS_TIMEOUT &&
    sed -n 2p svc2.log >takeover.json &&
    dws_json takeover.json "r[\"snapshot\"] is True" &&
    flux dmesg | grep "the flux-dws service is gone; the standby (a service that gave no pid) takes over"
'

test_expect_success 'a watch with service false is not the service' '
    dws_watch_start tool &&
    head -1 tool.log >tool.json &&
    dws_json tool.json "r[\"snapshot\"] is True" &&
    nj=$(submit_dw true) &&
    test_must_fail flux job wait-event -t 0.5 $nj dws-waiting &&
    dws_wait_phase tool $nj depend &&
    flux cancel $nj &&
    dws_wait_phase tool $nj epilog &&
    dws_rpc epilog-finish "{\"id\": $(dws_dec $nj)}" &&
    dws_wait_phase tool $nj gone &&
    dws_watch_stop tool
'

test_expect_success 'heartbeat answers {}' '
    dws_rpc heartbeat >hb.out &&
    echo "{}" >hb.expected &&
    test_cmp hb.expected hb.out
'

test_expect_success 'persistent: job.validate refuses a persistentdw in the pushed words' '
    dws_rpc persistent "{\"storage\": [{\"name\": \"theirs\", \"owner\": 99999,
        \"refusal\": null, \"others\": \"persistent storage theirs: not yours\"}],
        \"unknown\": \"persistent storage @NAME@ is unknown\"}" >push.out &&
    echo "{}" >push.expected &&
    test_cmp push.expected push.out &&
    test "$(dws_rpc list | jq .service.persistent)" = 1 &&
    test_must_fail flux submit -S dw="#DW persistentdw name=theirs" true 2>theirs.err &&
    grep "persistent storage theirs: not yours\$" theirs.err &&
    test_must_fail flux submit -S dw="#DW persistentdw name=nope" true 2>nope.err &&
    grep "persistent storage nope is unknown\$" nope.err
'

test_expect_success 'persistent: malformed snapshots are EPROTO and keep the last one' '
    cat >persistent.tsv <<-EOF &&
	persistent	{"storage": 5, "unknown": "x"}	EPROTO: job-manager.dws.persistent: storage must be a list of at most 4096 entries and unknown a string of at most 512 bytes
	persistent	{"storage": []}	EPROTO: job-manager.dws.persistent: storage must be a list of at most 4096 entries and unknown a string of at most 512 bytes
	persistent	{"storage": [{"name": "a b", "owner": 1}], "unknown": "x"}	EPROTO: job-manager.dws.persistent: entry 0 must have a name (at most 63 of [A-Za-z0-9._-]), an owner uid, refusal and others (text or null)
	persistent	{"storage": [{"name": "a", "owner": "me"}], "unknown": "x"}	EPROTO: job-manager.dws.persistent: entry 0 must have a name (at most 63 of [A-Za-z0-9._-]), an owner uid, refusal and others (text or null)
	EOF
    dws_expect persistent.tsv &&
    test "$(dws_rpc list | jq .service.persistent)" = 1
'

test_expect_success 'a plugin remove ends every stream with ENOSYS' '
    dws_remove_plugin &&
    flux python "$DWS_HELPER" wait-lines svc2.log 3 $DWS_TIMEOUT &&
    tail -1 svc2.log >gone.json &&
    dws_json gone.json "r == {\"error\": \"ENOSYS\", \"message\": \"job-manager.dws: plugin unloaded\"}" &&
    dws_watch_stop svc2
'

test_expect_success 'the plugin takes no options: the heartbeat is [dws] heartbeat' '
    test_must_fail dws_load_plugin heartbeat-timeout=30s 2>opt.err &&
    grep "unknown plugin option heartbeat-timeout: the plugin takes none" opt.err &&
    dws_load_plugin
'

test_expect_success 'a silent service is dropped after three heartbeats; held jobs are told' '
    told=$(dws_waiting_count $waiting) &&
    dws_watch_start silent --service &&
    flux python "$DWS_HELPER" wait-lines silent.log 2 $DWS_TIMEOUT &&
    tail -1 silent.log >silent.json &&
    dws_json silent.json "r == {\"error\": \"ETIMEDOUT\", \"message\":
        \"job-manager.dws.watch: no heartbeat from the flux-dws service for 3s: it is treated as gone\"}" &&
    flux job wait-event -t $DWS_TIMEOUT -c $((told + 1)) $waiting dws-waiting &&
    hj=$(submit_dw true) &&
    flux job wait-event -t $DWS_TIMEOUT $hj dws-waiting &&
    flux cancel $hj &&
    flux job wait-event -t $DWS_TIMEOUT $hj epilog-start &&
    dws_rpc epilog-finish "{\"id\": $(dws_dec $hj)}" &&
    test $(dws_waiting_count $waiting) -eq $((told + 1)) &&
    dws_watch_stop silent
'

test_expect_success 'a service that sends heartbeats stays connected' '
    dws_watch_start beating --service --heartbeat 0.3 &&
    sleep 4 &&
    kj=$(submit_dw true) &&
    dws_wait_phase beating $kj depend &&
    ! grep error beating.log &&
    test_must_fail flux job wait-event -t 0.5 $kj dws-waiting &&
    flux cancel $kj &&
    dws_wait_phase beating $kj epilog &&
    dws_rpc epilog-finish "{\"id\": $(dws_dec $kj)}" &&
    dws_watch_stop beating
'

test_expect_success 'a job submitted just before the service died is told once it counts as gone' '
    told=$(dws_waiting_count $waiting) &&
    dws_watch_start doomed --service --heartbeat 0.3 &&
    dj=$(submit_dw true) &&
    dws_wait_phase doomed $dj depend &&
    test_must_fail flux job wait-event -t 0.5 $dj dws-waiting &&
    kill -KILL $(cat doomed.pid) &&
    dws_watch_stop doomed &&
    flux job wait-event -t $DWS_TIMEOUT $dj dws-waiting >dj.event &&
    grep "reason=\"flux-dws service is not running\"" dj.event &&
    flux job wait-event -t $DWS_TIMEOUT -c $((told + 1)) $waiting dws-waiting &&
    flux dmesg | grep "treating it as gone; 2 #DW job(s) in DEPEND got dws-waiting now" &&
    test $(dws_waiting_count $dj) -eq 1 &&
    test $(dws_waiting_count $waiting) -eq $((told + 1)) &&
    test "$(flux jobs -n -o "{state}" $dj)" = DEPEND
'

test_expect_success 'jobs in DEPEND are not killed for it; end them' '
    flux cancel $dj $waiting &&
    flux job wait-event -t $DWS_TIMEOUT $dj epilog-start &&
    flux job wait-event -t $DWS_TIMEOUT $waiting epilog-start &&
    ! flux job eventlog $dj | grep "exception type=\"dws\"" &&
    dws_rpc epilog-finish "{\"id\": $(dws_dec $dj)}" &&
    dws_rpc epilog-finish "{\"id\": $(dws_dec $waiting)}" &&
    flux job wait-event -t $DWS_TIMEOUT $waiting clean
'

test_expect_success 'an invalid [dws] heartbeat is refused by config reload' '
    for bad in "\"soon\"" 0 "\"0s\"" "\"inf\"" "\"-1s\"" true; do
        printf "[dws]\nheartbeat = %s\n" "$bad" >"$DWS_CONF_DIR/conf.d/dws.toml" &&
        test_must_fail flux config reload 2>hb.err &&
        grep "dws: \[dws\] heartbeat must be a finite duration greater than 0 (e.g. 10s)" hb.err ||
        return 1
    done &&
    set_dws_config ""
'

test_expect_success '[dws] service-wait bounds the wait with a dws exception' '
    set_dws_config "service-wait = \"1s\"" &&
    wj=$(submit_dw true) &&
    flux job wait-event -t $DWS_TIMEOUT $wj exception >sw.event &&
    grep "type=\"dws\" severity=0" sw.event &&
    grep "flux-dws service is not running after waiting 1s (\[dws\] service-wait): storage not set up" sw.event &&
    flux job wait-event -t $DWS_TIMEOUT $wj epilog-start &&
    dws_rpc epilog-finish "{\"id\": $(dws_dec $wj)}" &&
    flux job wait-event -t $DWS_TIMEOUT $wj clean
'

test_expect_success 'service-wait also counts for the jobs told when the service went silent' '
    set_dws_config "service-wait = \"2s\"" &&
    dws_watch_start doomed2 --service --heartbeat 0.3 &&
    cj=$(submit_dw true) &&
    dws_wait_phase doomed2 $cj depend &&
    kill -KILL $(cat doomed2.pid) &&
    dws_watch_stop doomed2 &&
    flux job wait-event -t $DWS_TIMEOUT $cj dws-waiting &&
    flux job wait-event -t $DWS_TIMEOUT $cj exception >cj.event &&
    grep "flux-dws service is not running after waiting 2s (\[dws\] service-wait)" cj.event &&
    dws_event_names $cj | grep -A1 "^dws-waiting$" | tail -1 >cj.next &&
    echo exception >cj.expected &&
    test_cmp cj.expected cj.next &&
    flux job wait-event -t $DWS_TIMEOUT $cj epilog-start &&
    dws_rpc epilog-finish "{\"id\": $(dws_dec $cj)}" &&
    flux job wait-event -t $DWS_TIMEOUT $cj clean
'

# the service-wait must outlast starting the rescuing watch (two flux python processes, which
# take seconds on a loaded machine), yet be over when the job is checked
test_expect_success 'a service watch cancels the service-wait of waiting jobs' '
    set_dws_config "service-wait = \"10s\"" &&
    start=$(date +%s.%N) &&
    rj=$(submit_dw true) &&
    flux job wait-event -t $DWS_TIMEOUT $rj dws-waiting &&
    dws_watch_start rescue --service --heartbeat 0.2 &&
    sleep $(awk -v s=$start -v n=$(date +%s.%N) "BEGIN {d = s + 10.5 - n; print (d > 0 ? d : 0)}") &&
    test "$(flux jobs -n -o "{state}" $rj)" = DEPEND &&
    ! flux job eventlog $rj | grep -w exception &&
    flux cancel $rj &&
    dws_wait_phase rescue $rj epilog &&
    dws_rpc epilog-finish "{\"id\": $(dws_dec $rj)}" &&
    dws_wait_phase rescue $rj gone &&
    dws_watch_stop rescue
'

test_expect_success 'an invalid [dws] service-wait is refused by config reload' '
    test_must_fail set_dws_config "service-wait = \"soon\"" 2>bad.err &&
    grep "service-wait must be a duration (e.g. 30s, 5m, 1.5h, 2d or inf)" bad.err &&
    set_dws_config ""
'

# --------------------------------------------------------------- reload with jobs in flight

test_expect_success 'set up jobs in DEPEND, in the prolog, running and in the epilog' '
    dws_watch_start before --service --heartbeat 0.3 &&
    held=$(submit_dw true) &&
    dws_wait_phase before $held depend &&
    dws_rpc post "{\"id\": $(dws_dec $held), \"name\": \"dws-state\", \"context\": {\"state\": \"Proposal\"}}" &&
    inpro=$(submit_dw sleep 300) &&
    to_prolog $inpro &&
    dws_rpc post "{\"id\": $(dws_dec $inpro), \"name\": \"dws-state\", \"context\": {\"state\": \"PreRun\"}}" &&
    running=$(submit_dw sleep 300) &&
    to_prolog $running &&
    dws_rpc prolog-finish "{\"id\": $(dws_dec $running), \"success\": true, \"env\": {\"A\": \"1\"}}" &&
    flux job wait-event -t $DWS_TIMEOUT $running start &&
    inepi=$(submit_dw true) &&
    flux cancel -m bye $inepi &&
    flux job wait-event -t $DWS_TIMEOUT $inepi epilog-start &&
    dws_wait_phase before $inepi epilog &&
    dws_rpc list >before.json
'

test_expect_success 'remove + load: the records are rebuilt from the eventlogs' '
    dws_remove_plugin &&
    dws_watch_stop before &&
    dws_load_plugin &&
    dws_rpc list >after.json &&
    flux python -c "
import json, sys
before = json.load(open(\"before.json\"))[\"jobs\"]
after = json.load(open(\"after.json\"))[\"jobs\"]
if before != after:
    print(json.dumps(before, indent=1)); print(json.dumps(after, indent=1)); sys.exit(1)
" &&
    dws_json after.json "{j[\"id\"]: j[\"phase\"] for j in r[\"jobs\"]} == {
        $(dws_dec $held): \"depend\",
        $(dws_dec $inpro): \"prolog\", $(dws_dec $running): \"run\",
        $(dws_dec $inepi): \"epilog\"}" &&
    flux job eventlog $held | grep -c dependency-add >adds &&
    echo 1 >adds.expected &&
    test_cmp adds.expected adds
'

test_expect_success 'after the reload every held job can be driven to the end' '
    dws_watch_start after --service --heartbeat 0.3 &&
    dws_rpc release "{\"id\": $(dws_dec $held), \"update\": {}}" &&
    dws_wait_phase after $held prolog &&
    dws_rpc prolog-finish "{\"id\": $(dws_dec $held), \"success\": true}" &&
    dws_wait_phase after $held epilog &&
    dws_rpc epilog-finish "{\"id\": $(dws_dec $held)}" &&
    dws_wait_phase after $held gone &&
    dws_rpc prolog-finish "{\"id\": $(dws_dec $inpro), \"success\": true}" &&
    dws_wait_phase after $inpro run &&
    flux cancel $inpro $running &&
    dws_wait_phase after $inpro epilog &&
    dws_wait_phase after $running epilog &&
    dws_rpc epilog-finish "{\"id\": $(dws_dec $inpro)}" &&
    dws_rpc epilog-finish "{\"id\": $(dws_dec $running)}" &&
    dws_rpc epilog-finish "{\"id\": $(dws_dec $inepi)}" &&
    for j in $held $inpro $running $inepi; do
        flux job wait-event -t $DWS_TIMEOUT $j clean || return 1
    done &&
    test "$(flux jobs -n -o "{result}" $inepi)" = CANCELED &&
    dws_watch_stop after
'

test_expect_success 'reload while a job is in the prolog with an exception pending' '
    xj=$(submit_dw sleep 300) &&
    to_prolog $xj &&
    flux cancel $xj &&
    dws_remove_plugin &&
    dws_load_plugin &&
    dws_rpc list >x.json &&
    dws_json x.json "[j for j in r[\"jobs\"] if j[\"id\"] == $(dws_dec $xj)][0][\"phase\"] == \"prolog\"" &&
    dws_rpc prolog-finish "{\"id\": $(dws_dec $xj), \"success\": false}" &&
    flux job wait-event -t $DWS_TIMEOUT $xj epilog-start &&
    dws_rpc epilog-finish "{\"id\": $(dws_dec $xj)}" &&
    flux job wait-event -t $DWS_TIMEOUT $xj clean
'

test_expect_success 'a job held in DEPEND survives an instance restart' '
    mkdir -p restart/conf.d restart/state &&
    cat >restart/conf.d/job-manager.toml <<-EOF &&
	[job-manager]
	plugins = [ { load = "$DWS_PLUGIN" } ]
	EOF
    cat >restart/first.sh <<-EOF &&
	set -e
	id=\$(flux submit -S dw="$DW" true)
	flux job wait-event -t $DWS_TIMEOUT \$id dws-waiting >/dev/null
	dec=\$(flux job id --to=dec \$id)
	flux python "\$DWS_HELPER" rpc post "{\\"id\\": \$dec, \\"name\\": \\"dws-state\\", \\"context\\": {\\"state\\": \\"Proposal\\"}}"
	flux python "\$DWS_HELPER" rpc list >restart/before.json
	echo \$id >restart/id
	EOF
    cat >restart/second.sh <<-EOF &&
	set -e
	flux python "\$DWS_HELPER" rpc list >restart/after.json
	id=\$(cat restart/id)
	dec=\$(flux job id --to=dec \$id)
	flux job eventlog \$id | grep -c dependency-add >restart/adds
	flux python "\$DWS_HELPER" rpc release "{\\"id\\": \$dec}"
	flux job wait-event -t $DWS_TIMEOUT \$id prolog-start
	flux python "\$DWS_HELPER" rpc prolog-finish "{\\"id\\": \$dec, \\"success\\": true}"
	flux job wait-event -t $DWS_TIMEOUT \$id epilog-start
	flux python "\$DWS_HELPER" rpc epilog-finish "{\\"id\\": \$dec}"
	flux job wait-event -t $DWS_TIMEOUT \$id clean
	EOF
    flux start --test-size=1 -c restart/conf.d -Sstatedir="$PWD/restart/state" \
        bash restart/first.sh &&
    flux start --test-size=1 -c restart/conf.d -Sstatedir="$PWD/restart/state" \
        bash restart/second.sh &&
    test_cmp restart/before.json restart/after.json &&
    dws_json restart/after.json "r[\"jobs\"][0][\"phase\"] == \"depend\" and r[\"jobs\"][0][\"dws\"][\"dws-state\"] == {\"state\": \"Proposal\"}" &&
    echo 1 >adds.expected &&
    test_cmp adds.expected restart/adds
'

test_expect_success 'cleanup: end every held job, remove the plugin' '
    dws_drain &&
    dws_remove_plugin
'

test_expect_success 'the plugin logged no errors' '
    flux dmesg >dmesg.log &&
    grep "dws" dmesg.log >dws.log;
    ! grep -E "\.(err|crit|alert|emerg)\[" dws.log
'

test_done
