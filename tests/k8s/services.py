"""The cluster's network: each cluster's own loopback addresses for pods and Services, the
cluster DNS (a Service name rewritten to its ClusterIP where a container starts), and
kube-proxy (a userspace proxy on each Service port's ClusterIP, forwarding to a Ready
endpoint while there is one)."""

from __future__ import annotations

import copy
import random
import re
import socket
import threading
from typing import Any

from .store import Store


class ServiceProxy:
    """kube-proxy for one port of a Service: a listener on its ClusterIP that forwards each
    connection to one Ready endpoint (a userspace proxy). It listens only while the Service
    has Ready endpoints: without any, a connection is refused, as kube-proxy's REJECT rule
    does. Forwarded connections end when either side closes (a deleted pod's do)."""

    def __init__(self, ip: str, port: int, endpoints: Any) -> None:
        self.endpoints = endpoints  # () -> [(ip, port)] of the Ready endpoints, read per connection
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((ip, port))
        self.sock.listen(128)
        self.sock.settimeout(0.2)
        self.closed = False
        self.open: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True, name=f"kube-proxy-{ip}:{port}").start()

    def _accept(self) -> None:
        while not self.closed:
            try:
                client, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            client.settimeout(None)
            targets = self.endpoints()
            try:
                if not targets:
                    raise OSError("no endpoints")
                backend = socket.create_connection(random.choice(targets), timeout=2)
                backend.settimeout(None)
            except OSError:
                client.close()
                continue
            self.open += [client, backend]
            for a, b in ((client, backend), (backend, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()
            if s in self.open:
                self.open.remove(s)

    def close(self, connections: bool = False) -> None:
        self.closed = True
        self.sock.close()
        if connections:
            for s in list(self.open):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


class Network:
    """Addresses, the cluster DNS, Services' endpoints and kube-proxy."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.next_ip = 2
        self.next_block = 0  # which /24 after the cluster's own the next addresses come from
        self.subnet = f"127.{random.randint(1, 254)}.{random.randint(0, 255)}"  # within 127.0.0.0/8
        self.proxies: dict[tuple[str, str, int], ServiceProxy] = {}  # (ns, service, port) -> kube-proxy

    def alloc_ip(self) -> str:
        """The next address of this cluster's own loopback /24 (127.A.B.2-250), so two fake
        clusters at once (a CI run beside a developer's) never share a pod's IP and port; a
        cluster of more pods than that goes on in the next /24s (127.A.B+1...), so no two live
        pods share an address (light.py's hundreds of pods)."""
        ip = self.next_ip
        self.next_ip += 1
        if self.next_ip > 250:
            self.next_ip = 2
            self.next_block += 1
        a, b = self.subnet.split(".")[1:]
        return f"127.{a}.{(int(b) + self.next_block) % 256}.{ip}"

    def resolve(self, text: str, ns: str) -> str:
        """Cluster DNS: a Service name becomes its ClusterIP (kube-proxy forwards to a Ready
        endpoint: ``run_services``); a headless Service's, the address of a Ready pod."""
        with self.store.lock:
            services = [o for k, o in self.store.objects.items() if k[1] == "services" and k[2] == ns]
        for svc in services:
            name = svc["metadata"]["name"]
            ip = svc["spec"].get("clusterIP")
            if not ip or ip == "None":
                ready = self.ready_pods(svc)
                if not ready:
                    continue
                ip = ready[0]["status"]["podIP"]
            for host in (f"{name}.{ns}.svc.cluster.local", f"{name}.{ns}.svc", f"{name}.{ns}", name):
                text = re.sub(rf"(?<![\w.-]){re.escape(host)}(?=[:/]|$)", ip, text)
        return text

    def ready_pods(self, svc: dict[str, Any]) -> list[dict[str, Any]]:
        """The pods behind a Service: selected, with an address, Ready, not terminating."""
        sel = svc["spec"].get("selector") or {}
        ns = svc["metadata"]["namespace"]
        with self.store.lock:
            return [
                p
                for k, p in self.store.objects.items()
                if k[1] == "pods"
                and k[2] == ns
                and sel
                and p["status"].get("podIP")
                and all(p["metadata"].get("labels", {}).get(k2) == v for k2, v in sel.items())
                and not p["metadata"].get("deletionTimestamp")
                and any(
                    c.get("type") == "Ready" and c.get("status") == "True" for c in p["status"].get("conditions", [])
                )
            ]

    def endpoints(self, ns: str, name: str, port: int) -> list[tuple[str, int]]:
        with self.store.lock:
            svc = self.store.objects.get(("v1", "services", ns, name))
        if svc is None:
            return []
        spec_port = next((p for p in svc["spec"].get("ports", []) if int(p["port"]) == port), None)
        if spec_port is None:
            return []
        target = spec_port.get("targetPort", port)
        out = []
        for pod in self.ready_pods(svc):
            number = target
            if isinstance(target, str):
                number = next(
                    (
                        p["containerPort"]
                        for c in pod["spec"].get("containers", [])
                        for p in c.get("ports", [])
                        if p.get("name") == target
                    ),
                    None,
                )
            if number is not None:
                out.append((pod["status"]["podIP"], int(number)))
        return out

    def run_services(self) -> None:
        """kube-proxy: a listener on each Service port's ClusterIP while it has Ready endpoints."""
        with self.store.lock:
            services = [copy.deepcopy(o) for k, o in self.store.objects.items() if k[1] == "services"]
        wanted = set()
        for svc in services:
            ip, ns, name = svc["spec"].get("clusterIP"), svc["metadata"]["namespace"], svc["metadata"]["name"]
            if not ip or ip == "None":
                continue
            for spec_port in svc["spec"].get("ports", []):
                key = (ns, name, int(spec_port["port"]))
                if not self.endpoints(*key):
                    continue
                wanted.add(key)
                if key not in self.proxies:
                    self.proxies[key] = ServiceProxy(ip, key[2], lambda key=key: self.endpoints(*key))
        for key in [k for k in self.proxies if k not in wanted]:
            self.proxies.pop(key).close()

    def close(self) -> None:
        """Every kube-proxy listener shut, with the connections it forwards."""
        with self.store.lock:
            proxies, self.proxies = list(self.proxies.values()), {}
        for proxy in proxies:
            proxy.close(connections=True)
