"""Finding credentials inside the values a cell ships, by name and by value, before launch.

A shipped value is pickled into the payload every worker reads, and kept in the job folder;
a token inside it travels silently. ``find_credential`` looks through containers (dicts,
lists, tuples, sets, dataclasses, namespaces, named tuples, pydantic models, plain objects'
attributes) for
- strings shaped like well-known credentials (``hf_``, ``sk-``, ``ghp_``/``github_pat_``,
  Slack ``xox?-``, AWS ``AKIA...``, ``Bearer ...``, JWTs, PEM private keys), and
- non-empty text under a credential-like name (``token``, ``password``, ``api_key``, ...),
  as a dict key or an attribute name at any depth.
Bounded: a few levels deep, a few hundred items per container, a few thousand items in all,
so a dataset is sampled, never walked element by element; tensors and arrays are never
entered. Pure: no imports beyond the standard library (pydantic only if already imported).
"""

from __future__ import annotations

import dataclasses
import re
import sys
import types
from dataclasses import dataclass
from typing import Any

MAX_DEPTH = 6
MAX_ITEMS_PER_CONTAINER = 256
MAX_ITEMS = 4096
MAX_TEXT_CHARS = 1 << 16  # a credential sits in a short string; long texts are read this far

_ALNUM_MIX = re.compile(r"(?=.*[0-9])(?=.*[A-Za-z])")
#: (what it is, pattern); the part after a prefix must mix letters and digits, so prose like
#: "sk-learn-compatible-estimators" is not a key.
_SHAPES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("a Hugging Face token (hf_...)", re.compile(r"(?<![A-Za-z0-9_])hf_([A-Za-z0-9]{30,})")),
    ("an API key (sk-...)", re.compile(r"(?<![A-Za-z0-9_-])sk-((?:proj-|ant-|svcacct-)?[A-Za-z0-9_-]{20,})")),
    ("a GitHub token (ghp_...)", re.compile(r"(?<![A-Za-z0-9_])gh[pousr]_([A-Za-z0-9]{30,})")),
    ("a GitHub token (github_pat_...)", re.compile(r"(?<![A-Za-z0-9_])github_pat_([A-Za-z0-9_]{22,})")),
    ("a Slack token (xox?-...)", re.compile(r"(?<![A-Za-z0-9_])xox[abposr]-([A-Za-z0-9-]{10,})")),
    ("an AWS access key id (AKIA...)", re.compile(r"(?<![A-Z0-9])AKIA([0-9A-Z]{16})(?![A-Z0-9])")),
    ("a bearer token (Bearer ...)", re.compile(r"\bBearer\s+([A-Za-z0-9._~+/=-]{16,})")),
    (
        "a JSON Web Token (eyJ...)",
        re.compile(r"(?<![A-Za-z0-9_-])(eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,})"),
    ),
    ("a private key (-----BEGIN ... PRIVATE KEY-----)", re.compile(r"-----BEGIN ([A-Z0-9 ]+ )?PRIVATE KEY-----()")),
)

_SECRET_WORDS = {"token", "secret", "password", "passwd", "pwd", "apikey", "credential", "credentials", "passphrase"}
_SECRET_PHRASES = ("api_key", "apikey", "access_key", "private_key", "secret", "password")
#: Names of tokenizer special tokens and counts (``pad_token``, ``max_tokens``): not secrets.
_TOKEN_NOT_SECRET = {
    "pad", "eos", "bos", "unk", "cls", "mask", "sep", "sos", "special", "start", "end", "additional",
    "max", "min", "num", "n", "new", "added", "split", "stop", "image", "vision", "audio", "vocab",
}  # fmt: skip
#: ``X_key`` names that name data, not keys: ``sort_key``, ``primary_key``, ...
_KEY_NOT_SECRET = {
    "sort", "primary", "foreign", "partition", "cache", "group", "join", "lookup", "index", "hash", "dict",
    "map", "column", "field", "label", "input", "target", "text", "data", "image", "audio", "feature",
    "batch", "metric", "model", "random", "rng", "seed", "state", "query", "value", "dataset", "split",
}  # fmt: skip


def credential_name(name: str) -> bool:
    """HF_TOKEN, db_password, OPENAI_API_KEY, openai_key: names people give credentials."""
    lower = name.lower()
    words = [w for w in re.split(r"[^a-z0-9]+", re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name).lower()) if w]
    if "token" in words or "tokens" in words:
        if set(words) & _TOKEN_NOT_SECRET:
            return False
    if set(words) & _SECRET_WORDS or any(p in lower for p in _SECRET_PHRASES):
        return True
    return len(words) >= 2 and words[-1] == "key" and words[-2] not in _KEY_NOT_SECRET


def credential_shape(text: str) -> str | None:
    """What kind of well-known credential ``text`` contains (or None)."""
    text = text[:MAX_TEXT_CHARS]
    for what, pattern in _SHAPES:
        for match in pattern.finditer(text):
            tail = match.group(1)
            if what.startswith("a private key") or _ALNUM_MIX.match(tail):
                return what
    return None


@dataclass(frozen=True)
class Found:
    """A credential inside a shipped value: where (``config['api_key']``) and why."""

    path: str
    why: str


def _skip(value: Any) -> bool:
    """Things never entered: arrays and tensors (big, numeric), code, modules, types."""
    if isinstance(value, (int, float, complex, bool, type(None), range, types.ModuleType, type)):
        return True
    if callable(value) and isinstance(
        value, (types.FunctionType, types.BuiltinFunctionType, types.MethodType, types.LambdaType)
    ):
        return True
    module = type(value).__module__.split(".")[0]
    if module in ("torch", "numpy", "pandas", "scipy", "jax", "tensorflow", "PIL") and not _is_pydantic(value):
        # Tensors, arrays, frames, images: their contents are numbers, and walking them is slow.
        # An nn.Module is walked below (its config may hold a token), never its tensors.
        torch = sys.modules.get("torch")
        return not (torch is not None and isinstance(value, torch.nn.Module))
    return False


def _is_pydantic(value: Any) -> bool:
    pydantic = sys.modules.get("pydantic")
    return pydantic is not None and isinstance(value, getattr(pydantic, "BaseModel", ()))


def _secret_type(value: Any) -> bool:
    """pydantic's SecretStr / SecretBytes: a credential whatever it is called."""
    t = type(value)
    return t.__module__.split(".")[0] == "pydantic" and t.__name__ in ("SecretStr", "SecretBytes")


def _attributes(value: Any) -> list[tuple[str, Any]] | None:
    """An object's named fields: dataclass fields, pydantic fields, __dict__, __slots__."""
    if isinstance(value, tuple) and hasattr(type(value), "_fields"):  # a named tuple
        named: Any = type(value)  # a tuple subclass with _fields
        return list(zip(named._fields, value))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [(f.name, getattr(value, f.name, None)) for f in dataclasses.fields(value)]
    if _is_pydantic(value):
        return list(dict(value).items())
    attrs: list[tuple[str, Any]] = []
    if isinstance(getattr(value, "__dict__", None), dict):
        attrs += list(vars(value).items())
    for cls in type(value).__mro__:
        for slot in getattr(cls, "__slots__", ()) if isinstance(getattr(cls, "__slots__", ()), tuple) else ():
            if hasattr(value, slot) and slot != "__dict__":
                attrs.append((slot, getattr(value, slot)))
    return attrs if attrs or hasattr(value, "__dict__") else None


def find_credential(name: str, value: Any) -> Found | None:
    """The first credential inside the notebook value ``name`` (its path and what it looks
    like), or None. The value itself is checked by shape only: its own name is the
    caller's business (top-level strings are withheld by name, see ``collect``)."""
    budget = [MAX_ITEMS]
    seen: set[int] = set()

    def visit(path: str, v: Any, field: str | None, depth: int) -> Found | None:
        budget[0] -= 1
        if budget[0] < 0:
            return None
        if _secret_type(v):
            return Found(path, "a pydantic secret value")
        if isinstance(v, str):
            shape = credential_shape(v)
            if shape:
                return Found(path, f"it holds {shape}")
            if field is not None and v.strip() and credential_name(field) and _secret_like_text(v):
                return Found(path, f"it is text under the name {field!r}")
            return None
        if isinstance(v, (bytes, bytearray)):
            if field is not None and v.strip() and credential_name(field) and len(v) <= 4096:
                return Found(path, f"it is bytes under the name {field!r}")
            return None
        if depth >= MAX_DEPTH or _skip(v) or id(v) in seen:
            return None
        seen.add(id(v))
        if isinstance(v, (dict, types.MappingProxyType)):
            for i, (k, item) in enumerate(v.items()):
                if i >= MAX_ITEMS_PER_CONTAINER:
                    break
                key = k if isinstance(k, str) else None
                found = visit(f"{path}[{k!r}]", item, key, depth + 1)
                if found:
                    return found
            return None
        attrs = _attributes(v) if not isinstance(v, (list, set, frozenset)) else None
        if attrs is not None and not (isinstance(v, tuple) and not hasattr(type(v), "_fields")):
            for attr, item in attrs[:MAX_ITEMS_PER_CONTAINER]:
                found = visit(f"{path}.{attr}", item, attr, depth + 1)
                if found:
                    return found
            return None
        if isinstance(v, (list, tuple)):
            for i, item in enumerate(v[:MAX_ITEMS_PER_CONTAINER]):
                found = visit(f"{path}[{i}]", item, None, depth + 1)
                if found:
                    return found
            return None
        if isinstance(v, (set, frozenset)):
            for i, item in enumerate(v):
                if i >= MAX_ITEMS_PER_CONTAINER:
                    break
                found = visit(f"an item of {path}", item, None, depth + 1)
                if found:
                    return found
        return None

    return visit(name, value, None, 0)


def _secret_like_text(text: str) -> bool:
    """Text under a credential's name that could be one: not a placeholder like "<pad>",
    "[MASK]" or "", which tokenizers and configs keep under such names."""
    stripped = text.strip()
    if len(stripped) < 6 or (stripped[0], stripped[-1]) in (("<", ">"), ("[", "]"), ("{", "}")):
        return False
    return stripped.lower() not in ("none", "null", "changeme", "placeholder", "your-token-here")


__all__ = ["Found", "credential_name", "credential_shape", "find_credential"]


_SECRET_WORDS = {"token", "secret", "password", "passwd", "pwd", "apikey", "credential", "credentials", "passphrase"}
_SECRET_PHRASES = ("api_key", "apikey", "access_key", "private_key", "secret", "password")


def looks_like_credential(name: str, value: Any) -> bool:
    """Names like HF_TOKEN, db_password, OPENAI_API_KEY holding text (numbers never are)."""
    if not isinstance(value, (str, bytes)) and not (
        isinstance(value, dict) and value and all(isinstance(v, (str, bytes)) for v in value.values())
    ):
        return False
    lower = name.lower()
    words = set(re.split(r"[^a-z]+", lower))
    return bool(words & _SECRET_WORDS) or any(p in lower for p in _SECRET_PHRASES)
