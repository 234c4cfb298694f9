"""FakeCluster: the loopback API server and its cluster, composed of its parts (see the package's
docstring for what each models), with the handles tests use to drive and inspect it."""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from .apps import Apps
from .discovery import Discovery
from .jobs import JobController
from .kubelet import Container, Kubelet
from .kueue import Kueue
from .pods import Disruptions, PodLogs, Quota, Scheduler
from .rest import Rest
from .server import ApiServer, Streams
from .services import Network
from .store import Store


class FakeCluster:
    """A cluster of one node behind a real HTTP API server: its parts, its controller loop, and
    what tests set, break and read."""

    def __init__(
        self,
        gpu_slots: int = 4,
        namespaces: tuple[str, ...] = ("default",),
        crds: tuple[str, ...] = (),
        kueue: bool = False,
        kueue_elastic_slices: bool = False,
    ) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="fake-k8s-"))
        self.store = Store(self, namespaces)
        # Kueue installed (its CRDs served, its controllers run), with or without its
        # ElasticJobsViaWorkloadSlices feature gate.
        self.kueue = Kueue(self.store, elastic_slices=kueue_elastic_slices) if kueue else None
        self.network = Network(self.store)
        self.quota = Quota(self.store)
        self.jobs = JobController(self.store, self.quota)
        self.apps = Apps(self.store)
        self.kubelet = Kubelet(self.store, self.network, self.jobs, self.root)
        self.scheduler = Scheduler(self.store, self.network, self.kubelet, gpu_slots)
        self.disruptions = Disruptions(self.store, self.kubelet)
        self.streaming = Streams(self.store.lock)
        self.logs = PodLogs(self.store, self.kubelet, self.streaming)
        self.discovery = Discovery(self.store.lock, crds, with_kueue=kueue)
        self.rest = Rest(self.store, self.streaming, self.quota, self.disruptions, self.logs)
        self.api = ApiServer(self.store, self.scheduler, self.discovery, self.rest, self.root)
        self.url = self.api.url
        self.tls_url = self.api.tls_url
        self.threads = [
            threading.Thread(target=self.api.server.serve_forever, daemon=True),
            threading.Thread(target=self._controllers, daemon=True),
        ]
        if self.api.tls_server is not None:
            self.threads.append(threading.Thread(target=self.api.tls_server.serve_forever, daemon=True))
        for t in self.threads:
            t.start()

    # -- helpers used by tests ---------------------------------------------------------

    def kubeconfig(self, path: Path, namespace: str = "default", context: str = "fake") -> Path:
        return self.api.kubeconfig(path, namespace, context)

    def kubectl_config(self, path: Path, namespace: str = "default") -> Path:
        """A kubeconfig for the real kubectl: the TLS listener, its certificate as the CA."""
        return self.api.kubectl_config(path, namespace)

    def fail_next(self, method: str, path_regex: str, status: int = 500) -> None:
        """Answer the next `method` request whose path matches with `status` (a transient
        API error: 429, 500, 503), once; call again for more."""
        self.api.fail_next(method, path_regex, status)

    def set_quota(self, gpus: int | None) -> None:
        """A namespace ResourceQuota: pods beyond it are refused at creation (403)."""
        self.quota.gpus = gpus

    def deny(self, verb: str, plural: str) -> None:
        self.api.deny(verb, plural)

    def grant_only(self, rules: list[dict[str, Any]] | None) -> None:
        """RBAC as a Role's `rules` (apiGroups, resources incl. pods/log, verbs): every other
        request is 403 Forbidden. None grants everything again."""
        self.api.grant_only(rules)

    def set_gpu_slots(self, n: int) -> None:
        self.scheduler.set_gpu_slots(n)

    def preempt(self, pod_name: str, namespace: str = "default", reason: str = "PreemptionByScheduler") -> None:
        """What a scheduler preemption or a spot reclaim does: mark, then delete the pod."""
        self.disruptions.preempt(pod_name, namespace, reason)

    def cut_off(self, pod_name: str, namespace: str = "default") -> int:
        """A pod's node lost to a network partition (``Disruptions.cut_off``): returns the frozen
        process group."""
        return self.disruptions.cut_off(pod_name, namespace)

    def drop_streams(self) -> int:
        """Cut every open watch and log stream mid-flight, as a flaky network would."""
        return self.streaming.drop()

    def reset_log_peaks(self) -> None:
        self.logs.reset_peaks()

    def pods(self, namespace: str = "default", selector: str | None = None) -> list[dict[str, Any]]:
        return self.store.pods(namespace, selector)

    def pods_created(self, selector: str, namespace: str = "default") -> int:
        """How many distinct pods matching `selector` were ever created (deleted ones too)."""
        return self.store.pods_created(selector, namespace)

    def get(self, plural: str, name: str, namespace: str = "default", gv: str = "v1") -> dict[str, Any] | None:
        return self.store.get(plural, name, namespace, gv)

    def all_objects(self) -> list[dict[str, Any]]:
        return self.store.all_objects()

    def record_event(self, obj: dict[str, Any], type_: str, reason: str, message: str) -> None:
        self.store.record_event(obj, type_, reason, message)

    def _delete(
        self, key: tuple[str, str, str, str], grace: float | None = None, policy: str | None = None
    ) -> dict[str, Any] | None:
        """Delete as the API server and the garbage collector do (``Store.delete``)."""
        return self.store.delete(key, grace=grace, policy=policy)

    def close(self) -> None:
        self.store.closed = True
        self.network.close()
        self.kubelet.close()
        self.api.close()
        self.drop_streams()
        shutil.rmtree(self.root, ignore_errors=True)

    # -- what tests read and set: the parts' state ----------------------------------------

    @property
    def closed(self) -> bool:
        return self.store.closed

    @property
    def lock(self) -> threading.RLock:
        return self.store.lock

    @property
    def objects(self) -> dict[tuple[str, str, str, str], dict[str, Any]]:
        return self.store.objects

    @property
    def history(self) -> list[tuple[int, str, tuple, dict]]:
        return self.store.history

    @property
    def rv(self) -> int:
        return self.store.rv

    @property
    def namespaces(self) -> set[str]:
        return self.store.namespaces

    @property
    def crds(self) -> set[str]:
        return self.discovery.crds

    @property
    def containers(self) -> dict[str, Container]:
        return self.kubelet.containers

    @property
    def node_env_by_index(self) -> dict[int, dict[str, str]]:
        return self.kubelet.node_env_by_index

    @property
    def token(self) -> str:
        return self.api.token

    @token.setter
    def token(self, value: str) -> None:
        self.api.token = value

    @property
    def denied(self) -> set[tuple[str, str]]:
        return self.api.denied

    @property
    def forbidden(self) -> list[tuple[str, str]]:
        return self.api.forbidden

    @property
    def failures(self) -> list[tuple[str, str, int]]:
        return self.api.failures

    @property
    def requests(self) -> list[tuple[str, str]]:
        return self.api.requests

    @property
    def streams(self) -> list[Any]:
        return self.streaming.open

    @property
    def expired_watches(self) -> list[str]:
        return self.rest.expired_watches

    @property
    def bookmarks(self) -> list[int]:
        return self.rest.bookmarks

    @property
    def evictions(self) -> list[str]:
        return self.disruptions.evictions

    @property
    def log_follows_open(self) -> int:
        return self.logs.follows_open

    @property
    def log_reads_open(self) -> int:
        return self.logs.reads_open

    @property
    def log_follows_peak(self) -> int:
        return self.logs.follows_peak

    @property
    def log_reads_peak(self) -> int:
        return self.logs.reads_peak

    # -- controllers: scheduler, kubelet, job controller ---------------------------------

    def _controllers(self) -> None:
        while not self.closed:
            try:
                self.scheduler.schedule()
                self.kubelet.reap_containers()
                self.kubelet.probe_readiness()
                self.network.run_services()
                self.jobs.run()
                self.apps.run_deployments()
                self.apps.run_replicasets()
                if self.kueue is not None:
                    self.kueue.reconcile()
            except Exception:  # a controller bug must surface in the test, not kill the thread silently
                import traceback

                traceback.print_exc()
            time.sleep(0.1)
