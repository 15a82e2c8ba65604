# SPDX-License-Identifier: LGPL-3.0-only
"""Stand-ins for the real thing, used by tests, benchmarks and the simulation mode.

kubeapi serves our Kubernetes resources over HTTP on loopback, dwssim plays the DWS and NNF
controllers, fakeflux plays Flux's job-manager with the jobtap plugin loaded.
"""
