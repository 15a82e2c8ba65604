# SPDX-License-Identifier: LGPL-3.0-only
"""DWS's own admission webhooks (``dws-manager --mode webhook``) in front of kubeapi.

kubeapi calls remote webhooks as kube-apiserver does (flux_dws.testing.kubeapi.webhooks):
AdmissionReview v1 over HTTPS against a caBundle, timeoutSeconds, failurePolicy, JSONPatch.
The first tests hold that client to a webhook of our own.  Then every admission case runs
twice, against kubeapi's Python port of the Workflow webhooks ("port") and against the real
DWS webhook ("real", where the DWS manager is built: flux_dws.testing.realdws says where it
is looked for), through the real kubernetes client, and each must give the same status code
and message: the expected values are the real webhook's.  Last, flux-dws's service runs a
#DW job's whole life with the real webhook deciding what is admitted.
"""

from __future__ import annotations

import base64
import http.server
import itertools
import json
import re
import ssl
import threading
import time

import pytest
import trustme
from kubernetes import client, config
from kubernetes.client.rest import ApiException
from test_kubeapi import at_state
from test_kubeapi import workflow as kubeapi_workflow

from flux_dws.testing import realdws
from flux_dws.testing.kubeapi import ApiError, KubeApi, Store
from flux_dws.testing.kubeapi.admission import register_remote_webhooks
from flux_dws.testing.kubeapi.webhooks import load
from flux_dws.testing.stack import Stack

G = "dataworkflowservices.github.io"
V = "v1alpha7"
NS = "default"
DENIED = 'admission webhook "vworkflow.kb.io" denied the request: '
JOBDW = "#DW jobdw type=xfs capacity=10GiB name=scratch"
STATES = ["Proposal", "Setup", "DataIn", "PreRun", "PostRun", "DataOut", "Teardown"]
NAMES = itertools.count()


# --------------------------------------------------------------------------- kubeapi's client


class _Webhook(http.server.BaseHTTPRequestHandler):
    """A stand-in webhook: answers each review with ``server.answer(request)``."""

    def do_POST(self):  # noqa: N802 (http.server's name)
        review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.seen.append((self.path, review))
        answer = self.server.answer(review["request"])
        if answer is None:
            time.sleep(3)  # slower than the webhook's timeout
            return
        body = json.dumps(
            {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": answer}
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def standin():
    """An HTTPS webhook on a free port, its certificate from a CA made for the test."""
    ca = trustme.CA()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Webhook)
    server.daemon_threads = True
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(context)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    server.seen, server.answer, server.ca = [], lambda request: {"allowed": True}, ca
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02})
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def configuration(kind, url, **hook):
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": kind,
        "webhooks": [
            {
                "name": "w.example.com",
                "admissionReviewVersions": ["v1"],
                "sideEffects": "None",
                "clientConfig": {"url": url},
                "rules": [
                    {
                        "apiGroups": [G],
                        "apiVersions": [V],
                        "operations": ["CREATE"],
                        "resources": ["computes"],
                    }
                ],
                **hook,
            }
        ],
    }


def store_with(standin, kind="ValidatingWebhookConfiguration", url=None, ca=None, **hook):
    port = standin.server_address[1]
    doc = configuration(kind, url or f"https://127.0.0.1:{port}/check", **hook)
    store = Store(webhooks=False)
    ca = standin.ca if ca is None else ca
    register_remote_webhooks(store, load([doc], lambda c: c["url"], ca.cert_pem.bytes()))
    return store


def create_computes(store, name="c"):
    return store.create(
        "computes",
        NS,
        {"apiVersion": f"{G}/{V}", "kind": "Computes", "metadata": {"name": name}, "data": []},
    )


def test_a_review_is_sent_over_https_and_a_denial_is_the_apiservers_error(standin):
    standin.answer = lambda request: {
        "uid": request["uid"],
        "allowed": False,
        "status": {"code": 422, "reason": "Invalid", "message": "no such rabbit"},
    }
    store = store_with(standin)
    with pytest.raises(ApiError) as denied:
        create_computes(store)
    assert (denied.value.code, denied.value.message) == (
        422,
        'admission webhook "w.example.com" denied the request: no such rabbit',
    )
    path, review = standin.seen[0]
    assert path == "/check?timeout=10s"
    request = review["request"]
    assert (review["apiVersion"], review["kind"]) == ("admission.k8s.io/v1", "AdmissionReview")
    assert (request["operation"], request["namespace"], request["name"]) == ("CREATE", NS, "c")
    assert request["resource"] == {"group": G, "version": V, "resource": "computes"}
    assert request["object"]["kind"] == "Computes" and request["oldObject"] is None
    store.create("workflows", NS, {"metadata": {"name": "w"}, "spec": {}})  # no rule: no call
    assert len(standin.seen) == 1


def test_a_denial_without_a_code_or_message_is_a_400_without_explanation(standin):
    standin.answer = lambda request: {"uid": request["uid"], "allowed": False}
    with pytest.raises(ApiError) as denied:
        create_computes(store_with(standin))
    assert (denied.value.code, denied.value.message) == (
        400,
        'admission webhook "w.example.com" denied the request without explanation',
    )


def test_a_mutating_webhooks_json_patch_is_applied(standin):
    patch = [{"op": "add", "path": "/metadata/labels", "value": {"rabbit": "r1"}}]
    standin.answer = lambda request: {
        "uid": request["uid"],
        "allowed": True,
        "patchType": "JSONPatch",
        "patch": base64.b64encode(json.dumps(patch).encode()).decode(),
    }
    made = create_computes(store_with(standin, "MutatingWebhookConfiguration"))
    assert made["metadata"]["labels"] == {"rabbit": "r1"}


@pytest.mark.parametrize(
    "how, message",
    [
        ("wrong uid", "received invalid webhook response: expected response.uid="),
        ("untrusted", "tls: failed to verify certificate: x509: "),
        ("nobody", "connect: connection refused"),
        ("slow", "context deadline exceeded"),
    ],
)
def test_a_failed_call_fails_the_request_under_failure_policy_fail(standin, how, message):
    standin.answer = {
        "wrong uid": lambda request: {"uid": "other", "allowed": True},
        "slow": lambda request: None,
    }.get(how, standin.answer)
    port = standin.server_address[1]
    kwargs = {"timeoutSeconds": 1}
    if how == "untrusted":
        kwargs["ca"] = trustme.CA()
    if how == "nobody":
        kwargs["url"] = "https://127.0.0.1:1/check"
    store = store_with(standin, **kwargs)
    with pytest.raises(ApiError) as failed:
        create_computes(store)
    assert failed.value.code == 500
    assert failed.value.message.startswith(
        'Internal error occurred: failed calling webhook "w.example.com": '
    )
    assert message in failed.value.message
    if how in ("untrusted", "nobody", "slow"):
        url = kwargs.get("url", f"https://127.0.0.1:{port}/check")
        assert f'Post "{url}?timeout=1s": ' in failed.value.message
    ignoring = store_with(standin, failurePolicy="Ignore", **kwargs)
    assert create_computes(ignoring)["metadata"]["name"] == "c"  # Ignore: passed over


@pytest.mark.parametrize(
    "url, problem",
    [
        ("http://127.0.0.1:1/x", "'https' is the only allowed URL scheme"),
        ("https://u:p@127.0.0.1:1/x", "user information is not permitted in the URL"),
        ("https://127.0.0.1:1/x?a=b", "query parameters are not permitted in the URL"),
        ("https://127.0.0.1:1/x#f", "fragments are not permitted in the URL"),
    ],
)
def test_a_url_is_refused_as_admissionregistration_refuses_it(url, problem):
    doc = configuration("ValidatingWebhookConfiguration", url)
    with pytest.raises(ValueError) as refused_:
        load([doc], lambda c: c["url"], None)
    assert str(refused_.value) == f'webhook w.example.com: url: Invalid value: "{url}": {problem}'


# --------------------------------------------------------------------------- port and real


@pytest.fixture(scope="class", params=["port", "real"])
def bed(request, tmp_path_factory):
    """kubeapi with the Python port, or with the real DWS webhook (and the rulesets) in front."""
    tmp = tmp_path_factory.mktemp(request.param)
    webhook = None
    if request.param == "real":
        problem = realdws.real_webhook_problem()
        if problem:
            pytest.skip(problem)
        api = KubeApi(store=Store(webhooks=False)).start()
    else:
        api = KubeApi().start()
    try:
        api.write_kubeconfig(str(tmp / "kubeconfig"))
        if request.param == "real":
            realdws.install_rulesets(api.store, NS)
            webhook = realdws.RealWebhook(api.kubeconfig, str(tmp)).start()
            register_remote_webhooks(api.store, webhook.webhooks())
        configuration_ = client.Configuration()
        config.load_kube_config(config_file=api.kubeconfig, client_configuration=configuration_)
        with client.ApiClient(configuration_) as api_client:
            yield api, client.CustomObjectsApi(api_client)
    finally:
        if webhook is not None:
            webhook.stop()
        api.stop()


def workflow(name, directives=(JOBDW,), status=None, **spec):
    body = kubeapi_workflow(name, list(directives), **spec)
    if status is not None:
        body["status"] = status
    return body


def refused(call):
    with pytest.raises(ApiException) as info:
        call()
    body = json.loads(info.value.body)
    assert body["code"] == info.value.status
    # Where the webhook is differs (the port says a DWS install's service): the rest must not
    return info.value.status, re.sub(r'Post "https://[^/]+', 'Post "https://DWS', body["message"])


def crashed(webhook, path):
    """kube-apiserver's answer when the Go webhook panics and its server hangs up."""
    return (
        500,
        f'Internal error occurred: failed calling webhook "{webhook}": failed to call webhook:'
        f' Post "https://DWS/{path}-dataworkflowservices-github-io-v1alpha7-workflow'
        '?timeout=10s": EOF',
    )


def create(co, body):
    return co.create_namespaced_custom_object(G, V, NS, "workflows", body)


class TestPortAndRealAlike:
    """Each case on the port and on the real webhook: the same code and message."""

    @pytest.mark.parametrize(
        "body, message",
        [
            (
                workflow("x", desiredState="Setup"),
                'Spec.DesiredState: Invalid value: "Setup": desired state must start in Proposal',
            ),
            (
                workflow("x", hurry=True),
                "Spec.Hurry: Forbidden: the hurry flag may not be set on creation",
            ),
            (
                workflow("x", status={"state": "Proposal"}),
                "Status.State: Forbidden: the status state may not be set on creation",
            ),
            (
                workflow("x", directives=[JOBDW, "#DW bogus x=1"]),
                "invalid directive '#DW bogus x=1'",
            ),
            (
                workflow("x", directives=["jobdw type=xfs"]),
                "missing '#DW' prefix in directive 'jobdw type=xfs'",
            ),
            (
                workflow("x", directives=["#DW jobdw type=xfs name=ab"]),
                "missing required argument '^capacity$'",
            ),
            (
                workflow("x", directives=["#DW jobdw type=xfs capacity=1GiB name=x"]),
                "argument 'name' invalid string 'x'",
            ),
            (
                workflow("x", directives=["#DW Setup action=complete", "#DW Setup"]),
                "missing required argument 'action'",
            ),
        ],
        ids=["desired", "hurry", "state", "bogus", "prefix", "required", "pattern", "tester"],
    )
    def test_create_is_refused_alike(self, bed, body, message):
        api, co = bed
        body = {**body, "metadata": {"name": f"c{next(NAMES)}"}}
        assert refused(lambda: create(co, body)) == (403, DENIED + message)

    @pytest.mark.parametrize(
        "directives", [["#DW"], [JOBDW, "#DW"], ["#DW", "#DW bogus"]], ids=["alone", "2nd", "1st"]
    )
    def test_a_bare_dw_reached_first_crashes_the_mutating_webhook(self, bed, directives):
        api, co = bed
        body = workflow(f"b{next(NAMES)}", directives=directives)
        assert refused(lambda: create(co, body)) == crashed("mworkflow.kb.io", "mutate")

    def test_a_bare_dw_after_a_refused_directive_is_never_parsed(self, bed):
        api, co = bed
        body = workflow(f"b{next(NAMES)}", directives=["#DW bogus", "#DW"])
        assert refused(lambda: create(co, body)) == (403, DENIED + "invalid directive '#DW bogus'")

    @pytest.mark.parametrize("field", ["userID", "groupID"])
    @pytest.mark.parametrize("value", [-1, 2**32])
    def test_ids_outside_uint32_fail_the_webhooks_decoding(self, bed, field, value):
        api, co = bed
        body = workflow(f"i{next(NAMES)}", **{field: value})
        assert refused(lambda: create(co, body)) == (
            400,
            'admission webhook "mworkflow.kb.io" denied the request: json: cannot unmarshal'
            f" number {value} into Go struct field WorkflowSpec.spec.{field} of type uint32",
        )

    def test_the_mutating_hook_writes_what_gos_encoder_writes(self, bed):
        """Empty omitempty fields dropped, the computes reference always there."""
        api, co = bed
        status = {"state": "", "status": "", "message": "", "drivers": []}
        made = create(co, workflow(f"g{next(NAMES)}", directives=[], status=status))
        assert made["status"] == {
            "computes": {},
            "env": {"DW_WORKFLOW_NAME": made["metadata"]["name"], "DW_WORKFLOW_NAMESPACE": NS},
            "ready": False,
        }

    def test_a_valid_workflow_gets_its_driver_entries_and_env_from_the_mutating_hook(self, bed):
        api, co = bed
        name = f"m{next(NAMES)}"
        made = create(co, workflow(name, directives=[JOBDW, "#DW DataIn action=complete"]))
        entry = {"taskID": "", "lastHB": 0, "completed": False, "status": "Pending"}
        assert made["status"]["drivers"] == [
            {"driverID": "nnf", "dwdIndex": 0, "watchState": state, **entry}
            for state in ("Proposal", "Setup", "PreRun", "PostRun", "Teardown")
        ] + [{"driverID": "tester", "dwdIndex": 1, "watchState": "DataIn", **entry}]
        assert made["status"]["env"] == {"DW_WORKFLOW_NAME": name, "DW_WORKFLOW_NAMESPACE": NS}
        assert made["status"]["ready"] is False and made["status"]["computes"] == {}
        # The CRD defaults them again after the webhook's patch drops the empty hurry
        assert (made["spec"]["forceReady"], made["spec"]["hurry"]) == (False, False)

    @pytest.mark.parametrize(
        "state, ready, patch, message",
        [
            ("Proposal", True, {"wlmID": "slurm"}, "Spec.WLMID: Forbidden: field is immutable"),
            ("Proposal", True, {"jobID": "7"}, "Spec.JobID: Forbidden: field is immutable"),
            ("Proposal", True, {"jobID": 8}, "Spec.JobID: Forbidden: field is immutable"),
            ("Setup", True, {"userID": 0}, "Spec.UserID: Forbidden: field is immutable"),
            ("Setup", True, {"groupID": 0}, "Spec.GroupID: Forbidden: field is immutable"),
            (
                "Setup",
                True,
                {"dwDirectives": []},
                "Spec.DWDirectives: Forbidden: field is immutable",
            ),
            (
                "Setup",
                True,
                {"desiredState": "DataIn", "hurry": True},
                "Spec.Hurry: Invalid value: true: the hurry flag may be set only in Teardown",
            ),
            (
                "Setup",
                True,
                {"desiredState": "Proposal"},
                'Spec.DesiredState: Invalid value: "Proposal":'
                " DesiredState cannot progress backwards",
            ),
            (
                "Proposal",
                True,
                {"desiredState": "DataIn"},
                'Spec.DesiredState: Invalid value: "DataIn": states cannot be skipped',
            ),
            (
                "Setup",
                False,
                {"desiredState": "DataIn"},
                'Status.State: Invalid value: "Setup": current desired state not yet achieved',
            ),
            (
                "Teardown",
                True,
                {"desiredState": "DataOut"},
                'Spec.DesiredState: Invalid value: "DataOut":'
                " DesiredState cannot progress backwards",
            ),
        ],
    )
    def test_updates_are_refused_alike(self, bed, state, ready, patch, message):
        api, co = bed
        name = f"u{next(NAMES)}"
        create(co, workflow(name))
        at_state(api, name, state, ready)
        before = api.store.get("workflows", NS, name)
        answer = refused(
            lambda: co.patch_namespaced_custom_object(G, V, NS, "workflows", name, {"spec": patch})
        )
        assert answer == (403, DENIED + message)
        assert api.store.get("workflows", NS, name) == before

    def test_the_hurry_flag_is_allowed_in_teardown(self, bed):
        api, co = bed
        name = f"h{next(NAMES)}"
        create(co, workflow(name))
        at_state(api, name, "Setup", False)
        patch = {"spec": {"desiredState": "Teardown", "hurry": True}}
        done = co.patch_namespaced_custom_object(G, V, NS, "workflows", name, patch)
        assert done["spec"]["hurry"] is True

    @pytest.mark.parametrize(
        "index, change, message",
        [
            (0, {"status": "Running"}, "driver entry for non-current state cannot be changed"),
            (1, {"completed": True}, "driver cannot be completed without status=Completed"),
            (
                1,
                {"completed": True, "status": "Completed", "error": "boom"},
                "driver cannot be completed when error is present",
            ),
            (1, {"completed": True, "status": "Completed"}, None),
            (1, {"status": "Running", "message": "working"}, None),
            (0, {"lastHB": 0}, None),  # unchanged in the typed struct
        ],
        ids=["other-state", "no-status", "error", "complete", "running", "unchanged"],
    )
    def test_driver_entry_rules_on_update_alike(self, bed, index, change, message):
        api, co = bed
        name = f"d{next(NAMES)}"
        create(co, workflow(name))
        at_state(api, name, "Setup", False)
        current = api.store.get("workflows", NS, name)
        drivers = current["status"]["drivers"]
        drivers[index] = {**drivers[index], **change}
        call = lambda: co.replace_namespaced_custom_object(G, V, NS, "workflows", name, current)  # noqa: E731
        if message is None:
            assert call()["status"]["drivers"][index] == drivers[index]
            return
        assert refused(call) == (
            403,
            DENIED + f"Status.Drivers[{index}]: Internal error: {message}",
        )

    @pytest.mark.parametrize(
        "entry, answer",
        [
            ({"watchState": "Setup"}, crashed("vworkflow.kb.io", "validate")),
            ({"watchState": "DataIn"}, crashed("vworkflow.kb.io", "validate")),
            ({"watchState": "Setup", "completed": True, "status": "Completed"}, None),
        ],
        ids=["current", "other", "completed"],
    )
    def test_an_entry_past_the_old_list_crashes_the_webhook_unless_completed(
        self, bed, entry, answer
    ):
        api, co = bed
        name = f"a{next(NAMES)}"
        create(co, workflow(name))
        at_state(api, name, "Setup", False)
        current = api.store.get("workflows", NS, name)
        added = {"driverID": "x", "dwdIndex": 0, "taskID": "", "lastHB": 0, "completed": False}
        current["status"]["drivers"].append({**added, "status": "Pending", **entry})
        call = lambda: co.replace_namespaced_custom_object(G, V, NS, "workflows", name, current)  # noqa: E731
        if answer is None:
            assert len(call()["status"]["drivers"]) == 6
        else:
            assert refused(call) == answer

    def test_a_completed_driver_may_not_be_uncompleted_alike(self, bed):
        api, co = bed
        name = f"d{next(NAMES)}"
        create(co, workflow(name))
        at_state(api, name, "Setup", False)
        current = api.store.get("workflows", NS, name)
        current["status"]["drivers"][1].update(completed=True, status="Completed")
        current = co.replace_namespaced_custom_object(G, V, NS, "workflows", name, current)
        current["status"]["drivers"][1].update(completed=False, status="Running")
        assert refused(
            lambda: co.replace_namespaced_custom_object(G, V, NS, "workflows", name, current)
        ) == (
            403,
            DENIED + "Status.Drivers[1]: Internal error: driver cannot change from completed state",
        )


# --------------------------------------------------------------------------- a job's life


@pytest.mark.parametrize(
    "dws, directive",
    [
        ("sim", "#DW jobdw type=xfs capacity=1GiB name=scratch"),
        ("real", "#DW Setup action=complete"),
    ],
)
def test_a_dw_job_runs_its_whole_life_with_the_real_webhook_in_front(dws, directive):
    """The service's writes, and dwssim's or the real DWS controller's, all pass it."""
    problem = realdws.real_webhook_problem() or (dws == "real" and realdws.real_dws_problem())
    if problem:
        pytest.skip(problem)
    with Stack(hosts=4, dws=dws, webhook="real") as stack:
        assert stack.real_webhook is not None and stack.real_webhook.running()
        jobid = stack.submit(directive)
        info = stack.wait(jobid)
        assert info.result == "COMPLETED", info.eventlog
        states = [e["context"]["state"] for e in info.events("dws-state")]
        assert states == STATES
        log = stack.real_webhook.manager.log
        with open(log) as handle:
            reviews = handle.read().count('"validate-create"')
        assert reviews == 2  # the readiness probe's and the job's workflow
    assert not stack.real_webhook.running()
