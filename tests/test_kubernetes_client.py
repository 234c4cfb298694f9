"""Connecting like kubectl does (#17 defect 9): KUBECONFIG lists several files, merged; a
hung API server ends a call with a sentence instead of hanging the notebook."""

from __future__ import annotations

import json
import os
import socket
import threading

import pytest
from k8s_apiserver import FakeCluster

from notebook_elastic.backends.kubernetes import KubernetesBackend, client
from notebook_elastic.errors import BackendError


@pytest.fixture
def fake(no_leftovers):
    cluster = FakeCluster(gpu_slots=0, namespaces=("default", "team"))
    yield cluster
    cluster.close()


def test_kubeconfig_files_are_merged_like_kubectl(fake, tmp_path, monkeypatch):
    """The current context is set in the first file, the cluster and credentials in the
    second (a common split: a personal file over an admin-issued one)."""
    full = json.loads(fake.kubeconfig(tmp_path / "full").read_text())
    full["contexts"][0]["context"]["namespace"] = "team"
    first = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "fake",
        "clusters": [],
        "users": [],
        "contexts": [],
    }
    second = dict(full)
    second.pop("current-context")
    (tmp_path / "first").write_text(json.dumps(first))
    (tmp_path / "second").write_text(json.dumps(second))
    missing = tmp_path / "absent"  # kubectl skips files that do not exist
    monkeypatch.setenv(
        "KUBECONFIG", os.pathsep.join(str(p) for p in (tmp_path / "first", missing, tmp_path / "second"))
    )
    conn = client.connect()  # old code: only the first file, which names no cluster
    assert (conn.context, conn.namespace, conn.server) == ("fake", "team", fake.url)
    assert KubernetesBackend(connection=conn).list() == []


def test_a_hung_api_server_ends_the_call_with_a_sentence(fake, tmp_path, monkeypatch):
    """A server that accepts connections and never answers: the read timeout ends the call
    (shortened here; 90 s by default) with BackendError, for kubeconfig users too."""
    hung = socket.socket()
    hung.bind(("127.0.0.1", 0))
    hung.listen(8)
    config = json.loads(fake.kubeconfig(tmp_path / "k").read_text())
    config["clusters"][0]["cluster"]["server"] = f"http://127.0.0.1:{hung.getsockname()[1]}"
    (tmp_path / "hung").write_text(json.dumps(config))
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "hung"))
    monkeypatch.setattr(client, "READ_TIMEOUT_S", 1)
    outcome: list[BaseException] = []

    def call():
        try:
            KubernetesBackend().list()
        except BaseException as exc:  # noqa: BLE001 - the outcome is what we check
            outcome.append(exc)

    caller = threading.Thread(target=call, daemon=True)
    caller.start()
    caller.join(120)  # a bound on a broken run only; old code: still waiting here
    hung.close()
    assert not caller.is_alive(), "the client waited forever on a hung API server"
    assert isinstance(outcome[0], BackendError) and "while trying to list jobs" in str(outcome[0]), outcome
