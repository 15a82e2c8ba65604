# SPDX-License-Identifier: LGPL-3.0-only
"""t0004's client: 1,025 owner requests queued while the dws plugin rebuilds.

Usage: flux python rebuild-queue.py FIFO PLUGIN N.  The job-manager is held on FIFO
(hold-plugin.c); behind the hold go the plugin's load (which starts a rebuild for the
active #DW job, whose eventlog read is answered only after everything already queued)
and N dws.list requests.  A broker.ping answered means the broker has passed them all
on, so they are queued ahead of the rebuild's own eventlog request.  Prints one line
per request: "ok" or "ERRNAME: message".
"""

import errno
import sys

import flux

fifo, plugin, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
h = flux.Flux()
hold = h.rpc("job-manager.hold.hold", {"path": fifo})
load = h.rpc("job-manager.jobtap", {"load": plugin})
lists = [h.rpc("job-manager.dws.list", {}) for _ in range(count)]
h.rpc("broker.ping", {}).get()
with open(fifo, "w"):
    pass
hold.get()
load.get()
for future in lists:
    try:
        future.get()
        print("ok")
    except OSError as exc:
        print(f"{errno.errorcode[exc.errno]}: {exc.strerror}")
