"""`GET .../pods/{name}/log` (kubectl logs) through a pod's life: before it runs the answer says
why, while it runs the runtime's lines come (tail, since, timestamps, limitBytes, follow), a
stop and an exit are written as they happen. Runs on SQLite and on PostgreSQL."""

from __future__ import annotations

import re
import threading
import time

from app.pods import service as pods
from tests.api.test_pod_updates import bound_pod
from tests.factories import pod


def test_a_pods_log_through_its_life(server, tenant, admin, make_tenant) -> None:
    ns = tenant.tenant
    url = f"/api/v1/namespaces/{ns}/pods/logged/log"
    manifest = pod("waiting")
    assert tenant.post(f"/api/v1/namespaces/{ns}/pods", json=manifest).status_code == 201
    waiting = tenant.get(f"/api/v1/namespaces/{ns}/pods/waiting/log")
    assert waiting.status_code == 400
    assert (
        "is waiting to start: Tessera has not placed the pod on a node yet"
        in (waiting.json()["message"])
    )

    bound = bound_pod(tenant, admin, "logged")
    starting = tenant.get(url)
    assert starting.status_code == 400 and "its node is starting it" in starting.json()["message"]
    server.services.db.write(lambda s: pods.start(s, uid=bound["metadata"]["uid"]))

    running = tenant.get(url)
    assert running.status_code == 200 and running.headers["content-type"].startswith("text/plain")
    assert running.text.splitlines() == [
        "tessera-runtime: started container main from image registry.example/app:1.0",
        "tessera-runtime: command (the image's entrypoint), args (none)",
    ]
    stamped = tenant.get(url, params={"timestamps": "true", "tailLines": 1}).text.splitlines()
    assert len(stamped) == 1 and stamped[0].endswith("args (none)")
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{9}Z tessera-runtime: .*", stamped[0])
    assert tenant.get(url, params={"tailLines": 0}).text == ""
    assert len(tenant.get(url, params={"sinceSeconds": 3600}).text.splitlines()) == 2
    assert tenant.get(url, params={"sinceTime": "2999-01-01T00:00:00Z"}).text == ""
    assert tenant.get(url, params={"limitBytes": 10}).text == "tessera-ru"
    bad_time = tenant.get(url, params={"sinceTime": "yesterday"})
    assert bad_time.status_code == 400 and "RFC 3339" in bad_time.json()["message"]
    nope = tenant.get(url, params={"container": "nope"})
    assert nope.status_code == 400 and nope.json()["message"] == (
        "container nope is not valid for pod logged"
    )
    previous = tenant.get(url, params={"previous": "true"})
    assert previous.status_code == 400
    assert (
        previous.json()["message"]
        == 'previous terminated container "main" in pod "logged" not found'
    )
    assert make_tenant("logx").get(url).status_code == 403
    assert tenant.get(f"/api/v1/namespaces/{ns}/pods/absent/log").status_code == 404

    # Following: lines arrive as the pod stops, and the stream ends when it has exited.
    got: list[str] = []

    def follow() -> None:
        with tenant.stream("GET", url, params={"follow": "true"}) as response:
            for line in response.iter_lines():
                got.append(line)

    reader = threading.Thread(target=follow)
    reader.start()
    deadline = time.monotonic() + 10
    while len(got) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(got) == 2
    assert tenant.delete(f"/api/v1/namespaces/{ns}/pods/logged").status_code == 200
    server.services.db.write(lambda s: pods.finish(s, uid=bound["metadata"]["uid"]))
    reader.join(timeout=15)
    assert not reader.is_alive()
    assert got[2] == "tessera-runtime: SIGTERM: stopping within 30s"
    assert got[3] == "tessera-runtime: container main exited with code 0 (Completed)"
    assert tenant.get(url).text.splitlines() == got  # the log as a whole says the same
    tenant.delete(f"/api/v1/namespaces/{ns}/pods/logged", params={"gracePeriodSeconds": 0})


def test_a_pod_of_several_containers_asks_which(server, tenant) -> None:
    ns = tenant.tenant
    manifest = pod("two")
    manifest["spec"]["containers"].append(
        {"name": "side", "image": "registry.example/side:1", "args": ["--port", "80"]}
    )
    assert tenant.post(f"/api/v1/namespaces/{ns}/pods", json=manifest).status_code == 201
    answer = tenant.get(f"/api/v1/namespaces/{ns}/pods/two/log")
    assert answer.status_code == 400
    assert answer.json()["message"] == (
        "a container name must be specified for pod two, choose one of: [main side]"
    )
