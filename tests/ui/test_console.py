"""The console in Chromium: log in, a live pod list, a pod's page, deleting, isolation between
tenants, revocation, the operator's heatmap, and /docs without the network."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.factories import pod
from tests.ui.conftest import Dev, gateway, login, screenshot

XSS = '<img src=x onerror="window.__xss=1"><script>window.__xss=1</script>'

# One tessera dev and one Chromium for all of them (with pytest-xdist: on one worker).
pytestmark = pytest.mark.xdist_group("console")


def wait_for(predicate: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)


def create_pod(client: Any, namespace: str, manifest: dict[str, Any]) -> dict[str, Any]:
    answer = client.post(f"/api/v1/namespaces/{namespace}/pods", json=manifest)
    assert answer.status_code == 201, answer.text
    return dict(answer.json())


def test_login_sets_a_sealed_strict_cookie_and_refuses_a_wrong_token(
    context: Any, dev: Dev
) -> None:
    assert f"web console:       {dev.url}/ui" in dev.log.read_text()  # what make run prints
    name, token = dev.tenant()
    page = context.new_page()
    requests: list[str] = []
    page.on("request", lambda r: requests.append(r.url))
    page.goto("/ui/pods")
    assert page.url.endswith("/ui/login")  # no session: the login page

    page.fill("#token", "tsr_0123456789abcdef_wrong")
    page.click("button[type=submit]")
    page.wait_for_selector("[role=alert]:not(:empty)")
    assert "invalid bearer token" in page.inner_text("[role=alert]")
    assert page.input_value("#token") == ""  # the field is emptied after each attempt

    response = None

    def remember(r: Any) -> None:
        nonlocal response
        if r.url.endswith("/ui/pods"):
            response = r

    page.on("response", remember)
    login(page, token)
    assert page.inner_text("#who") == f"tessera:tenant:{name}"
    (cookie,) = [c for c in context.cookies() if c["name"] == "tessera_console"]
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and cookie["secure"]
    assert token not in cookie["value"] and name not in cookie["value"]  # sealed, not encoded
    assert not any(token in url for url in requests)  # never in a URL
    assert page.evaluate("document.cookie") == ""  # the script cannot read it
    assert response is not None
    csp = response.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "unsafe-inline" not in csp
    screenshot(page, "console-login")

    page.click("#logout")
    page.wait_for_url("**/ui/login")
    page.goto("/ui/pods")
    assert page.url.endswith("/ui/login")  # logged out: the cookie is gone
    assert dev.tenant  # the token itself still works for the API
    assert dev.client(token).get(f"/api/v1/namespaces/{name}/pods").status_code == 200


def test_pod_list_is_live_and_a_pod_turns_running_without_a_reload(context: Any, dev: Dev) -> None:
    name, token = dev.tenant()
    client = dev.client(token)
    create_pod(client, name, pod("first", cpu="100m", memory="64Mi"))
    page = context.new_page()
    login(page, token)
    page.goto("/ui/pods")
    page.wait_for_selector("tr[data-name=first]")
    page.wait_for_selector("#live:has-text('live')")
    page.evaluate("window.__same_document = true")

    slice_ = pod("second", cpu="1", memory="2Gi", gpu_memory="20Gi", gpu_core=25)
    create_pod(client, name, slice_)
    page.wait_for_selector("tr[data-name=second]")
    page.wait_for_selector("tr[data-name=second] td.phase-Running", timeout=30000)
    assert page.evaluate("window.__same_document") is True  # no reload happened
    assert page.inner_text("#pod-count") == "2 pods"
    assert page.inner_text("tr[data-name=second] td:nth-child(4)") == "20Gi VRAM 25% SM"
    screenshot(page, "console-pods")
    page.click("tr[data-name=second] a")
    page.wait_for_selector("#pod-logs:has-text('started container')", timeout=30000)
    assert page.inner_text("#pod-summary .card .value") == "Running"
    screenshot(page, "console-pod")
    page.go_back()

    client.delete(f"/api/v1/namespaces/{name}/pods/first", params={"gracePeriodSeconds": 0})
    page.wait_for_selector("tr[data-name=first]", state="detached", timeout=30000)


def test_hostile_annotation_and_log_line_are_shown_as_text(context: Any, dev: Dev) -> None:
    name, token = dev.tenant()
    client = dev.client(token)
    manifest = pod("hostile", cpu="100m", memory="64Mi", labels={"app": "x-y"})
    manifest["metadata"]["annotations"] = {"note": XSS}
    manifest["spec"]["containers"][0]["command"] = ["echo", XSS]
    create_pod(client, name, manifest)
    page = context.new_page()
    blocked: list[str] = []
    page.on("console", lambda m: blocked.append(m.text))
    login(page, token)
    page.goto(f"/ui/pods/{name}/hostile")
    page.wait_for_selector(f"td:text-is('{XSS}')")  # the annotation, as text
    page.wait_for_selector("#pod-logs:has-text('onerror')", timeout=30000)
    assert XSS.replace('"', '\\"') in page.inner_text("#pod-logs")  # the log line, as text
    assert XSS in page.inner_text("#pod-yaml")
    assert page.evaluate("window.__xss") is None
    assert page.locator("img").count() == 0 and page.locator("main script").count() == 0


def test_delete_from_the_console(context: Any, dev: Dev) -> None:
    name, token = dev.tenant()
    client = dev.client(token)
    create_pod(client, name, pod("doomed", cpu="100m", memory="64Mi"))
    page = context.new_page()
    login(page, token)
    page.goto(f"/ui/pods/{name}/doomed")
    page.wait_for_selector("#pod-yaml:has-text('doomed')")
    page.on("dialog", lambda dialog: dialog.accept())
    page.click("#delete")
    page.wait_for_selector("#action-message:has-text('done')")

    def gone() -> bool:
        answer = client.get(f"/api/v1/namespaces/{name}/pods/doomed")
        return answer.status_code == 404 or "deletionTimestamp" in answer.json()["metadata"]

    wait_for(gone)


def test_create_from_yaml_shows_the_apis_validation_error(context: Any, dev: Dev) -> None:
    name, token = dev.tenant()
    page = context.new_page()
    login(page, token)
    page.goto("/ui/create")
    page.wait_for_selector(f"#create-namespace option[value={name}]", state="attached")
    page.fill("#create-yaml", "apiVersion: v1\nkind: Pod\nmetadata:\n  name: Bad_Name\nspec: {}\n")
    page.click("#create")
    page.wait_for_selector("#create-result .causes li")
    assert "spec.containers: Required value" in page.inner_text("#create-result")
    page.fill(
        "#create-yaml",
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: made\nspec:\n  containers:\n"
        "  - name: main\n    image: busybox\n    resources:\n      requests: {cpu: 100m}\n",
    )
    page.click("#create")
    page.wait_for_selector("#create-result a")
    assert dev.client(token).get(f"/api/v1/namespaces/{name}/pods/made").status_code == 200


def test_a_tenant_cannot_see_another_tenants_pods_even_by_url(context: Any, dev: Dev) -> None:
    a_name, a_token = dev.tenant("a")
    b_name, b_token = dev.tenant("b")
    create_pod(dev.client(a_token), a_name, pod("mine", cpu="100m", memory="64Mi"))
    create_pod(dev.client(b_token), b_name, pod("secret", cpu="100m", memory="64Mi"))
    page = context.new_page()
    login(page, a_token)
    page.goto("/ui/pods")
    page.wait_for_selector("tr[data-name=mine]")
    assert page.locator("tr[data-name=secret]").count() == 0

    page.goto(f"/ui/pods/{b_name}/secret")
    page.wait_for_selector("#pod-error [role=alert]")
    assert "forbidden" in page.inner_text("#pod-error").lower()
    assert page.inner_text("#pod-yaml") == ""
    answer = gateway(page, "GET", f"/api/v1/namespaces/{b_name}/pods")
    assert answer["status"] == 403
    answer = gateway(page, "DELETE", f"/api/v1/namespaces/{b_name}/pods/secret")
    assert answer["status"] == 403
    assert dev.client(b_token).get(f"/api/v1/namespaces/{b_name}/pods/secret").status_code == 200


def test_the_session_ends_when_its_token_is_revoked(context: Any, dev: Dev) -> None:
    _, token = dev.tenant()
    page = context.new_page()
    login(page, token)
    page.goto("/ui/pods")
    page.wait_for_selector("#live:has-text('live')")
    dev.revoke(token)
    time.sleep(1.0)  # the API's cache of verified tokens (TESSERA_AUTH_CACHE_SECONDS)
    assert gateway(page, "GET", "/api/v1/pods")["status"] == 401
    # The open page, its watch let in before the revocation, goes to the login by itself.
    page.wait_for_url("**/ui/login", timeout=25000)
    page.goto("/ui/pods")
    assert page.url.endswith("/ui/login")


def test_the_operator_sees_every_gpu_and_a_faulted_one_turns_red(context: Any, dev: Dev) -> None:
    name, token = dev.tenant("gpu")
    for i, (memory, core) in enumerate([("40Gi", 50), ("20Gi", 25), ("70Gi", 100), ("10Gi", 10)]):
        manifest = pod(f"slice{i}", cpu="1", memory="2Gi", gpu_memory=memory, gpu_core=core)
        create_pod(dev.client(token), name, manifest)
    create_pod(dev.client(token), name, pod("whole", cpu="4", memory="16Gi", gpus=2))

    def bound() -> bool:
        items = dev.client(token).get(f"/api/v1/namespaces/{name}/pods").json()["items"]
        return all(p["spec"].get("nodeName") for p in items)

    wait_for(bound, timeout=30)
    page = context.new_page()
    login(page, dev.admin_token)
    assert page.url.endswith("/ui/pool")
    page.wait_for_selector("#heatmap[data-gpus]")
    # Hovering the GPU that holds a slice shows the slice.
    spot = page.evaluate(
        """(pod) => {
            const layout = document.getElementById('heatmap').layout;
            for (const node of layout.nodes)
              for (let k = 0; k < node.cells.length; k++)
                if (layout.cells[node.cells[k]].pods.some((p) => `${p.namespace}/${p.name}` === pod))
                  return [node.x + 1, node.y + node.offsets[k] + 1];
            return null;
        }""",
        f"{name}/slice0",
    )
    assert spot is not None
    box = page.locator("#heatmap").bounding_box()
    page.mouse.move(box["x"] + spot[0] + 1, box["y"] + spot[1] + 1)
    page.wait_for_selector("#tooltip:visible")
    assert f"{name}/slice0: 40Gi, 50% SM" in page.inner_text("#tooltip")
    gpus = dev.admin.get("/apis/tessera.io/v1/gpudevices").json()["items"]
    page.wait_for_selector("#heatmap[data-gpus]")
    assert page.get_attribute("#heatmap", "data-gpus") == str(len(gpus))
    red = "([...c.getContext('2d').getImageData(0,0,c.width,c.height).data].filter((v,i,a)=>i%4==0&&v==220&&a[i+1]==30&&a[i+2]==30).length)"
    count_red = f"(c => {red})(document.getElementById('heatmap'))"
    healthy = [g for g in gpus if g["status"]["health"] == "Healthy"]
    before = page.evaluate(count_red)
    victim = healthy[-1]["metadata"]["name"]
    answer = dev.admin.post(
        f"/apis/tessera.io/v1/gpudevices/{victim}/fault",
        json={"spec": {"kind": "xid", "xid": 79, "message": "fell off"}},
    )
    assert answer.status_code == 200, answer.text
    try:
        page.reload()
        page.wait_for_selector("#heatmap[data-gpus]")
        assert page.evaluate(count_red) > before
        assert "Fragmentation" in page.inner_text("#pool-figures")
        screenshot(page, "console-pool")
        page.goto("/ui/nodes")
        page.click(f"button:has-text('Repair {victim}')")
        page.wait_for_selector(f"#node-message:has-text('Repair {victim}: done')")
        gpu = dev.admin.get(f"/apis/tessera.io/v1/gpudevices/{victim}").json()
        assert gpu["status"]["health"] == "Healthy"
    finally:
        dev.admin.post(f"/apis/tessera.io/v1/gpudevices/{victim}/repair", json={})


def test_the_operator_cordons_and_uncordons_a_node(context: Any, dev: Dev) -> None:
    node = dev.admin.get("/api/v1/nodes").json()["items"][0]["metadata"]["name"]
    page = context.new_page()
    login(page, dev.admin_token)
    page.goto("/ui/nodes")
    cordon = f"tr:has(td:text-is('{node}')) button:text-is('Cordon')"
    uncordon = f"tr:has(td:text-is('{node}')) button:text-is('Uncordon')"
    try:
        page.click(cordon)
        page.wait_for_selector(uncordon)
        assert dev.admin.get(f"/api/v1/nodes/{node}").json()["spec"]["unschedulable"] is True
        page.click(uncordon)
        page.wait_for_selector(cordon)
        assert not dev.admin.get(f"/api/v1/nodes/{node}").json()["spec"].get("unschedulable")
    finally:
        dev.admin.patch(
            f"/api/v1/nodes/{node}",
            json={"spec": {"unschedulable": False}},
            headers={"Content-Type": "application/merge-patch+json"},
        )


def test_a_tenant_gets_no_operator_figures(context: Any, dev: Dev) -> None:
    _, token = dev.tenant()
    page = context.new_page()
    login(page, token)
    assert page.locator(".operator-nav").is_hidden()
    page.goto("/ui/scheduler")
    page.wait_for_selector("#scheduler-figures [role=alert]")
    assert "forbidden" in page.inner_text("#scheduler-figures").lower()


def test_docs_load_with_no_network(context: Any, dev: Dev) -> None:
    """Everything /docs loads comes from Tessera itself (this machine has no internet, and
    any request elsewhere is recorded)."""
    page = context.new_page()
    requested: list[str] = []
    page.on("request", lambda r: requested.append(r.url))
    response = page.goto("/docs")
    assert "unsafe-inline" not in response.headers["content-security-policy"]
    page.wait_for_selector(".opblock-tag-section", timeout=60000)
    assert "Tessera" in page.inner_text(".swagger-ui .info")
    assert requested and all(url.startswith(dev.url) for url in requested), requested
    assert any(url.endswith("/openapi.json") for url in requested)


def test_a_finished_pods_cost_is_on_the_usage_page(context: Any, dev: Dev) -> None:
    name, token = dev.tenant()
    client = dev.client(token)
    manifest = pod("billed", cpu="2", memory="4Gi", restartPolicy="Never")
    manifest["metadata"]["annotations"] = {"tessera.io/run-seconds": "2"}
    create_pod(client, name, manifest)
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "etl"},
        "spec": {"template": {"metadata": {"annotations": manifest["metadata"]["annotations"]}}},
    }
    job["spec"]["template"]["spec"] = dict(manifest["spec"])
    made = client.post(f"/apis/batch/v1/namespaces/{name}/jobs", json=job)
    assert made.status_code == 201, made.text

    def ended() -> bool:
        answer = client.get(f"/api/v1/namespaces/{name}/pods/billed").json()
        done = client.get(f"/apis/batch/v1/namespaces/{name}/jobs/etl").json()
        return answer["status"].get("phase") == "Succeeded" and done["status"].get("succeeded") == 1

    wait_for(ended, timeout=40)
    page = context.new_page()
    login(page, token)
    page.goto("/ui/usage")
    row = f"#by-pod tr[data-pod='{name}/billed']"
    page.wait_for_selector(row)
    spend = float(page.get_attribute(row, "data-amount") or 0)
    usage = client.get(
        "/apis/billing.tessera.io/v1/usage", params={"groupBy": "pod", "granularity": "day"}
    ).json()
    expected = sum(float(r["amount"]) for r in usage["items"] if r["pod"] == f"{name}/billed")
    assert spend > 0 and abs(spend - expected) < 1e-6
    # the Job's pod under its workload, the bare pod under none
    by_workload = client.get(
        "/apis/billing.tessera.io/v1/usage", params={"groupBy": "workload", "granularity": "day"}
    ).json()["items"]
    for workload, shown in (("Job/etl", "Job/etl"), (None, "—")):
        cell = page.get_attribute(f"#by-workload tr[data-workload='{shown}']", "data-amount")
        expected = sum(float(r["amount"]) for r in by_workload if r["workload"] == workload)
        assert expected > 0 and abs(float(cell or 0) - expected) < 1e-6, workload
    assert page.locator("canvas").count() == 3  # per hour, per day, BestEffort vs default
    screenshot(page, "console-usage")


def test_scheduler_health_comes_from_metrics(context: Any, dev: Dev) -> None:
    page = context.new_page()
    login(page, dev.admin_token)
    page.goto("/ui/scheduler")
    page.wait_for_selector("#scheduler-figures .card")
    text = page.inner_text("#scheduler-figures")
    for figure in ("Leader", "Queue depth", "Binds per second", "Create-to-bind latency"):
        assert figure in text
    metrics = dev.admin.get("/metrics").text
    bound = sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("scheduler_schedule_attempts_total") and 'result="scheduled"' in line
    )
    shown = page.inner_text("#scheduler-figures .card:has-text('Pods bound') .value")
    assert float(shown) == bound


def test_callbacks_and_their_deliveries(context: Any, dev: Dev) -> None:
    name, token = dev.tenant()
    client = dev.client(token)
    callback = {
        "apiVersion": "tessera.io/v1",
        "kind": "Callback",
        "metadata": {"name": "hook"},
        "spec": {"url": "https://127.0.0.1:9/hook", "events": ["PodFinished"]},
    }
    answer = client.post(f"/apis/tessera.io/v1/namespaces/{name}/callbacks", json=callback)
    assert answer.status_code == 201, answer.text
    manifest = pod("short", cpu="100m", memory="64Mi", restartPolicy="Never")
    manifest["metadata"]["annotations"] = {"tessera.io/run-seconds": "1"}
    create_pod(client, name, manifest)
    deliveries = f"/apis/tessera.io/v1/namespaces/{name}/callbacks/hook/deliveries"
    wait_for(lambda: bool(client.get(deliveries).json()["items"]), timeout=40)
    page = context.new_page()
    login(page, token)
    page.goto("/ui/callbacks")
    page.click("a:text-is('hook')")
    page.wait_for_selector("td:text-is('PodFinished')")
    text = page.inner_text("main")
    assert "short" in text and "the connection failed" in text  # the subject and the last error


def test_resize_and_evict_from_the_console(context: Any, dev: Dev) -> None:
    name, token = dev.tenant()
    client = dev.client(token)
    create_pod(client, name, pod("elastic", cpu="1", memory="1Gi"))
    path = f"/api/v1/namespaces/{name}/pods/elastic"
    wait_for(lambda: client.get(path).json()["status"].get("phase") == "Running", timeout=30)
    page = context.new_page()
    login(page, token)
    page.goto(f"/ui/pods/{name}/elastic")
    page.wait_for_selector("#pod-yaml:has-text('elastic')")
    page.fill("#resize-cpu", "2")
    page.click("#resize")
    page.wait_for_selector("#action-message:has-text('Resize: done')")
    resources = client.get(path).json()["spec"]["containers"][0]["resources"]
    assert resources["requests"]["cpu"] == "2"
    page.fill("#resize-cpu", "lots")
    page.click("#resize")
    page.wait_for_selector("#action-message [role=alert]")  # the API's refusal, shown
    assert client.get(path).json()["spec"]["containers"][0]["resources"]["requests"]["cpu"] == "2"

    page.click("#evict")
    page.wait_for_selector("#action-message:has-text('Evict: done')")
    evicted = client.get(path)
    assert evicted.status_code == 404 or "deletionTimestamp" in evicted.json()["metadata"]
