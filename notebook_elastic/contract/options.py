"""How a launch option is declared: once, as a field of the dataclass it fills (TorchX's
``runopts`` is the model: each option's name, type, default, help and check in one declaration).

``option(help, default=..., check=...)`` is a ``dataclasses.field`` that carries its declaration:
the field's name is ``launch()``'s keyword, its annotation the type it takes, its default the
default, ``check`` turns a value as given (a flag's string, a keyword's value) into the field's or
refuses it with a ``SpecError`` naming the flag. ``declared(cls, ...)`` reads a class's options,
``parse(cls, given)`` makes one from given values. The job's own options are ``JobSpec``'s fields
(contract/spec.py), each backend's its options class' (backends/kubernetes/options.py,
backends/slurm/options.py), how to launch ``Launching``'s below; ``backends/options.py`` puts
them in one table, from which the magic's flags and ``--help``, ``launch()``'s keywords (and
their stub, kernel/launch_options.py, by scripts/gen_options.py) and the documentation's table
(docs/reference/options.md) are derived.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar, overload

from ..errors import SpecError

ALL = ("local", "kubernetes", "slurm")


def unknown_flags(extras: list[str], flags: list[str]) -> str:
    """argparse's 'unrecognized arguments: --tial 5', with the flag probably meant: '; did you
    mean --tail?' (the CLI's subcommands and the magic's flags alike)."""
    said = f"unrecognized arguments: {' '.join(extras)}"
    for extra in extras:
        if extra.startswith("-"):
            close = difflib.get_close_matches(extra.split("=")[0], flags, n=1)
            if close:
                return f"{said}; did you mean {close[0]}?"
    return said


#: Where each backend's own options go (``goes_to``), apart from the job spec.
BACKEND_PARTS = ("kubernetes", "slurm")

T = TypeVar("T")
#: A check: the value as given and the flag that gave it -> the field's value, or a SpecError.
Check = Callable[[Any, str], Any]

_NOT_SHOWN = object()


@dataclass(frozen=True)
class Declared:
    """What a field's ``option()`` says beyond the field itself (kept in its metadata)."""

    help: str
    check: Check | None = None
    flag_name: str | None = None  # the magic's flag when it is not --KEYWORD-WITH-DASHES
    metavar: str | None = None
    repeatable: bool = False  # a flag given several times; a list in launch()
    switch: bool = False  # a flag without a value; True/False in launch()
    shown: object = _NOT_SHOWN  # the default as help and the signature show it (else the field's)
    empty_is_default: bool = False  # an empty value ("") means not given
    magic: bool = True  # a flag of %%elastic_train
    keyword_arg: bool = True  # a keyword of launch()


@overload
def option(
    help: str,
    *,
    default: T,
    check: Check | None = ...,
    flag: str | None = ...,
    metavar: str | None = ...,
    repeatable: bool = ...,
    switch: bool = ...,
    shown: object = ...,
    empty_is_default: bool = ...,
    magic: bool = ...,
    keyword_arg: bool = ...,
) -> T: ...
@overload
def option(
    help: str,
    *,
    default_factory: Callable[[], T],
    check: Check | None = ...,
    flag: str | None = ...,
    metavar: str | None = ...,
    repeatable: bool = ...,
    switch: bool = ...,
    shown: object = ...,
    empty_is_default: bool = ...,
    magic: bool = ...,
    keyword_arg: bool = ...,
) -> T: ...
def option(
    help: str,
    *,
    default: object = dataclasses.MISSING,
    default_factory: Callable[[], object] | None = None,
    check: Check | None = None,
    flag: str | None = None,
    metavar: str | None = None,
    repeatable: bool = False,
    switch: bool = False,
    shown: object = _NOT_SHOWN,
    empty_is_default: bool = False,
    magic: bool = True,
    keyword_arg: bool = True,
) -> object:
    """A dataclass field that is a launch option (see the module's docstring)."""
    declared = Declared(help, check, flag, metavar, repeatable, switch, shown, empty_is_default, magic, keyword_arg)
    metadata = {"option": declared}
    if default_factory is not None:
        return dataclasses.field(default_factory=default_factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


@dataclass(frozen=True)
class Option:
    """One launch option as the surfaces see it, read from its field's declaration."""

    keyword: str  # launch()'s keyword, and the field it fills
    help: str
    default: Any = None  # as shown (help, launch()'s signature); None: not given (the field's own default applies)
    flag_name: str | None = None
    backends: tuple[str, ...] = ALL
    repeatable: bool = False
    switch: bool = False
    metavar: str | None = None
    goes_to: str = "spec"  # "spec" | "kubernetes" | "slurm" | "launch" (how to launch, not what)
    magic: bool = True
    keyword_arg: bool = True
    check: Check | None = None
    empty_is_default: bool = False
    annotation: str = "Any"  # the field's type, as written in its class

    @property
    def flag(self) -> str:
        return self.flag_name or "--" + self.keyword.replace("_", "-")

    @property
    def help_text(self) -> str:
        scope = f"{self.backends[0]}: " if len(self.backends) == 1 else ""
        default = f" Default {self.default}." if self.default not in (None, False) and not self.repeatable else ""
        return f"{scope}{self.help}{default}"


def _shown(field: dataclasses.Field[Any], declared: Declared) -> object:
    if declared.shown is not _NOT_SHOWN:
        return declared.shown
    default = field.default
    # A default the flag's text would write as is; a list, a tuple or a made one shows none.
    return default if isinstance(default, (str, int, float)) and not isinstance(default, bool) else None


def declared(cls: type[Any], goes_to: str, backends: tuple[str, ...] = ALL) -> tuple[Option, ...]:
    """The options declared on ``cls``'s fields, in field order (fields without ``option()`` are
    the class's own, set by us, not by a flag)."""
    out = []
    for field in dataclasses.fields(cls):
        d = field.metadata.get("option")
        if not isinstance(d, Declared):
            continue
        out.append(
            Option(
                keyword=field.name,
                help=d.help,
                default=_shown(field, d),
                flag_name=d.flag_name,
                backends=backends,
                repeatable=d.repeatable,
                switch=d.switch,
                metavar=d.metavar,
                goes_to=goes_to,
                magic=d.magic,
                keyword_arg=d.keyword_arg,
                check=d.check,
                empty_is_default=d.empty_is_default,
                annotation=str(field.type),
            )
        )
    return tuple(out)


def given(values: Mapping[str, Any]) -> dict[str, Any]:
    """The options actually given (not None, not an empty list, not a False switch)."""
    return {k: v for k, v in values.items() if v is not None and v != [] and v is not False}


def checked(option: Option, value: Any) -> Any:
    """``value`` through ``option``'s check (as it is without one)."""
    return option.check(value, option.flag) if option.check is not None else value


D = TypeVar("D")


def parse(cls: type[D], values: Mapping[str, Any], *, what: str = "") -> D:
    """A ``cls`` from the given ``values`` (its options' keywords): each checked by its
    declaration (a ``SpecError`` on the first bad one, in declaration order); one not given, or
    given as None, takes the field's default; an unknown keyword is refused naming the nearest."""
    options = declared(cls, "")
    known = {o.keyword: o for o in options}
    for key, value in values.items():
        if key not in known:
            near = difflib.get_close_matches(key, known, n=1)
            hint = f"; did you mean {near[0]}=?" if near else f" (known: {', '.join(known)})"
            raise SpecError(f"{what or cls.__name__} got an unknown option {key}={value!r}{hint}")
    out: dict[str, Any] = {}
    for o in options:
        value = values.get(o.keyword)
        if value is None or (o.empty_is_default and value == ""):
            continue
        out[o.keyword] = checked(o, value)
    return cls(**out)


@dataclass(frozen=True)
class Launching:
    """How to launch, not what (``launch()``'s and the magic's own; never stored with the job)."""

    dry_run: bool = option(
        "print what would be launched (manifest, plan, script); launch nothing.", default=False, switch=True
    )
    fresh: bool = option(
        "start over even if a stopped, failed or lost job of this name could be resumed "
        "(its run moves to the history).",
        default=False,
        switch=True,
    )
    resume: bool | None = option(
        "True: insist on resuming the job of this name; None: resume when the code is the same.",
        default=None,
        magic=False,
    )
    export: str | None = option(
        "write the script to PATH and its payload beside it; launch nothing.",
        default=None,
        metavar="PATH",
        keyword_arg=False,
    )
    wait: bool = option("block until the job finishes.", default=False, switch=True, keyword_arg=False)


LAUNCH_OPTIONS = declared(Launching, "launch")
