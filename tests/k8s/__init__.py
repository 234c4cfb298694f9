"""A loopback Kubernetes API server for tests: the real ``kubernetes`` client talks to it.

No API server can be had on these machines (no kube-apiserver, k3s, kind or kwok; no
Docker engine), so this is the boundary we fake, faithfully enough for our backend:

- HTTP on 127.0.0.1 (stdlib), the REST paths and verbs the client uses for ConfigMaps,
  Secrets (``stringData`` stored as base64 ``data``, as the real server does), Services,
  Pods (+ logs), PVCs, Namespaces, batch/v1 Jobs, apps/v1 Deployments and ReplicaSets, CRDs
  and kubeflow PyTorchJobs:
  create (201, 409 when taken), get, list with label selectors, watch (chunked JSON lines;
  ADDED for what exists first, then changes; increasing resourceVersions; 410 for a
  resourceVersion too old), merge patch, delete (pods terminate gracefully; ownerReference
  garbage collection; deleteCollection by label).
- A scheduler with N GPU slots: pods asking for more ``nvidia.com/gpu`` than is free stay
  Pending with the scheduler's Unschedulable message; ``set_gpu_slots`` and ``preempt``
  reproduce a reclaim (DisruptionTarget condition, then deletion).
- A kubelet that runs each container's command as a local process: env (values, the
  downward API and ``secretKeyRef``; a missing Secret or key leaves the container waiting in
  CreateContainerConfigError, as a real kubelet does), ``$(VAR)`` expansion in args, ConfigMap volumes written to a temp dir (paths
  under their mountPath rewritten; ``/checkpoints`` with no volume there is the pod's own folder, as
  a container's writable layer is, never the machine's), one 127.A.B.N address per pod (each cluster has a /24 of
  its own), Service names resolved to their ClusterIP (the cluster DNS), stdout+stderr
  kept as the pod log (``follow``, ``timestamps``, ``sinceSeconds``, ``previous``),
  restartPolicy honoured, tcpSocket readiness probes (a pod is Ready once its probe passes);
  ``node_env_by_index`` puts a Job's index on a node unlike the others (a NIC named otherwise).
- kube-proxy: each Service port's ClusterIP listens while the Service has Ready endpoints and
  forwards every connection to one of them (a userspace proxy); without any, connections are
  refused. So a Service follows its pods: a replaced store pod is reached at the same name.
- The Deployment controller (one ReplicaSet per Deployment, named by its pod-template-hash;
  a changed template, a rollout, is refused) and the ReplicaSet controller (a pod deleted or
  evicted is replaced at once, without waiting for it to terminate).
- An Indexed Job controller: one pod per index up to parallelism, replacements for pods
  that failed or vanished, scale by completions/parallelism, Complete/Failed conditions,
  podFailurePolicy's Ignore for DisruptionTarget; a pod over the namespace's GPU quota is
  not created and the Job gets a FailedCreate Warning Event (aggregated, 1 s backoff).
- Events (list/watch with fieldSelector), RBAC as a Role's rules (``grant_only``) or single
  denials (403 with the API server's message), and dropped connections, on demand.
- Strict where the real server is (#17): names (DNS-1123; Services DNS-1035), a ConfigMap
  over 1 MiB, a pod hostname over 63, immutable Job fields (completions only with an equal
  parallelism in an Indexed Job; completionMode, podFailurePolicy, template), 422 as the
  real server words it; server-side dry-run (``dryRun=All``: validated, never stored); JSON,
  merge and strategic-merge patches; a deleted pod is Failed before it goes and its Job
  counts it, unless evicted through the Eviction API (``pods/eviction``: DisruptionTarget);
  the TTL controller; garbage collection honouring ``propagationPolicy`` (a Job deleted
  without one orphans its pods, as the API's default for Jobs); the Job's defaulted selector.
- For the real ``kubectl`` (``kubectl_config``): a TLS listener, discovery (``/api``,
  ``/apis``, resource lists), Table output for ``get``, and OpenAPI v3 (``/openapi/v3`` and
  one document per group-version, built from real schemas: ``openapi.py``), so
  ``kubectl apply`` validates as it does against a real server: server-side, with
  ``fieldValidation=Strict``. Field validation as the API server does it on create, update
  and patch: ``Strict`` refuses unknown and duplicate fields in its words (400 for a
  body, 422 for a patch), ``Warn`` (the default) says them in ``Warning`` headers,
  ``Ignore`` says nothing; unknown fields are never stored. ``/openapi/v2`` answers 404
  (kubectl only reads it from a server without v3).
- Not real, and so not pretended: Service names are rewritten to the ClusterIP in a
  container's command and env when it starts (no DNS server); nodeSelector and affinity are
  not evaluated (one node); no PodDisruptionBudgets, admission webhooks or Pod Security
  admission.

Where each part lives (FakeCluster, in cluster.py, holds one of each and runs their loop):

- objects.py: the kinds served, Status errors, selectors, the three patch kinds, validation,
  Tables (plain functions);
- store.py: ``Store``, the objects, their history and resourceVersions, the registry's
  create (defaulting) and delete (graceful pods, garbage collection), Events;
- server.py: ``ApiServer``, the listeners, kubeconfigs, authentication, RBAC, injected
  errors, routing; ``Streams``, the open chunked answers;
- discovery.py: ``Discovery``, discovery documents, OpenAPI v3, the CRDs installed;
- rest.py: ``Rest``, the verbs (create, get, list, watch, update, patch, delete), dry-run and
  field validation;
- pods.py: ``Scheduler``, ``Quota`` (admission), ``Disruptions`` (preemption, a node cut
  off, the Eviction API) and ``PodLogs`` (pods/log);
- kubelet.py: ``Kubelet``, containers as local processes, their logs, readiness probes,
  graceful termination;
- services.py: ``Network``, addresses, cluster DNS, endpoints and kube-proxy (``ServiceProxy``);
- jobs.py: ``JobController``, batch/v1 Jobs; apps.py: ``Apps``, Deployments and ReplicaSets;
- kueue.py: ``Kueue``; openapi.py: the schemas and field validation; light.py: a job of
  many light pods (tests/test_kubernetes_scale.py).
"""

from __future__ import annotations

from .cluster import FakeCluster
from .jobs import SUSPENDED_BY_JOB, pod_failure_action
from .kubelet import CONTAINER_CHECKPOINTS, Container, ContainerConfigError
from .objects import (
    GROUPS,
    RESOURCES,
    json_patch,
    match_fields,
    match_labels,
    merge_patch,
    now_rfc3339,
    stamp_nano,
    status_error,
    strategic_merge_patch,
    table,
    validate,
)
from .services import ServiceProxy

__all__ = [
    "CONTAINER_CHECKPOINTS",
    "GROUPS",
    "RESOURCES",
    "SUSPENDED_BY_JOB",
    "Container",
    "ContainerConfigError",
    "FakeCluster",
    "ServiceProxy",
    "json_patch",
    "match_fields",
    "match_labels",
    "merge_patch",
    "now_rfc3339",
    "pod_failure_action",
    "stamp_nano",
    "status_error",
    "strategic_merge_patch",
    "table",
    "validate",
]
