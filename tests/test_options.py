"""The option table is the one declaration: the magic's flags, launch()'s keywords, the
Kubernetes options and the documentation's table all follow it, and nothing declares an option apart."""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path

import pytest
from IPython.core.error import UsageError

from notebook_elastic.backends.kubernetes.options import KubernetesOptions, parse_options
from notebook_elastic.contract import options
from notebook_elastic.contract.spec import JobSpec
from notebook_elastic.errors import SpecError
from notebook_elastic.kernel.launcher import launch
from notebook_elastic.kernel.magics import ElasticMagics

README = Path(__file__).resolve().parents[1] / "README.md"


def magic_parser():
    return ElasticMagics.elastic_train.parser


def test_the_magic_has_exactly_the_tables_flags_and_says_each_in_help():
    actions = [a for a in magic_parser()._actions if a.dest != "help"]
    assert [a.option_strings[0] for a in actions] == [o.flag for o in options.OPTIONS if o.magic]
    text = magic_parser().format_help()
    for o in options.OPTIONS:
        if o.magic:
            assert o.flag in text, o.flag
    assert "Kubernetes (with --backend kubernetes)" in text and "launching" in text


def test_launch_lists_every_keyword_and_refuses_an_unknown_one_with_the_nearest():
    params = inspect.signature(launch).parameters
    for o in options.OPTIONS:
        assert (o.keyword in params) == o.keyword_arg, o.keyword
    assert params["max_restarts"].default == options.BY_KEYWORD["max_restarts"].default
    with pytest.raises(
        SpecError, match=r"launch\(\) got an unknown option nproc_per_nod=2; did you mean nproc_per_node=\?"
    ):
        launch("print(1)", nproc_per_nod=2, user_ns={})
    with pytest.raises(SpecError, match=r"unknown option wait=True"):  # the magic's, not launch()'s
        launch("print(1)", wait=True, user_ns={})


def test_the_kubernetes_options_are_the_tables():
    internal = {"ttl_seconds_after_finished", "rdzv_port", "grace_given"}  # set by us, not flags
    fields = {f.name for f in dataclasses.fields(KubernetesOptions)} - internal
    keywords = set(options.KUBERNETES_KEYWORDS)
    assert keywords == fields == set(inspect.signature(parse_options).parameters)
    for o in options.OPTIONS:
        if o.goes_to == "kubernetes" and o.default is not None:
            assert inspect.signature(parse_options).parameters[o.keyword].default == o.default, o.keyword


def test_the_spec_options_are_job_spec_fields_with_the_tables_defaults():
    spec_fields = {f.name: f for f in dataclasses.fields(JobSpec)}
    for o in options.OPTIONS:
        if o.goes_to == "spec":
            assert o.keyword in spec_fields, o.keyword
    spec = JobSpec(**{k: v for k, v in options.spec_defaults().items() if k != "nnodes"}).validated()
    assert spec.max_payload_bytes == 64 * 1024 * 1024 and spec.max_restarts == JobSpec().max_restarts


def test_kubernetes_options_on_the_local_backend_are_refused_before_anything(shell, home):
    with pytest.raises(UsageError, match=r"pvc only apply with backend='kubernetes'"):
        shell.run_cell_magic("elastic_train", "--pvc data", "print(1)\n")
    assert not list(home.glob("*/*"))


def test_the_documentation_shows_the_table_as_generated():
    """docs/reference/options.md holds the mark its build hook fills with the generated table."""
    import importlib.util

    page = (README.parent / "docs" / "reference" / "options.md").read_text()
    assert "<!-- options -->" in page, "the options page lost its mark"
    spec = importlib.util.spec_from_file_location("docs_hooks", README.parent / "docs" / "hooks.py")
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    built = hooks.on_page_markdown(page, None, None, None)
    assert options.markdown_table() in built and "<!-- options -->" not in built
    assert "| `--queue NAME` | `queue=` | kubernetes |" in built
    events = hooks.on_page_markdown("<!-- events -->", None, None, None)
    assert "| `queue` | `queue`, `state` |" in events, events[:400]
