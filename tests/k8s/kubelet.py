"""The kubelet of the fixture's one node: each pod's first container run as a local process
(env with the downward API and Secret keys, ``$(VAR)`` expansion, ConfigMap and PVC volumes
in a temp dir, Service names resolved by the cluster DNS), its stdout+stderr kept as the pod
log with a timestamp per line, restartPolicy honoured, tcpSocket readiness probes, graceful
termination of a deleted pod."""

from __future__ import annotations

import base64
import copy
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .objects import now_rfc3339, stamp_nano

if TYPE_CHECKING:
    from .jobs import JobController
    from .services import Network
    from .store import Store

# The backend's default checkpoint folder (naming.CHECKPOINT_MOUNT).
CONTAINER_CHECKPOINTS = "/checkpoints"


class ContainerConfigError(Exception):
    """What the kubelet reports when a container's env cannot be built (a missing Secret)."""


class Container:
    """A pod's container, run as a local process by the fake kubelet."""

    def __init__(self, proc: subprocess.Popen, log_path: Path) -> None:
        self.proc = proc
        self.log_path = log_path
        self.started = time.time()


def bare_python_image(image: str) -> bool:
    """Docker's official Python images (python:3.12-slim, docker.io/library/python:3.12)."""
    name = image.strip().removeprefix("docker.io/").removeprefix("library/")
    return name == "python" or name.startswith(("python:", "python@"))


def set_ready(pod: dict[str, Any], ready: bool) -> None:
    """The pod's Ready condition (what Services and `kubectl get` read)."""
    conditions = [c for c in pod["status"].get("conditions", []) if c.get("type") != "Ready"]
    conditions.append({"type": "Ready", "status": "True" if ready else "False", "lastTransitionTime": now_rfc3339()})
    pod["status"]["conditions"] = conditions


class Kubelet:
    """The node's containers, their logs and readiness, and how a pod ends."""

    def __init__(self, store: Store, network: Network, jobs: JobController, root: Path) -> None:
        self.store = store
        self.network = network  # the cluster DNS, where a container starts
        self.jobs = jobs  # a Job's pod that ends is kept for it (its tracking finalizer)
        self.root = root  # each pod's folder: its volumes, its log, its writable layer
        self.containers: dict[str, Container] = {}  # pod uid -> running container
        self.previous_logs: dict[str, Path] = {}  # pod uid -> last terminated container's log
        self.probes: dict[str, tuple[float, int]] = {}  # container's pod uid -> (last probe, failures in a row)
        # A Job's pods of index N land on a node unlike the others (a NIC named otherwise, a
        # broken driver, a library missing there): what that node does differently, as
        # environment its containers see. The same index lands there again when replaced.
        self.node_env_by_index: dict[int, dict[str, str]] = {}

    def _env(self, pod: dict[str, Any], container: dict[str, Any]) -> dict[str, str]:
        env = {
            "PATH": os.environ.get("PATH", ""),
            "HOME": os.environ.get("HOME", "/root"),
            "HOSTNAME": pod["metadata"]["name"],
        }
        # The test marker (tests/conftest.py: the leftover check finds pods by it) and the test's
        # private temp folder (where zygote sockets go) reach every pod.
        for key in ("NOTEBOOK_ELASTIC_TEST_ID", "LANG", "TMPDIR"):
            if key in os.environ:
                env[key] = os.environ[key]
        for item in container.get("env", []):
            if "value" in item:
                env[item["name"]] = self._expand(str(item["value"]), env)
            elif "valueFrom" in item and "secretKeyRef" in item["valueFrom"]:
                ref = item["valueFrom"]["secretKeyRef"]
                secret = self.store.get("secrets", ref["name"], pod["metadata"]["namespace"])
                if secret is None:
                    raise ContainerConfigError(f'secret "{ref["name"]}" not found')
                if ref["key"] not in (secret.get("data") or {}):
                    raise ContainerConfigError(f"couldn't find key {ref['key']} in Secret {ref['name']}")
                env[item["name"]] = base64.b64decode(secret["data"][ref["key"]]).decode()
            elif "valueFrom" in item and "fieldRef" in item["valueFrom"]:
                path = item["valueFrom"]["fieldRef"]["fieldPath"]
                value = {
                    "metadata.name": pod["metadata"]["name"],
                    "metadata.namespace": pod["metadata"]["namespace"],
                    "status.podIP": pod["status"].get("podIP", ""),
                }.get(path, "")
                env[item["name"]] = value
        if "JOB_COMPLETION_INDEX" not in env and "batch.kubernetes.io/job-completion-index" in pod["metadata"].get(
            "labels", {}
        ):
            env["JOB_COMPLETION_INDEX"] = pod["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"]
        index = pod["metadata"].get("labels", {}).get("batch.kubernetes.io/job-completion-index")
        if index is not None and index.isdigit():
            env.update(self.node_env_by_index.get(int(index), {}))
        return env

    @staticmethod
    def _expand(text: str, env: dict[str, str]) -> str:
        return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m.group(1), m.group(0)), text)

    def _wait_container(self, pod: dict[str, Any], container: dict[str, Any], reason: str, message: str) -> None:
        """The container cannot start (yet): the pod stays Pending with the kubelet's reason."""
        with self.store.lock:
            current = self.store.objects.get(self.store.key(pod))
            if current is None:
                return
            new = copy.deepcopy(current)
            new["status"]["containerStatuses"] = [
                {
                    "name": container["name"],
                    "ready": False,
                    "restartCount": 0,
                    "image": container.get("image", ""),
                    "imageID": "",
                    "state": {"waiting": {"reason": reason, "message": message}},
                }
            ]
            self.store.put("MODIFIED", new)

    def start_container(self, pod: dict[str, Any]) -> None:
        uid = pod["metadata"]["uid"]
        ns = pod["metadata"]["namespace"]
        container = pod["spec"]["containers"][0]
        if "does-not-exist" in container.get("image", ""):
            # The registry has no such image: the kubelet backs off pulling it, forever.
            with self.store.lock:
                current = self.store.objects.get(self.store.key(pod))
                if current is not None:
                    new = copy.deepcopy(current)
                    new["status"]["containerStatuses"] = [
                        {
                            "name": container["name"],
                            "ready": False,
                            "restartCount": 0,
                            "image": container["image"],
                            "imageID": "",
                            "state": {
                                "waiting": {
                                    "reason": "ImagePullBackOff",
                                    "message": f'Back-off pulling image "{container["image"]}"',
                                }
                            },
                        }
                    ]
                    self.store.put("MODIFIED", new)
            return
        pod_dir = self.root / uid
        pod_dir.mkdir(parents=True, exist_ok=True)
        mounts: dict[str, str] = {}
        volumes = {v["name"]: v for v in pod["spec"].get("volumes", [])}
        for mount in container.get("volumeMounts", []):
            vol = volumes.get(mount["name"], {})
            host = pod_dir / "volumes" / mount["name"]
            if "configMap" in vol:
                cm = self.store.get("configmaps", vol["configMap"]["name"], ns)
                host.mkdir(parents=True, exist_ok=True)
                for key, value in (cm or {}).get("data", {}).items():
                    (host / key).write_text(value)
                for key, value in (cm or {}).get("binaryData", {}).items():
                    (host / key).write_bytes(base64.b64decode(value))
            elif "persistentVolumeClaim" in vol:
                host = self.root / "pvc" / ns / vol["persistentVolumeClaim"]["claimName"]
                host.mkdir(parents=True, exist_ok=True)
            else:
                host.mkdir(parents=True, exist_ok=True)
            if mount["mountPath"] == "/dev/shm":
                continue
            mounts[mount["mountPath"]] = str(host)
        # A path in the image's own filesystem (the default checkpoint folder without a PVC)
        # is the container's, not the machine's: jobs never share it, as on a real node.
        mounts.setdefault(CONTAINER_CHECKPOINTS, str(pod_dir / "rootfs" / CONTAINER_CHECKPOINTS.lstrip("/")))
        try:
            env = self._env(pod, container)
        except ContainerConfigError as exc:
            self._wait_container(pod, container, "CreateContainerConfigError", str(exc))
            return

        def rewrite(text: str) -> str:
            text = self._expand(text, env)
            for path, host in sorted(mounts.items(), key=lambda kv: -len(kv[0])):
                text = text.replace(path, host)
            return self.network.resolve(text, ns)

        env = {k: rewrite(v) for k, v in env.items()}
        argv = [rewrite(a) for a in container.get("command", []) + container.get("args", [])]
        if argv and argv[0] in ("python", "python3"):
            argv[0] = sys.executable
            if bare_python_image(container.get("image", "")):
                # Docker's official Python image has the standard library and nothing else:
                # no site-packages here either (no torch, no cloudpickle), so code that needs
                # more fails here as it would in that image.
                argv[1:1] = ["-S"]
        log_path = pod_dir / f"log-{int(time.time() * 1000)}.txt"
        log = open(log_path, "wb")
        reader_r, reader_w = os.pipe()
        proc = subprocess.Popen(
            argv,
            env=env,
            cwd=str(pod_dir),
            stdin=subprocess.DEVNULL,
            stdout=reader_w,
            stderr=reader_w,
            start_new_session=True,
        )
        os.close(reader_w)
        threading.Thread(target=self._pump_log, args=(reader_r, log), daemon=True).start()
        with self.store.lock:
            self.containers[uid] = Container(proc, log_path)
            current = self.store.objects.get(self.store.key(pod))
            if current is None:
                return
            new = copy.deepcopy(current)
            new["status"]["phase"] = "Running"
            restarts = (new["status"].get("containerStatuses") or [{}])[0].get("restartCount", 0)
            # With a readinessProbe the container is Ready only once the probe passes.
            ready = not container.get("readinessProbe")
            self.probes.pop(uid, None)
            set_ready(new, ready)
            new["status"]["containerStatuses"] = [
                {
                    "name": container["name"],
                    "ready": ready,
                    "restartCount": restarts,
                    "image": container.get("image", ""),
                    "imageID": "",
                    "state": {"running": {"startedAt": now_rfc3339()}},
                }
            ]
            new["status"]["startTime"] = new["status"].get("startTime") or now_rfc3339()
            self.store.put("MODIFIED", new)

    @staticmethod
    def _pump_log(fd: int, log: Any) -> None:
        """The container runtime: timestamp every line as it arrives."""
        with os.fdopen(fd, "rb") as pipe:
            for line in iter(pipe.readline, b""):
                log.write(stamp_nano(time.time()).encode() + b" " + line.rstrip(b"\n") + b"\n")
                log.flush()
        log.close()

    def reap_containers(self) -> None:
        with self.store.lock:
            done = [(uid, c) for uid, c in self.containers.items() if c.proc.poll() is not None]
        for uid, c in done:
            time.sleep(0.05)  # let the log pump catch the last lines
            code = c.proc.returncode
            with self.store.lock:
                self.containers.pop(uid, None)
                self.previous_logs[uid] = c.log_path
                key = next((k for k, o in self.store.objects.items() if o["metadata"]["uid"] == uid), None)
                if key is None:
                    continue
                pod = copy.deepcopy(self.store.objects[key])
                if pod["metadata"].get("deletionTimestamp"):
                    continue
                exit_code = code if code >= 0 else 128 - code
                reason = (
                    "Completed"
                    if code == 0
                    else ("OOMKilled" if code == -9 and os.environ.get("FAKE_K8S_OOM") else "Error")
                )
                restarts = pod["status"]["containerStatuses"][0].get("restartCount", 0)
                policy = pod["spec"].get("restartPolicy", "Always")
                if policy == "Always" or (policy == "OnFailure" and code != 0):
                    set_ready(pod, False)
                    pod["status"]["containerStatuses"][0].update(
                        ready=False,
                        restartCount=restarts + 1,
                        state={"waiting": {"reason": "ContainerCreating"}},
                        lastState={"terminated": {"exitCode": exit_code, "reason": reason}},
                    )
                    stored = self.store.put("MODIFIED", pod)
                    self.start_container(stored)
                    continue
                pod["status"]["phase"] = "Succeeded" if code == 0 else "Failed"
                set_ready(pod, False)
                pod["status"]["containerStatuses"][0].update(
                    ready=False,
                    state={"terminated": {"exitCode": exit_code, "reason": reason, "finishedAt": now_rfc3339()}},
                )
                self.store.put("MODIFIED", pod)

    def kill_container(self, uid: str, grace: float) -> None:
        with self.store.lock:
            c = self.containers.get(uid)
        if c is None:
            return
        # As a container runtime stops a container: SIGTERM to its first process alone (PID 1,
        # which passes it on as it sees fit), SIGKILL at the end of the grace period; when the
        # first process ends, whatever else ran in the container ends with it (the PID namespace).
        try:
            os.kill(c.proc.pid, signal.SIGTERM)
        except OSError:
            pass
        try:
            c.proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(c.proc.pid, signal.SIGKILL)
        except OSError:
            pass
        c.proc.wait()
        with self.store.lock:
            self.containers.pop(uid, None)
            self.previous_logs[uid] = c.log_path

    def terminate_pod(self, key: tuple[str, str, str, str], pod: dict[str, Any]) -> None:
        grace = float(pod["metadata"].get("deletionGracePeriodSeconds", 30))
        self.kill_container(pod["metadata"]["uid"], grace=max(grace, 0.2))
        with self.store.lock:
            current = self.store.objects.get(key)
            if current is None or current["metadata"]["uid"] != pod["metadata"]["uid"]:
                return
            gone = copy.deepcopy(current)
            statuses = gone["status"].get("containerStatuses") or []
            if statuses and "running" in (statuses[0].get("state") or {}):
                statuses[0]["state"] = {"terminated": {"exitCode": 143, "reason": "Error", "finishedAt": now_rfc3339()}}
            if gone["status"].get("phase") not in ("Succeeded", "Failed"):
                # A deleted pod that was not done is Failed before it goes (Kubernetes >= 1.26):
                # its Job counts it against backoffLimit unless a DisruptionTarget condition
                # (the Eviction API, a preemption) lets podFailurePolicy ignore it.
                gone["status"]["phase"] = "Failed"
                self.store.put("MODIFIED", gone)
                gone = copy.deepcopy(gone)
            if any(r.get("kind") == "Job" for r in gone["metadata"].get("ownerReferences", [])):
                self.jobs.finished_pods[gone["metadata"]["uid"]] = copy.deepcopy(gone)  # the Job's tracking finalizer
            self.store.put("DELETED", gone)
        self.store.collect_garbage(pod["metadata"]["uid"])

    def probe_readiness(self) -> None:
        """The kubelet's tcpSocket readiness probes: every periodSeconds; Ready after one
        success, not Ready after failureThreshold failures in a row (default 3)."""
        now = time.monotonic()
        with self.store.lock:
            due = []
            for key, pod in self.store.objects.items():
                uid = pod["metadata"]["uid"]
                if key[1] != "pods" or uid not in self.containers or pod["metadata"].get("deletionTimestamp"):
                    continue
                container = pod["spec"]["containers"][0]
                probe = container.get("readinessProbe") or {}
                if "tcpSocket" not in probe:
                    continue
                last, failures = self.probes.get(uid, (0.0, 0))
                if now - last < float(probe.get("periodSeconds", 10)):
                    continue
                port = probe["tcpSocket"]["port"]
                if isinstance(port, str):
                    port = next((p["containerPort"] for p in container.get("ports", []) if p.get("name") == port), 0)
                due.append((key, uid, pod["status"].get("podIP"), int(port), failures, probe))
        for key, uid, ip, port, failures, probe in due:
            try:
                socket.create_connection((ip, port), timeout=float(probe.get("timeoutSeconds", 1))).close()
                ok = True
            except OSError:
                ok = False
            failures = 0 if ok else failures + 1
            with self.store.lock:
                self.probes[uid] = (now, failures)
                pod = self.store.objects.get(key)
                if pod is None or pod["metadata"]["uid"] != uid or uid not in self.containers:
                    continue
                statuses = pod["status"].get("containerStatuses") or [{}]
                ready = bool(statuses[0].get("ready"))
                if ok and not ready or not ok and ready and failures >= int(probe.get("failureThreshold", 3)):
                    new = copy.deepcopy(pod)
                    new["status"]["containerStatuses"][0]["ready"] = ok
                    set_ready(new, ok)
                    self.store.put("MODIFIED", new)

    def close(self) -> None:
        """Every container stopped (2 s of grace), as the cluster goes."""
        with self.store.lock:
            uids = list(self.containers)
        for uid in uids:
            self.kill_container(uid, grace=2)
