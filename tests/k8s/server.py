"""The HTTP front of the API-server fixture: a plain listener for the ``kubernetes`` client and
a TLS one for the real kubectl (a throwaway self-signed certificate), their kubeconfigs, and
what happens to a request before its verb: authentication (a bearer token), ``/version``,
discovery and OpenAPI, the CRDs, the node, namespaces, RBAC as a Role's rules or single
denials (403 in the API server's words), injected transient errors, and the dry-run and
fieldValidation parameters. The verbs are rest.py's; open chunked answers are ``Streams``."""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlparse

from .discovery import SUBRESOURCES
from .objects import GROUPS, RESOURCES, status_error

if TYPE_CHECKING:
    import threading

    from .discovery import Discovery
    from .pods import Scheduler
    from .rest import Rest
    from .store import Store


class Streams:
    """The chunked answers open now (watches, logs), so a test can cut them mid-flight."""

    def __init__(self, lock: threading.RLock) -> None:
        self.lock = lock
        self.open: list[Any] = []  # their request handlers

    def start(self, h: Any, content_type: str) -> None:
        h.send_response(200)
        h.send_header("Content-Type", content_type)
        h.send_header("Transfer-Encoding", "chunked")
        h.end_headers()
        with self.lock:
            self.open.append(h)

    @staticmethod
    def chunk(h: Any, data: bytes) -> None:
        h.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        h.wfile.flush()

    def end(self, h: Any) -> None:
        try:
            h.wfile.write(b"0\r\n\r\n")
            h.wfile.flush()
        except OSError:
            pass
        with self.lock:
            if h in self.open:
                self.open.remove(h)

    def drop(self) -> int:
        """Cut every open watch and log stream mid-flight, as a flaky network would."""
        with self.lock:
            streams, self.open = self.open, []
        for s in streams:
            try:
                s.connection.shutdown(2)
            except OSError:
                pass
        return len(streams)


class ApiServer:
    """The listeners, who may do what, and the routing of a request to its verb."""

    _PATH = re.compile(
        r"^/(?:api/(?P<core>v1)|apis/(?P<group>[^/]+)/(?P<version>[^/]+))"
        r"(?:/namespaces/(?P<ns>[^/]+))?(?:/(?P<plural>[a-z]+))?(?:/(?P<name>[^/]+))?(?:/(?P<sub>[a-z]+))?$"
    )

    def __init__(self, store: Store, scheduler: Scheduler, discovery: Discovery, rest: Rest, root: Path) -> None:
        self.store = store
        self.scheduler = scheduler  # the node's GPUs, as GET /api/v1/nodes shows them
        self.discovery = discovery
        self.rest = rest
        self.root = root  # where the TLS certificate is written
        self.denied: set[tuple[str, str]] = set()  # (verb, plural)
        self.rules: list[dict[str, Any]] | None = None  # RBAC: only these rules, when set
        self.forbidden: list[tuple[str, str]] = []  # (method, path) answered 403
        self.token = "fake-token"  # requests with another bearer token get 401
        self.requests: list[tuple[str, str]] = []
        self.failures: list[tuple[str, str, int]] = []  # (method, path regex, status) answered once each
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        # The same API over TLS, for kubectl: client-go sends no bearer token over plain HTTP.
        self.tls_ca = root / "tls.crt"  # the listener's self-signed certificate, its own CA
        self.tls_server = self._tls_server()
        self.tls_url = f"https://127.0.0.1:{self.tls_server.server_address[1]}" if self.tls_server else None

    def kubeconfig(self, path: Path, namespace: str = "default", context: str = "fake") -> Path:
        path.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
                    "users": [{"name": "tester", "user": {"token": "fake-token"}}],
                    "contexts": [
                        {"name": context, "context": {"cluster": "fake", "user": "tester", "namespace": namespace}}
                    ],
                    "current-context": context,
                }
            )
        )
        return path

    def _tls_server(self) -> ThreadingHTTPServer | None:
        """A TLS listener with a throwaway self-signed certificate (openssl), or None without openssl."""
        import ssl

        if shutil.which("openssl") is None:
            return None
        cert, key = self.tls_ca, self.root / "tls.key"
        made = subprocess.run(
            [
                "openssl",
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-days",
                "1",
                "-subj",
                "/CN=127.0.0.1",
                "-addext",
                "subjectAltName=IP:127.0.0.1",
                "-keyout",
                str(key),
                "-out",
                str(cert),
            ],
            capture_output=True,
        )
        if made.returncode != 0:
            return None
        server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        server.daemon_threads = True
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        server.socket = context.wrap_socket(server.socket, server_side=True)
        return server

    def kubectl_config(self, path: Path, namespace: str = "default") -> Path:
        """A kubeconfig for the real kubectl: the TLS listener, its certificate as the CA."""
        if self.tls_url is None:
            raise RuntimeError("no TLS listener (openssl is missing)")
        ca = base64.b64encode(self.tls_ca.read_bytes()).decode()
        path.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [
                        {"name": "fake", "cluster": {"server": self.tls_url, "certificate-authority-data": ca}}
                    ],
                    "users": [{"name": "tester", "user": {"token": self.token}}],
                    "contexts": [
                        {"name": "fake", "context": {"cluster": "fake", "user": "tester", "namespace": namespace}}
                    ],
                    "current-context": "fake",
                }
            )
        )
        return path

    def fail_next(self, method: str, path_regex: str, status: int = 500) -> None:
        """Answer the next `method` request whose path matches with `status` (a transient
        API error: 429, 500, 503), once; call again for more."""
        self.failures.append((method, path_regex, status))

    def deny(self, verb: str, plural: str) -> None:
        self.denied.add((verb, plural))

    def grant_only(self, rules: list[dict[str, Any]] | None) -> None:
        """RBAC as a Role's `rules` (apiGroups, resources incl. pods/log, verbs): every other
        request is 403 Forbidden. None grants everything again."""
        self.rules = rules

    def _granted(self, verb: str, group: str, resource: str) -> bool:
        if (verb, resource.split("/")[0]) in self.denied or (verb, "*") in self.denied:
            return False
        if self.rules is None:
            return True
        return any(
            group in r.get("apiGroups", []) and resource in r.get("resources", []) and verb in r.get("verbs", [])
            for r in self.rules
        )

    def _handler(self):
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            raw: bytes  # the request's body, as sent
            body: Any  # and as JSON
            warnings: list[str]  # Warning headers for the answer

            def log_message(self, *args: Any) -> None:
                pass

            def _json(self, code: int, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for warning in self.warnings:  # as the API server sends them (RFC 7234 warn-code 299)
                    self.send_header("Warning", f"299 - {json.dumps(warning)}")
                self.end_headers()
                self.wfile.write(data)

            def _read_body(self) -> None:
                # Always consume the body, even for a request that is refused: the
                # connection is kept alive and the next request starts after it.
                length = int(self.headers.get("Content-Length", 0) or 0)
                raw = self.rfile.read(length) if length else b""
                self.raw = raw
                self.warnings = []
                self.body = json.loads(raw) if raw.strip() else {}

            def _body(self) -> Any:
                return self.body

            def do_GET(self) -> None:
                self._read_body()
                api.route(self, "GET")

            def do_POST(self) -> None:
                self._read_body()
                api.route(self, "POST")

            def do_PATCH(self) -> None:
                self._read_body()
                api.route(self, "PATCH")

            def do_PUT(self) -> None:
                self._read_body()
                api.route(self, "PUT")

            def do_DELETE(self) -> None:
                self._read_body()
                api.route(self, "DELETE")

        return Handler

    def route(self, h: Any, method: str) -> None:
        url = urlparse(h.path)
        q = {k: v[-1] for k, v in parse_qs(url.query).items()}
        self.requests.append((method, url.path))
        if h.headers.get("Authorization") != f"Bearer {self.token}":
            return h._json(401, status_error(401, "Unauthorized", "Unauthorized"))
        if url.path == "/version":
            return h._json(200, {"major": "1", "minor": "31", "gitVersion": "v1.31.0-fake", "platform": "linux/amd64"})
        path = url.path.rstrip("/") or "/"
        if method == "GET" and (
            path in ("/api", "/apis", "/api/v1") or path.count("/") == 3 and path.startswith("/apis/")
        ):
            doc = self.discovery.document(path)
            if doc is not None:
                return h._json(200, doc)
        if (
            method == "GET"
            and url.path.startswith("/openapi/v3")
            and url.path.rstrip("/") in self.discovery.openapi_paths()
        ):
            return self.discovery.serve_openapi(h, url.path.rstrip("/"))
        if url.path.startswith("/openapi/"):
            # /openapi/v2 (protobuf-first; kubectl reads it only from servers without v3).
            return h._json(404, status_error(404, "NotFound", "the server could not find the requested resource"))
        if url.path.startswith("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/"):
            name = url.path.rsplit("/", 1)[1]
            if name in self.discovery.crds:
                return h._json(200, self.discovery.crd(name))
            return h._json(
                404, status_error(404, "NotFound", f'customresourcedefinitions.apiextensions.k8s.io "{name}" not found')
            )
        m = self._PATH.match(url.path)
        if not m:
            return h._json(
                404, status_error(404, "NotFound", f"the server could not find the requested resource ({url.path})")
            )
        gv = m.group("core") or f"{m.group('group')}/{m.group('version')}"
        ns, plural, name, sub = m.group("ns"), m.group("plural"), m.group("name"), m.group("sub")
        if gv == "v1" and ns is None and plural == "nodes" and method == "GET":
            # The one node the scheduler places pods on (cluster-scoped: RBAC by ClusterRole).
            if not self._granted("list" if not name else "get", "", "nodes"):
                self.forbidden.append((method, url.path))
                return h._json(
                    403,
                    status_error(
                        403,
                        "Forbidden",
                        'nodes is forbidden: User "tester" cannot list resource "nodes" in API group "" at the cluster scope',
                    ),
                )
            allocatable = {"cpu": "16", "memory": "64Gi", "pods": "110"}
            if self.scheduler.gpu_slots:
                allocatable["nvidia.com/gpu"] = str(self.scheduler.gpu_slots)
            node = {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": "fake-node", "uid": "fake-node-uid"},
                "status": {"allocatable": allocatable, "capacity": allocatable},
            }
            return h._json(
                200,
                {
                    "apiVersion": "v1",
                    "kind": "NodeList",
                    "metadata": {"resourceVersion": str(self.store.rv)},
                    "items": [node],
                },
            )
        if plural is None and ns is not None and gv == "v1":
            # GET /api/v1/namespaces/NAME
            if ns in self.store.namespaces:
                return h._json(
                    200,
                    {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}, "status": {"phase": "Active"}},
                )
            return h._json(404, status_error(404, "NotFound", f'namespaces "{ns}" not found'))
        if (gv, plural) not in RESOURCES or not self.discovery.serves(gv):
            return h._json(
                404, status_error(404, "NotFound", f"the server could not find the requested resource ({plural})")
            )
        if sub is not None and sub not in SUBRESOURCES.get(plural, []):
            return h._json(
                404, status_error(404, "NotFound", f"the server could not find the requested resource ({plural}/{sub})")
            )
        verb = {
            "GET": "get" if name else ("watch" if q.get("watch") in ("true", "1") else "list"),
            "POST": "create",
            "PATCH": "patch",
            "PUT": "update",
            "DELETE": "delete" if name else "deletecollection",
        }[method]
        group = GROUPS[gv]
        resource = f"{plural}/{sub}" if sub else plural
        if not self._granted(verb, group, resource):
            self.forbidden.append((method, url.path))
            return h._json(
                403,
                status_error(
                    403,
                    "Forbidden",
                    f'{plural}{"." + group if group else ""} is forbidden: User "tester" cannot {verb} resource "{resource}" in API group "{group}" in the namespace "{ns}"',
                ),
            )
        if self.failures:
            method_, path_, code_ = self.failures[0]
            if method_ == method and re.search(path_, url.path):
                self.failures.pop(0)
                reason = {429: "TooManyRequests", 500: "InternalError", 503: "ServiceUnavailable"}.get(code_, "Unknown")
                return h._json(code_, status_error(code_, reason, f"injected {code_} for {url.path}"))
        ns = ns or "default"
        dry_run = q.get("dryRun") == "All"
        if "dryRun" in q and not dry_run:
            return h._json(
                400, status_error(400, "BadRequest", f"unsupported dryRun value {q['dryRun']!r}; only All is supported")
            )
        directive = q.get("fieldValidation", "Warn")  # the server's default since 1.27
        if method in ("POST", "PUT", "PATCH") and directive not in ("Ignore", "Warn", "Strict"):
            return h._json(
                400,
                status_error(
                    400,
                    "BadRequest",
                    f'fieldValidation: Unsupported value: "{directive}": supported values: "Ignore", "Strict", "Warn"',
                ),
            )
        self.rest.serve(h, method, q, gv, plural, ns, name, sub, group, dry_run, directive)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        if self.tls_server is not None:
            self.tls_server.shutdown()
            self.tls_server.server_close()
