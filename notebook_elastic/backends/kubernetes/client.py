"""Connecting to a cluster with the official ``kubernetes`` client, and errors users can act on.

Kubeconfig (``$KUBECONFIG`` or ``~/.kube/config``, a chosen context) or in-cluster
configuration. Every ``ApiException`` and connection failure becomes a ``BackendError``
naming what failed and what to do: no kubeconfig, unknown context, missing namespace,
401, 403 with the missing verb and resource, quota exceeded, name taken, unreachable API
server.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from typing import Any

from ...errors import BackendError

CONNECT_TIMEOUT_S = 10
READ_TIMEOUT_S = 90  # above the watch's server-side timeout; log follows reconnect after it


def _with_timeouts(api: Any) -> Any:
    """The client waits forever by default; a hung API server must not hang the notebook."""
    rest = api.rest_client
    request = rest.request

    def request_with_timeout(*args: Any, _request_timeout: Any = None, **kwargs: Any) -> Any:
        # Read at call time, so the limits stay one setting (and tests may shorten them).
        return request(*args, _request_timeout=_request_timeout or (CONNECT_TIMEOUT_S, READ_TIMEOUT_S), **kwargs)

    rest.request = request_with_timeout
    return api


@dataclass
class Connection:
    api: Any  # kubernetes.client.ApiClient
    namespace: str
    context: str | None
    server: str

    def core(self) -> Any:
        from kubernetes import client

        return client.CoreV1Api(self.api)

    def batch(self) -> Any:
        from kubernetes import client

        return client.BatchV1Api(self.api)

    def apps(self) -> Any:
        from kubernetes import client

        return client.AppsV1Api(self.api)

    def custom(self) -> Any:
        from kubernetes import client

        return client.CustomObjectsApi(self.api)

    def extensions(self) -> Any:
        from kubernetes import client

        return client.ApiextensionsV1Api(self.api)

    def version(self) -> Any:
        from kubernetes import client

        return client.VersionApi(self.api)


def connect(context: str | None = None, namespace: str | None = None) -> Connection:
    """A client for the current (or named) kubeconfig context, or the in-cluster config."""
    try:
        from kubernetes import client, config
        from kubernetes.config.config_exception import ConfigException
    except ImportError:
        raise BackendError(
            "the Kubernetes backend needs the `kubernetes` package: pip install 'notebook-elastic[kubernetes]'"
        ) from None
    loaders: Any = config  # the client's config loaders have no annotations
    configuration = client.Configuration()
    if context is None and os.environ.get("KUBERNETES_SERVICE_HOST") and not os.environ.get("KUBECONFIG"):
        try:
            loaders.load_incluster_config(client_configuration=configuration)
        except ConfigException as exc:
            raise BackendError(f"running in a cluster, but its service account config is unusable: {exc}") from None
        ns_file = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
        default_ns = open(ns_file).read().strip() if os.path.exists(ns_file) else "default"
        return Connection(
            _with_timeouts(client.ApiClient(configuration)), namespace or default_ns, None, configuration.host
        )
    # KUBECONFIG may list several files: kubectl merges them (the first to set a value wins),
    # and so does the client's loader when given them joined; files that do not exist are skipped.
    listed = [os.path.expanduser(p) for p in os.environ.get("KUBECONFIG", "~/.kube/config").split(os.pathsep) if p]
    present = [p for p in listed if os.path.exists(p)]
    if not present:
        raise BackendError(
            f"no Kubernetes configuration: {', '.join(listed)} {'does' if len(listed) == 1 else 'do'} not exist "
            "and this is not a pod in a cluster; get a kubeconfig from your cluster admin (or set KUBECONFIG)"
        )
    path = os.pathsep.join(present)
    try:
        contexts, active = loaders.list_kube_config_contexts(config_file=path)
    except ConfigException as exc:
        raise BackendError(f"the kubeconfig {path} is unreadable: {exc}") from None
    names = [c["name"] for c in contexts or []]
    if context is not None and context not in names:
        raise BackendError(
            f"context {context!r} is not in {path}; it has: {', '.join(names) or 'none'} (--context NAME)"
        )
    chosen = next((c for c in contexts if c["name"] == context), active) if contexts else None
    try:
        loaders.load_kube_config(config_file=path, context=context, client_configuration=configuration)
    except ConfigException as exc:
        raise BackendError(f"cannot use context {context or (chosen or {}).get('name')!r} of {path}: {exc}") from None
    default_ns = ((chosen or {}).get("context") or {}).get("namespace") or "default"
    return Connection(
        _with_timeouts(client.ApiClient(configuration)),
        namespace or default_ns,
        (chosen or {}).get("name"),
        configuration.host,
    )


_FORBIDDEN = re.compile(r'cannot (?P<verb>\w+) resource "(?P<resource>[^"]+)"(?: in API group "(?P<group>[^"]*)")?')


def explain(exc: BaseException, action: str, conn: Connection | None = None) -> BackendError:
    """A ``BackendError`` for people from a client exception raised while doing ``action``."""
    from kubernetes.client.exceptions import ApiException

    where = f" in namespace {conn.namespace!r}" if conn else ""
    if isinstance(exc, ApiException):
        message = _status_message(exc)
        if exc.status == 401:
            return BackendError(
                f"the API server refused the credentials of context {conn.context if conn else None!r} (401 Unauthorized) while trying to {action}; log in again or refresh the token"
            )
        if exc.status == 403:
            if "exceeded quota" in message:
                return BackendError(
                    f"the namespace's resource quota is exceeded{where}: {message}; ask for more quota or request fewer GPUs/CPUs"
                )
            m = _FORBIDDEN.search(message)
            if m:
                resource = m.group("resource") + (f".{m.group('group')}" if m.group("group") else "")
                return BackendError(
                    f"your account may not {m.group('verb')} {resource}{where} (403 Forbidden) while trying to {action}; "
                    "ask your admin for the Role in the documentation (docs/how-to/rbac.md)"
                )
            return BackendError(f"forbidden (403) while trying to {action}{where}: {message}")
        if exc.status == 404 and "namespaces" in message and "not found" in message:
            return BackendError(
                f"namespace {conn.namespace if conn else ''!r} does not exist; create it or pass --namespace NAME"
            )
        if exc.status == 409:
            return BackendError(
                f"{message or 'the object already exists'}{where}; stop the old job (%elastic_stop NAME) or choose another --name"
            )
        if exc.status == 422:
            return BackendError(f"the API server rejected the request to {action}: {message}")
        return BackendError(f"the API server answered {exc.status} {exc.reason} while trying to {action}: {message}")
    host = conn.server if conn else "the API server"
    if _is_connection_error(exc):
        return BackendError(
            f"the Kubernetes API server at {host} is unreachable while trying to {action}: {_short(exc)}"
        )
    return BackendError(
        f"unexpected answer from the Kubernetes API server at {host} while trying to {action}: {_short(exc)}"
    )


def _is_connection_error(exc: BaseException) -> bool:
    try:
        import urllib3.exceptions as u3
    except ImportError:  # pragma: no cover
        return isinstance(exc, OSError)
    return isinstance(exc, (OSError, u3.HTTPError))


def _status_message(exc: Any) -> str:
    try:
        return json.loads(exc.body).get("message", "") or ""
    except (TypeError, ValueError, AttributeError):
        return str(exc.body or exc.reason or "")


def _short(exc: BaseException) -> str:
    text = str(exc)
    m = re.search(r"Caused by (\w+\(.*?\))", text) or re.search(r"(\[Errno[^\]]*\][^')]*)", text)
    return (m.group(1) if m else text)[:300]


def is_missing(exc: BaseException) -> bool:
    from kubernetes.client.exceptions import ApiException

    return isinstance(exc, ApiException) and exc.status == 404
