#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-3.0-only
"""flux-core alone: a broker's KVS that misses a commit made while it sets a namespace up.

    python bench/flux_kvs_race.py [--tries 300]

Needs flux-core only (no flux-dws): it runs itself under ``flux start --test-size=2``.  In
flux-core 0.88 the KVS of a broker other than rank 0 sets a namespace up on the first request
for it (``kvs.getroot`` to its parent) and subscribes to the namespace's setroot events only
once that is answered, so a commit rank 0 makes in between is never applied on that broker:
it serves the older root to every reader there (lookups and watches alike) until the next
commit in the namespace.  This is what left dws-env's job shells waiting for ever before
their tasks started (doc/architecture.rst, on shell/dws-env.c).

For each try it creates a namespace, commits once on rank 0 while rank 1's broker gets its
first request for the namespace (a client of rank 1, as a job shell is), waits, and compares
the root sequence each broker serves.  Prints how many tries left rank 1 behind rank 0, and
that two seconds later they are still behind.  Figures only: the count depends on timing.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import subprocess
import sys
import time


def under_flux(tries: int) -> int:
    import flux
    import flux.kvs

    h0 = flux.Flux()  # rank 0
    uri1 = h0.rpc("attr.get", {"name": "local-uri"}, nodeid=1).get()["value"]
    h1 = flux.Flux(uri1)  # a client of rank 1's broker
    behind = 0
    for i in range(tries):
        ns = f"race{i}"
        flux.kvs.namespace_create(h0, ns)
        flux.kvs.put(h0, "a", 0)
        flux.kvs.commit(h0, namespace=ns)
        flux.kvs.put(h0, "a", 1)
        first = h1.rpc("kvs.getroot", {"namespace": ns})  # rank 1 sets the namespace up
        time.sleep(random.uniform(0, 0.004))
        commit = flux.kvs.commit_async(h0, namespace=ns)  # the one commit meanwhile
        commit.get()
        first.get()
        time.sleep(0.2)  # no commit after it
        seq0 = h0.rpc("kvs.getroot", {"namespace": ns}).get()["rootseq"]
        seq1 = h1.rpc("kvs.getroot", {"namespace": ns}).get()["rootseq"]
        if seq1 < seq0:
            behind += 1
            time.sleep(2)
            later = h1.rpc("kvs.getroot", {"namespace": ns}).get()["rootseq"]
            print(f"{ns}: rank 0 serves seq {seq0}, rank 1 seq {seq1}; 2 s later rank 1: {later}")
        flux.kvs.namespace_remove(h0, ns)
    print(f"{behind} of {tries} namespaces left rank 1 behind rank 0 (flux-core alone)")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tries", type=int, default=300)
    args = parser.parse_args()
    if os.environ.get("FLUX_KVS_RACE_INSTANCE"):
        return under_flux(args.tries)
    flux_cmd = shutil.which("flux") or (
        "/opt/flux/bin/flux" if os.access("/opt/flux/bin/flux", os.X_OK) else None
    )
    if flux_cmd is None:
        print("flux_kvs_race: skipped: flux-core is not installed (no flux on PATH or /opt/flux)")
        return 0
    env = dict(os.environ, FLUX_KVS_RACE_INSTANCE="1")
    argv = [flux_cmd, "start", "--test-size=2", flux_cmd, "python", os.path.abspath(__file__)]
    return subprocess.run([*argv, "--tries", str(args.tries)], env=env, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
