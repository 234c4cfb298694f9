"""Every launch option in one table, put together from where each is declared (contract/options.py
says how): the job's own (``JobSpec``'s fields), each backend's (``KubernetesOptions``',
``SlurmOptions``'), how to launch (``Launching``'s).

The magic's flags and ``--help``, ``launch()``'s keywords (its signature, and the stub type
checkers read: kernel/launch_options.py, written by scripts/gen_options.py), the split of given
values into the spec and each backend's options, and the documentation's option table
(docs/reference/options.md) all follow ``OPTIONS``; nothing declares an option apart.
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable, Mapping
from typing import Any

from ..contract.options import ALL, BACKEND_PARTS, LAUNCH_OPTIONS, Option, given
from ..contract.spec import SPEC_OPTIONS
from ..errors import SpecError
from .kubernetes.options import OPTIONS as KUBERNETES_OPTIONS
from .kubernetes.options import KubernetesOptions
from .slurm.options import OPTIONS as SLURM_OPTIONS
from .slurm.options import SlurmOptions

__all__ = [
    "OPTIONS",
    "BY_KEYWORD",
    "given",
    "split",
    "spec_given",
    "backend_options",
    "signature",
    "argparse_arguments",
    "markdown_table",
]

OPTIONS: tuple[Option, ...] = (*SPEC_OPTIONS, *KUBERNETES_OPTIONS, *SLURM_OPTIONS, *LAUNCH_OPTIONS)
BY_KEYWORD = {o.keyword: o for o in OPTIONS}
KUBERNETES_KEYWORDS = tuple(o.keyword for o in KUBERNETES_OPTIONS)
SLURM_KEYWORDS = tuple(o.keyword for o in SLURM_OPTIONS)

#: Each backend's options: the values given -> validated, as stored in the spec's backend_options.
PARSE: dict[str, Callable[[Mapping[str, Any]], KubernetesOptions | SlurmOptions]] = {
    "kubernetes": KubernetesOptions.parse,
    "slurm": SlurmOptions.parse,
}


def spec_given(values: Mapping[str, Any]) -> dict[str, Any]:
    """The job spec's options given in ``values``: those not None, nor empty where an empty
    one means the default (``JobSpec.validated`` checks them, each by its declaration)."""
    return {
        key: value
        for key, value in values.items()
        if value is not None and not (BY_KEYWORD[key].empty_is_default and value == "")
    }


def backend_options(backend: str, per_backend: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """``{backend: its options, validated, as JSON}`` for the backend the job runs on (nothing
    for the local one); a ``SpecError`` on a bad one, or on one given for another backend."""
    out: dict[str, Any] = {}
    for part, values in per_backend.items():
        picked = {k: v for k, v in values.items() if v is not None and v != []}
        if picked and part != backend:
            raise SpecError(f"{', '.join(sorted(picked))} only apply with backend='{part}'")
        if part == backend:
            out[part] = PARSE[part](picked).to_json()
    return out


def signature(function: Callable[..., Any]) -> inspect.Signature:
    """``function``'s signature with its ``**options`` spelled out from the table, so that
    help(), Shift-Tab and IDEs list every keyword of ``launch()``."""
    params = [p for p in inspect.signature(function).parameters.values() if p.kind is not p.VAR_KEYWORD]
    taken = {p.name for p in params}
    params += [
        inspect.Parameter(o.keyword, inspect.Parameter.KEYWORD_ONLY, default=False if o.switch else o.default)
        for o in OPTIONS
        if o.keyword_arg and o.keyword not in taken
    ]
    return inspect.signature(function).replace(parameters=params)


def argparse_arguments() -> list[tuple[Option, tuple[str, ...], dict[str, Any]]]:
    """``(option, args, kwargs)`` for each flag of ``%%elastic_train``, in table order. Every value
    defaults to None (or [] / False): what was not given is not passed on, so the table's
    and the spec's defaults apply once, in one place."""
    out: list[tuple[Option, tuple[str, ...], dict[str, Any]]] = []
    for o in OPTIONS:
        if not o.magic:
            continue
        kwargs: dict[str, Any] = {"dest": o.keyword, "help": o.help_text}
        if o.switch:
            kwargs["action"] = "store_true"
        elif o.repeatable:
            kwargs.update(action="append", default=[], help=o.help_text + " Repeatable.")
        else:
            kwargs["default"] = None
        if o.metavar and not o.switch:
            kwargs["metavar"] = o.metavar
        out.append((o, (o.flag,), kwargs))
    return out


def split(
    options: Mapping[str, Any], *, surface: str = "launch()"
) -> tuple[dict[str, Any], dict[str, dict[str, Any]], dict[str, Any]]:
    """``(spec keywords, {backend: its keywords}, launch keywords)`` of the given options, or a
    ``SpecError`` naming an unknown one and the nearest known."""
    parts: dict[str, dict[str, Any]] = {"spec": {}, "launch": {}, **{b: {} for b in BACKEND_PARTS}}
    for key, value in options.items():
        option = BY_KEYWORD.get(key)
        if option is None or (surface == "launch()" and not option.keyword_arg):
            near = difflib.get_close_matches(key, [o.keyword for o in OPTIONS if o.keyword_arg], n=1)
            hint = f"; did you mean {near[0]}=?" if near else f" (known: {', '.join(BY_KEYWORD)})"
            raise SpecError(f"{surface} got an unknown option {key}={value!r}{hint}")
        parts[option.goes_to][key] = value
    return parts["spec"], {b: parts[b] for b in BACKEND_PARTS}, parts["launch"]


def markdown_table() -> str:
    """The documentation's option table (put into docs/reference/options.md as the site is built)."""
    rows = ["| flag | `launch()` keyword | backends | what it does |", "|---|---|---|---|"]
    for o in OPTIONS:
        flag = f"`{o.flag}{' ' + o.metavar if o.metavar and not o.switch else ''}`" if o.magic else "—"
        keyword = f"`{o.keyword}=`" if o.keyword_arg else "—"
        backends = "all" if o.backends == ALL else ", ".join(o.backends)
        rows.append(f"| {flag} | {keyword} | {backends} | {o.help_text} |")
    return "\n".join(rows)


if __name__ == "__main__":  # python -m notebook_elastic.backends.options: the table, as the docs show it
    print(markdown_table())
