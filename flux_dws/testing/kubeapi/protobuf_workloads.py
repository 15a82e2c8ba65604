# SPDX-License-Identifier: LGPL-3.0-only
"""Protobuf messages of the kinds nnf-sos writes: batch/v1 Job, v1 Service and Node.

controller-runtime sends built-in kinds as protobuf.  nnf-sos creates a headless Service and
a batch Job per rabbit for a ``#DW container`` directive, and updates each Job to set its
``activeDeadlineSeconds``.  The messages below are those of k8s.io/api's generated.proto
(release 1.28, which nnf-sos builds with) that such a Job's pod template uses: containers and
init containers (command, env and its field/secret/config-map references, ports, volume
mounts, resources, security context), volumes (hostPath, emptyDir, secret, configMap,
persistentVolumeClaim), the pod's security context, tolerations, node selector and affinity.
Fields outside them (probes, lifecycle hooks, other volume sources, a Job's status) are not
decoded.  Its DeleteOptions (deleting the Jobs in Teardown) come as protobuf too.  Kinds as in
``protobuf``; a field named ``""`` is inlined into its parent, as the JSON form of an embedded
Go struct; a kind ending in ``?`` is a pointer in Go, so its zero value is kept
(``backoffLimit: 0`` means no retries).
"""

from __future__ import annotations

from typing import Any

Message = dict[int, tuple[str, Any]]

LOCAL_REF: Message = {1: ("name", "str")}
LABEL_SELECTOR: Message = {
    1: ("matchLabels", "map"),
    2: ("matchExpressions", [{1: ("key", "str"), 2: ("operator", "str"), 3: ("values", ["str"])}]),
}
_KEY_REF: Message = {1: ("", LOCAL_REF), 2: ("key", "str"), 3: ("optional", "bool?")}
_KEY_TO_PATH: Message = {1: ("key", "str"), 2: ("path", "str"), 3: ("mode", "int?")}
ENV_VAR: Message = {
    1: ("name", "str"),
    2: ("value", "str"),
    3: (
        "valueFrom",
        {
            1: ("fieldRef", {1: ("apiVersion", "str"), 2: ("fieldPath", "str")}),
            2: (
                "resourceFieldRef",
                {1: ("containerName", "str"), 2: ("resource", "str"), 3: ("divisor", "quantity")},
            ),
            3: ("configMapKeyRef", _KEY_REF),
            4: ("secretKeyRef", _KEY_REF),
        },
    ),
}
_ENV_SOURCE: Message = {1: ("", LOCAL_REF), 2: ("optional", "bool?")}
SECURITY_CONTEXT: Message = {
    1: ("capabilities", {1: ("add", ["str"]), 2: ("drop", ["str"])}),
    2: ("privileged", "bool?"),
    4: ("runAsUser", "int?"),
    8: ("runAsGroup", "int?"),
    5: ("runAsNonRoot", "bool?"),
    6: ("readOnlyRootFilesystem", "bool?"),
    7: ("allowPrivilegeEscalation", "bool?"),
    9: ("procMount", "str"),
}
CONTAINER: Message = {
    1: ("name", "str"),
    2: ("image", "str"),
    3: ("command", ["str"]),
    4: ("args", ["str"]),
    5: ("workingDir", "str"),
    6: (
        "ports",
        [
            {
                1: ("name", "str"),
                2: ("hostPort", "int"),
                3: ("containerPort", "int"),
                4: ("protocol", "str"),
                5: ("hostIP", "str"),
            }
        ],
    ),
    19: (
        "envFrom",
        [{1: ("prefix", "str"), 2: ("configMapRef", _ENV_SOURCE), 3: ("secretRef", _ENV_SOURCE)}],
    ),
    7: ("env", [ENV_VAR]),
    8: ("resources", {1: ("limits", "qmap"), 2: ("requests", "qmap")}),
    24: ("restartPolicy", "str"),
    9: (
        "volumeMounts",
        [
            {
                1: ("name", "str"),
                2: ("readOnly", "bool"),
                3: ("mountPath", "str"),
                4: ("subPath", "str"),
                5: ("mountPropagation", "str?"),
                6: ("subPathExpr", "str"),
            }
        ],
    ),
    13: ("terminationMessagePath", "str"),
    20: ("terminationMessagePolicy", "str"),
    14: ("imagePullPolicy", "str"),
    15: ("securityContext", SECURITY_CONTEXT),
    16: ("stdin", "bool"),
    17: ("stdinOnce", "bool"),
    18: ("tty", "bool"),
}
_MODE_ITEMS: Message = {2: ("items", [_KEY_TO_PATH]), 3: ("defaultMode", "int?")}
VOLUME: Message = {
    1: ("name", "str"),
    2: (
        "",  # VolumeSource, inlined
        {
            1: ("hostPath", {1: ("path", "str"), 2: ("type", "str?")}),
            2: ("emptyDir", {1: ("medium", "str"), 2: ("sizeLimit", "quantity")}),
            6: ("secret", {1: ("secretName", "str"), **_MODE_ITEMS, 4: ("optional", "bool?")}),
            10: ("persistentVolumeClaim", {1: ("claimName", "str"), 2: ("readOnly", "bool")}),
            19: ("configMap", {1: ("", LOCAL_REF), **_MODE_ITEMS, 4: ("optional", "bool?")}),
        },
    ),
}
_NODE_SELECTOR_TERM: Message = {
    1: ("matchExpressions", [{1: ("key", "str"), 2: ("operator", "str"), 3: ("values", ["str"])}]),
    2: ("matchFields", [{1: ("key", "str"), 2: ("operator", "str"), 3: ("values", ["str"])}]),
}
_POD_AFFINITY_TERM: Message = {
    1: ("labelSelector", LABEL_SELECTOR),
    2: ("namespaces", ["str"]),
    3: ("topologyKey", "str"),
    4: ("namespaceSelector", LABEL_SELECTOR),
}
_POD_AFFINITY: Message = {
    1: ("requiredDuringSchedulingIgnoredDuringExecution", [_POD_AFFINITY_TERM]),
    2: (
        "preferredDuringSchedulingIgnoredDuringExecution",
        [{1: ("weight", "int"), 2: ("podAffinityTerm", _POD_AFFINITY_TERM)}],
    ),
}
AFFINITY: Message = {
    1: (
        "nodeAffinity",
        {
            1: (
                "requiredDuringSchedulingIgnoredDuringExecution",
                {1: ("nodeSelectorTerms", [_NODE_SELECTOR_TERM])},
            ),
            2: (
                "preferredDuringSchedulingIgnoredDuringExecution",
                [{1: ("weight", "int"), 2: ("preference", _NODE_SELECTOR_TERM)}],
            ),
        },
    ),
    2: ("podAffinity", _POD_AFFINITY),
    3: ("podAntiAffinity", _POD_AFFINITY),
}
POD_SPEC: Message = {
    1: ("volumes", [VOLUME]),
    20: ("initContainers", [CONTAINER]),
    2: ("containers", [CONTAINER]),
    3: ("restartPolicy", "str"),
    4: ("terminationGracePeriodSeconds", "int?"),
    5: ("activeDeadlineSeconds", "int?"),
    6: ("dnsPolicy", "str"),
    7: ("nodeSelector", "map"),
    8: ("serviceAccountName", "str"),
    9: ("serviceAccount", "str"),
    21: ("automountServiceAccountToken", "bool?"),
    10: ("nodeName", "str"),
    11: ("hostNetwork", "bool"),
    12: ("hostPID", "bool"),
    13: ("hostIPC", "bool"),
    27: ("shareProcessNamespace", "bool?"),
    14: (
        "securityContext",
        {
            2: ("runAsUser", "int?"),
            6: ("runAsGroup", "int?"),
            3: ("runAsNonRoot", "bool?"),
            4: ("supplementalGroups", ["int"]),
            5: ("fsGroup", "int?"),
            9: ("fsGroupChangePolicy", "str?"),
        },
    ),
    15: ("imagePullSecrets", [LOCAL_REF]),
    16: ("hostname", "str"),
    17: ("subdomain", "str"),
    18: ("affinity", AFFINITY),
    19: ("schedulerName", "str"),
    22: (
        "tolerations",
        [
            {
                1: ("key", "str"),
                2: ("operator", "str"),
                3: ("value", "str"),
                4: ("effect", "str"),
                5: ("tolerationSeconds", "int?"),
            }
        ],
    ),
    24: ("priorityClassName", "str"),
    25: ("priority", "int?"),
    30: ("enableServiceLinks", "bool?"),
    31: ("preemptionPolicy", "str?"),
    35: ("setHostnameAsFQDN", "bool?"),
}


def messages(object_meta: Message) -> dict[tuple[str, str], Message]:
    """(apiVersion, kind) -> message, for ``protobuf``'s table."""
    template = {1: ("metadata", object_meta), 2: ("spec", POD_SPEC)}
    job_spec: Message = {
        1: ("parallelism", "int?"),
        2: ("completions", "int?"),
        3: ("activeDeadlineSeconds", "int?"),
        7: ("backoffLimit", "int?"),
        12: ("backoffLimitPerIndex", "int?"),
        13: ("maxFailedIndexes", "int?"),
        4: ("selector", LABEL_SELECTOR),
        5: ("manualSelector", "bool?"),
        6: ("template", template),
        8: ("ttlSecondsAfterFinished", "int?"),
        9: ("completionMode", "str?"),
        10: ("suspend", "bool?"),
        14: ("podReplacementPolicy", "str?"),
    }
    service_spec: Message = {
        1: (
            "ports",
            [
                {
                    1: ("name", "str"),
                    2: ("protocol", "str"),
                    6: ("appProtocol", "str?"),
                    3: ("port", "int"),
                    4: ("targetPort", "intorstr"),
                    5: ("nodePort", "int"),
                }
            ],
        ),
        2: ("selector", "map"),
        3: ("clusterIP", "str"),
        18: ("clusterIPs", ["str"]),
        4: ("type", "str"),
        5: ("externalIPs", ["str"]),
        7: ("sessionAffinity", "str"),
        13: ("publishNotReadyAddresses", "bool"),
        19: ("ipFamilies", ["str"]),
        17: ("ipFamilyPolicy", "str?"),
        22: ("internalTrafficPolicy", "str?"),
    }
    node_spec: Message = {
        1: ("podCIDR", "str"),
        7: ("podCIDRs", ["str"]),
        3: ("providerID", "str"),
        4: ("unschedulable", "bool"),
        5: (
            "taints",
            [
                {
                    1: ("key", "str"),
                    2: ("value", "str"),
                    3: ("effect", "str"),
                    4: ("timeAdded", "time"),
                }
            ],
        ),
    }
    return {
        ("batch/v1", "Job"): {1: ("metadata", object_meta), 2: ("spec", job_spec)},
        ("v1", "Service"): {1: ("metadata", object_meta), 2: ("spec", service_spec)},
        # nnf-sos's storage controller labels and taints its rabbits' Nodes
        ("v1", "Node"): {1: ("metadata", object_meta), 2: ("spec", node_spec)},
    }


#: The body of a DELETE (a collection's too), in whatever group version the client names it.
DELETE_OPTIONS: Message = {
    1: ("gracePeriodSeconds", "int?"),
    2: ("preconditions", {1: ("uid", "str?"), 2: ("resourceVersion", "str?")}),
    3: ("orphanDependents", "bool?"),
    4: ("propagationPolicy", "str?"),
    5: ("dryRun", ["str"]),
}
