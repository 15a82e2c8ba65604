#!/bin/sh
# SPDX-License-Identifier: LGPL-3.0-only

test_description='dws jobtap plugin: the storage gate (storage-held)

With [dws] rabbit-scheduling, no #DW job goes to the scheduler from the plugin'"'"'s load
until the service says it has held the ssd parts of jobs released early again
(job-manager.dws.storage-held): a #DW job stays in PRIORITY with a dws-waiting event.
A priority plugin loaded after the dws plugin that gives the job a priority anyway
has it held at priority 0 in SCHED; storage-held lets both go on.'

. "${SHARNESS:-/usr/share/sharness/sharness.sh}"
. "$SHARNESS_TEST_DIRECTORY/lib.sh"

dws_test_under_flux 2

DW='#DW jobdw type=xfs capacity=10GiB name=scratch'

dws_setup 'rabbit-scheduling on; the dws plugin loaded; the priority plugin built' '
    pc="pkg-config" &&
    { pkg-config --exists flux-core || pc="env PKG_CONFIG_PATH=/opt/flux/lib/pkgconfig pkg-config"; } &&
    cc -shared -fPIC -Wall -Werror -o priority-plugin.so \
        "$SHARNESS_TEST_DIRECTORY/priority-plugin.c" $($pc --cflags --libs flux-core) &&
    printf "[dws]\nrabbit-scheduling = true\n" >"$DWS_CONF_DIR/conf.d/dws.toml" &&
    flux config reload &&
    dws_load_plugin
'

test_expect_success 'a released #DW job stays in PRIORITY, told why' '
    job=$(flux submit -S dw="$DW" true) &&
    flux job wait-event -t $DWS_TIMEOUT $job dependency-add &&
    dws_rpc release "{\"id\": $(dws_dec $job), \"update\": {}}" &&
    flux job wait-event -t $DWS_TIMEOUT -m reason="flux-dws service has not yet held again the storage of jobs released early" $job dws-waiting &&
    test "$(flux jobs -no {state} $job)" = PRIORITY &&
    test_must_fail flux job wait-event -t 1 $job priority
'

test_expect_success 'a job without #DW directives is not held' '
    plain=$(flux submit true) &&
    flux job wait-event -t $DWS_TIMEOUT $plain clean
'

test_expect_success 'storage-held: the kept job goes on to the scheduler' '
    dws_rpc storage-held "{}" &&
    flux job wait-event -t $DWS_TIMEOUT $job priority &&
    flux job wait-event -t $DWS_TIMEOUT $job prolog-start &&
    flux cancel $job &&
    flux dmesg | grep "go on to the scheduler"
'

test_expect_success 'reloaded, with a priority plugin after it: the job is held at priority 0' '
    dws_remove_plugin &&
    dws_load_plugin &&
    flux jobtap load "$PWD/priority-plugin.so" &&
    job=$(flux submit -S dw="$DW" true) &&
    flux job wait-event -t $DWS_TIMEOUT $job dependency-add &&
    dws_rpc release "{\"id\": $(dws_dec $job), \"update\": {}}" &&
    flux job wait-event -t $DWS_TIMEOUT -m priority=0 $job priority &&
    test "$(flux jobs -no {state} $job)" = SCHED &&
    test_must_fail flux job wait-event -t 1 $job alloc &&
    flux dmesg | grep "a plugin loaded after dws-jobtap.so gave it a priority"
'

test_expect_success 'storage-held: the priority plugin'"'"'s priority comes back, the job runs' '
    dws_rpc storage-held "{}" &&
    flux job wait-event -t $DWS_TIMEOUT -m priority=42 $job priority &&
    flux job wait-event -t $DWS_TIMEOUT $job prolog-start &&
    flux cancel $job
'

test_expect_success 'cleanup: end every held job, remove the plugins' '
    flux jobtap remove priority-plugin.so &&
    dws_drain &&
    dws_remove_plugin
'

test_done
