"""Each option is declared once, on the field it fills (JobSpec, KubernetesOptions, SlurmOptions,
Launching); the table put together from them is what the magic's flags, launch()'s keywords, the
backends' options and the documentation's table all follow, and nothing declares an option apart."""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path

import pytest
from IPython.core.error import UsageError

from notebook_elastic.backends import options
from notebook_elastic.backends.kubernetes.options import KubernetesOptions, parse_options
from notebook_elastic.backends.slurm.options import SlurmOptions
from notebook_elastic.contract.options import Launching
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
    fields = {f.name: f for f in dataclasses.fields(KubernetesOptions)}
    keywords = set(options.KUBERNETES_KEYWORDS)
    assert keywords == set(fields) - internal
    for o in options.OPTIONS:
        if o.goes_to == "kubernetes" and o.default is not None:
            assert fields[o.keyword].default == o.default, o.keyword  # the default shown is the one used
    # The parse takes exactly the table's keywords: each checked by its declaration, any other refused.
    assert parse_options(**{k: None for k in keywords}) == KubernetesOptions()
    with pytest.raises(SpecError, match=r"got an unknown option worklaod='pods'; did you mean workload=\?"):
        parse_options(worklaod="pods")


def test_each_option_is_a_field_of_the_class_it_fills_in_the_tables_order():
    """The table is the declarations, in their order: the job's, Kubernetes', Slurm's, how to launch."""
    declared = [
        (f.name, part)
        for cls, part in (
            (JobSpec, "spec"),
            (KubernetesOptions, "kubernetes"),
            (SlurmOptions, "slurm"),
            (Launching, "launch"),
        )
        for f in dataclasses.fields(cls)
        if "option" in f.metadata
    ]
    assert [(o.keyword, o.goes_to) for o in options.OPTIONS] == declared
    assert set(options.SLURM_KEYWORDS) == {f.name for f in dataclasses.fields(SlurmOptions)}


def test_a_field_declared_with_option_is_an_option_with_its_flag_default_help_and_check():
    """What a new option needs is its field: the magic's flag, launch()'s keyword, the check and the
    table follow (a field added to the spec here, as a contributor would add one)."""
    from notebook_elastic.contract.options import declared, option
    from notebook_elastic.contract.spec import _restarts

    @dataclasses.dataclass
    class Spec:
        retries: int = option("how many times to retry.", default=2, check=_restarts, metavar="N")

    (new,) = declared(Spec, "spec")
    assert new.flag == "--retries" and new.default == 2 and new.help_text == "how many times to retry. Default 2."
    with pytest.raises(SpecError, match=r"--retries -1 must be 0 or more"):
        new.check(-1, new.flag)


def test_the_spec_options_are_job_spec_fields_with_the_tables_defaults():
    spec_fields = {f.name: f for f in dataclasses.fields(JobSpec)}
    for o in options.OPTIONS:
        if o.goes_to == "spec":
            assert o.keyword in spec_fields, o.keyword
    shown = {o.keyword: o.default for o in options.OPTIONS if o.goes_to == "spec" and o.default is not None}
    spec = JobSpec(**{k: v for k, v in shown.items() if k != "nnodes"}).validated()
    assert spec.max_payload_bytes == 64 * 1024 * 1024 and spec.max_restarts == JobSpec().max_restarts
    # What the table shows as a default is what a spec given nothing holds.
    assert JobSpec(name="x", **shown).validated() == JobSpec(name="x").validated()


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


def test_the_keywords_type_checkers_read_are_the_tables():
    """kernel/launch_options.py (launch()'s keywords for type checkers) is generated from the
    table: an option added, removed or retyped without scripts/gen_options.py fails here."""
    import subprocess
    import sys

    from notebook_elastic.kernel.launch_options import LaunchOptions

    assert list(LaunchOptions.__annotations__) == [o.keyword for o in options.OPTIONS if o.keyword_arg]
    done = subprocess.run(
        [sys.executable, str(README.parent / "scripts" / "gen_options.py"), "--check"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr


USES_OF_LAUNCH = """\
import notebook_elastic as ne

ne.launch("print(1)", nnodes="1:4", nproc_per_node=2, gpus=1, env=["A=1"], tolerations=["spot:NoSchedule"], dry_run=True)
ne.launch("print(1)", nproc_per_nod=2)
ne.launch("print(1)", nnodes=[1, 4])
ne.launch("print(1)", wait=True)
job = ne.attach("toy")
taken: str | None = job.preempt_node(grace_s=30).node
"""


@pytest.mark.slow
def test_a_type_checker_knows_launchs_keywords_and_their_types(tmp_path):
    """A user's type checker (mypy, strict, from the user's own folder) reads notebook_elastic's
    types (py.typed), launch()'s real keywords among them: a misspelt one, a wrong type and one
    of the magic's alone are errors; the rest of the call checks. Red before: the package had no
    py.typed (its types were skipped) and launch took ``**options: Any``."""
    import subprocess
    import sys

    (tmp_path / "use.py").write_text(USES_OF_LAUNCH)
    # torch's own modules are not followed (their types read as Any), as many users' configs
    # have it: what is checked is ours, and following torch's cost the suite 2 minutes of a core.
    # Nor the trackers' libraries, which the supervisor imports where a job logs to them: mlflow
    # and wandb brought 1,800 of the 3,000 modules parsed (55 s wall under load, now 9 s).
    skipped = "[mypy-torch.*,mlflow.*,wandb.*]\nfollow_imports = skip\n"
    (tmp_path / "mypy.ini").write_text("[mypy]\n\n" + skipped)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--no-error-summary",
            "--cache-dir",
            str(tmp_path / "cache"),
            "use.py",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    errors = [line for line in done.stdout.splitlines() if ": error:" in line]
    assert [line.split(":")[1] for line in errors] == ["4", "5", "6"], done.stdout + done.stderr
    assert 'Unexpected keyword argument "nproc_per_nod"' in errors[0] and 'did you mean "nproc_per_node"' in errors[0]
    assert 'Argument "nnodes"' in errors[1] and "str | int | tuple[int, int] | None" in errors[1]
    assert 'Unexpected keyword argument "wait"' in errors[2]
