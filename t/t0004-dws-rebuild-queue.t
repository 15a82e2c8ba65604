#!/bin/sh
# SPDX-License-Identifier: LGPL-3.0-only

test_description='dws jobtap plugin: at most 1,024 requests wait for a rebuild

A plugin loaded while a #DW job is active reads that job'"'"'s eventlog before it
answers; owner requests meanwhile wait in a queue bounded at 1,024, and the next one
is refused at once with EAGAIN.  The job-manager is held (t/hold-plugin.c) while the
load and the requests are queued, so the order, not timing, puts all of them inside
the rebuild.'

. "${SHARNESS:-/usr/share/sharness/sharness.sh}"
. "$SHARNESS_TEST_DIRECTORY/lib.sh"

dws_test_under_flux 2

dws_setup 'build the hold plugin; a #DW job waits in DEPEND; the dws plugin removed' '
    pc="pkg-config" &&
    { pkg-config --exists flux-core || pc="env PKG_CONFIG_PATH=/opt/flux/lib/pkgconfig pkg-config"; } &&
    cc -shared -fPIC -Wall -Werror -o hold-plugin.so "$SHARNESS_TEST_DIRECTORY/hold-plugin.c" \
        $($pc --cflags --libs flux-core) &&
    printf "[dws]\n" >"$DWS_CONF_DIR/conf.d/dws.toml" &&
    flux config reload &&
    dws_load_plugin &&
    job=$(flux submit -S dw="#DW jobdw type=xfs capacity=10GiB name=scratch" true) &&
    flux job wait-event -t $DWS_TIMEOUT $job dependency-add &&
    dws_remove_plugin &&
    flux jobtap load "$PWD/hold-plugin.so" &&
    mkfifo hold.fifo
'

test_expect_success 'during the rebuild, 1,024 requests wait and are answered; the 1,025th is EAGAIN' '
    flux python "$SHARNESS_TEST_DIRECTORY/rebuild-queue.py" \
        "$PWD/hold.fifo" "$DWS_PLUGIN" 1025 >queue.out &&
    test $(head -1024 queue.out | grep -cx ok) -eq 1024 &&
    echo "EAGAIN: job-manager.dws: the plugin is rebuilding job state and already holds 1024 requests; try again" >last.expected &&
    tail -n +1025 queue.out >last.out &&
    test_cmp last.expected last.out
'

test_expect_success 'after the rebuild, requests are answered at once and the job is listed' '
    dws_rpc list >list.out &&
    grep -q "$(dws_dec $job)" list.out
'

test_expect_success 'cleanup: end the held job' '
    dws_drain
'

test_done
