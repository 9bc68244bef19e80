"""/metrics of an API served by several worker processes sums them all."""

from __future__ import annotations

import ssl

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.conftest import Kubectl, Process


def _healthz_count(text: str) -> float:
    for family in text_string_to_metric_families(text):
        if family.name == "apiserver_request":
            for sample in family.samples:
                if sample.name.endswith("_total") and sample.labels["resource"] == "/healthz":
                    return sample.value
    return 0.0


def test_every_worker_is_counted(two_workers: Process, kubectl_binary: str) -> None:
    server = two_workers
    admin = Kubectl(server.kubeconfig(None), None)
    context = ssl.create_default_context(cafile=str(server.ca))
    before = _healthz_count(admin("get", "--raw", "/metrics"))  # the server is the session's
    for _ in range(40):  # a new connection each: the kernel spreads them over the workers
        assert httpx.get(f"{server.url}/healthz", verify=context).text == "ok"
    # Each scrape is answered by one worker; each must show every worker's requests.
    scraped = [_healthz_count(admin("get", "--raw", "/metrics")) for _ in range(4)]
    assert [count - before for count in scraped] == [40.0] * 4
