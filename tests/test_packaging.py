"""Packaging a cell from a real IPython shell, then running the script in a fresh Python.

Each test runs notebook cells through a real InteractiveShell (history, linecache, the
namespace exactly as in a kernel), packages a training cell, writes the script and its
payload to disk and executes it in a new interpreter, checking what it prints.
"""

from __future__ import annotations

import json
import re

import pytest
from conftest import python, run_cells, torchrun

from notebook_elastic.errors import PackagingError
from notebook_elastic.packaging import NotebookContext, analysis, package_cell
from notebook_elastic.packaging.render import human_bytes


def build(shell, cell: str, **kwargs):
    ctx = NotebookContext.from_shell(shell)
    kwargs.setdefault("extra_import_paths", [ctx.cwd])
    return package_cell(cell, ctx, name="t", **kwargs)


def run_script(bundle, tmp_path, *, env=None, name="train.py"):
    folder = tmp_path / "out"
    folder.mkdir(exist_ok=True)
    script, _payload = bundle.write(folder / name)
    done = python(str(script), cwd=folder, env=env)
    assert done.returncode == 0, f"script failed:\n{bundle.script}\n--- stderr:\n{done.stderr}"
    return [line for line in done.stdout.splitlines() if not line.startswith("@@elastic")]


def kinds(bundle) -> dict[str, str]:
    return {item.name: item.kind for item in bundle.manifest.items}


def test_helpers_calling_helpers_config_and_imports_follow_transitively(shell, tmp_path):
    run_cells(
        shell,
        "import numpy as np",
        "CFG = {'n': 3, 'scale': 2.0}",
        "def make_batch(n):\n    return np.arange(n) * CFG['scale']",
        "def train_step(step):\n    return float(make_batch(CFG['n']).sum()) + step",
    )
    bundle = build(shell, "for step in range(2):\n    print('loss', train_step(step))")
    assert kinds(bundle) == {"train_step": "function", "make_batch": "function", "CFG": "value", "np": "import"}
    assert "import numpy as np" in bundle.script
    assert run_script(bundle, tmp_path) == ["loss 6.0", "loss 7.0"]
    # Readable: the cell body sits inside main(), the definitions are their own source.
    assert "def main():\n    for step in range(2):" in bundle.script
    assert "def make_batch(n):\n    return np.arange(n) * CFG['scale']" in bundle.script


def test_nn_module_subclasses_and_their_methods_dependencies(shell, tmp_path):
    run_cells(
        shell,
        "import torch\nfrom torch import nn\nimport torch.nn.functional as F",
        "HIDDEN = 5\ndef activation(x):\n    return F.relu(x)",
        "class Base(nn.Module):\n    def __init__(self):\n        super().__init__()\n        self.inp = nn.Linear(3, HIDDEN)",
        "class Net(Base):\n    def forward(self, x):\n        return activation(self.inp(x)).sum(-1)",
    )
    bundle = build(
        shell,
        "torch.manual_seed(0)\nm = Net()\nprint(type(m).__name__, isinstance(m, Base), m(torch.ones(2, 3)).shape)",
    )
    k = kinds(bundle)
    assert k["Net"] == k["Base"] == "class" and k["activation"] == "function" and k["F"] == "import"
    assert bundle.script.index("class Base(nn.Module)") < bundle.script.index("class Net(Base)")
    assert run_script(bundle, tmp_path) == ["Net True torch.Size([2])"]


def test_decorators_are_shipped_with_the_function(shell, tmp_path):
    run_cells(
        shell,
        "import functools",
        "def twice(f):\n    @functools.wraps(f)\n    def inner(*a):\n        return 2 * f(*a)\n    return inner",
        "@twice\ndef base(x):\n    return x + 1",
        "@functools.lru_cache(maxsize=None)\ndef fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)",
    )
    bundle = build(shell, "print(base(1), fib(20))")
    assert "@twice\ndef base(x):" in bundle.script
    assert "@functools.lru_cache(maxsize=None)\ndef fib(n):" in bundle.script
    assert run_script(bundle, tmp_path) == ["4 6765"]


def test_a_helper_that_sets_up_the_process_group_uses_the_one_the_runtime_makes(shell):
    """The PyTorch tutorials call init_process_group() in a ddp_setup() helper of another cell:
    the runtime sets the group up with the backend it names, and the call uses that group (so
    a change keeps the workers in place). A call the group cannot stand for (a backend from a
    variable, its own init_method) is left to make its own."""
    run_cells(
        shell,
        "from torch.distributed import init_process_group, destroy_process_group",
        "def ddp_setup():\n    init_process_group(backend='gloo')",
        "def ddp_setup_unnamed():\n    init_process_group()",
        "def ddp_setup_chosen(backend):\n    init_process_group(backend)",
        "def ddp_setup_own():\n    init_process_group('gloo', init_method='tcp://10.0.0.1:1234')",
        "def report_world():\n    return 1",
    )

    def ending(cell: str) -> str:
        return build(shell, cell).script.rstrip().splitlines()[-1].strip()

    assert ending("ddp_setup()\ndestroy_process_group()") == "_elastic.run(main, backend='gloo')"
    assert ending("ddp_setup_unnamed()") == "_elastic.run(main)"
    assert ending("ddp_setup_chosen('gloo')") == "_elastic.run(main, init_process_group=False)"
    assert ending("ddp_setup_own()") == "_elastic.run(main, init_process_group=False)"
    assert ending("ddp_setup()\ninit_process_group('nccl')") == "_elastic.run(main, init_process_group=False)"
    assert ending("print(report_world())") == "_elastic.run(main)"


def test_import_forms_star_imports_and_imports_among_other_code(shell, tmp_path):
    run_cells(
        shell,
        "x = 1\nimport os.path\nimport xml.etree.ElementTree as ET\nfrom math import sqrt as root\ny = 2",
        "try:\n    import json as js\nexcept ImportError:\n    js = None",
        "from math import *",
    )
    bundle = build(
        shell, "print(root(16), floor(2.5), os.path.basename('/a/b'), ET.fromstring('<a/>').tag, js.dumps(1))"
    )
    script = bundle.script
    for statement in (
        "from math import sqrt as root",
        "import xml.etree.ElementTree as ET",
        "import os.path",
        "import json as js",
    ):
        assert statement in script
    assert "from math import floor" in script  # explicit, not the star
    assert any("star import" in w for w in bundle.manifest.warnings)
    assert run_script(bundle, tmp_path) == ["4.0 2 b a 1"]


def test_data_values_go_to_the_payload(shell, tmp_path):
    run_cells(
        shell,
        "import torch\nfrom torch.utils.data import TensorDataset",
        "cfg = {'lr': 0.5, 'layers': [1, 2]}\nsizes = [3, 4]\nn = 7\nlabel = 'hello'",
        "t = torch.arange(6.).reshape(2, 3)\nds = TensorDataset(torch.arange(4.), torch.arange(4) % 2)",
    )
    bundle = build(shell, "print(cfg['lr'], sum(sizes), n, label, t.sum().item(), len(ds), ds[3][1].item())")
    assert {k: v for k, v in kinds(bundle).items() if v == "value"} == dict.fromkeys(
        ["cfg", "sizes", "n", "label", "t", "ds"], "value"
    )
    assert bundle.manifest.payload_bytes > 0
    assert run_script(bundle, tmp_path) == ["0.5 7 7 hello 15.0 4 1"]


def test_lambdas_closures_and_exec_defined_functions_go_by_value(shell, tmp_path):
    run_cells(
        shell,
        "OFFSET = 10",
        "square = lambda x: x * x + OFFSET",
        "def make_scaler(k):\n    def scale(x):\n        return k * x\n    return scale\ntriple = make_scaler(3)",
        "exec('def hidden(x):\\n    return x - 1')",
    )
    bundle = build(shell, "print(square(2), triple(5), hidden(1))")
    notes = {i.name: i.note for i in bundle.manifest.items}
    assert kinds(bundle)["square"] == kinds(bundle)["triple"] == kinds(bundle)["hidden"] == "function-by-value"
    assert "lambda" in notes["square"] and "closure" in notes["triple"] and "source is gone" in notes["hidden"]
    assert run_script(bundle, tmp_path) == ["14 15 0"]


def test_the_current_definition_wins_and_aliases_follow(shell, tmp_path):
    run_cells(
        shell,
        "def lr_for(step):\n    return 1.0",
        "print(lr_for(0))",
        "def lr_for(step):\n    return 0.1 / (step + 1)",
        "schedule = lr_for",
    )
    bundle = build(shell, "print(schedule(1))")
    assert bundle.script.count("def lr_for") == 1 and "return 0.1 / (step + 1)" in bundle.script
    assert "schedule = lr_for" in bundle.script
    assert run_script(bundle, tmp_path) == ["0.05"]


def test_magic_and_shell_lines_in_earlier_cells_are_left_out(shell, tmp_path):
    run_cells(
        shell,
        "%time z = 3\nimport math\n!true\ndef area(r):\n    return math.pi * r * r",
        "%%capture\nprint('hidden')",
    )
    bundle = build(shell, "print(round(area(1), 2))")
    assert "get_ipython" not in bundle.script and "%time" not in bundle.script
    assert run_script(bundle, tmp_path) == ["3.14"]


def test_magic_lines_in_the_training_cell_are_refused(shell):
    with pytest.raises(PackagingError, match=r"line 2 of the cell \('%time x = 1'\) is IPython syntax"):
        build(shell, "a = 1\n%time x = 1\n")
    with pytest.raises(PackagingError, match="is IPython syntax"):
        build(shell, "!nvidia-smi")


def test_names_assigned_by_the_cell_stay_module_level(shell, tmp_path):
    run_cells(
        shell,
        "lr = 0.4",
        "def current_lr():\n    return lr\ndef uses_model():\n    return model * 10",
    )
    bundle = build(shell, "lr = lr / 2\nmodel = 3\nprint(current_lr(), uses_model())")
    assert "global lr, model" in bundle.script
    assert run_script(bundle, tmp_path) == ["0.2 30"]


def test_instances_of_notebook_classes_keep_their_class(shell, tmp_path):
    run_cells(
        shell,
        "class Config:\n    def __init__(self, depth):\n        self.depth = depth\n    def deeper(self):\n        return self.depth + 1",
        "conf = Config(4)\nregistry = {'make': Config}",
    )
    bundle = build(shell, "print(conf.deeper(), isinstance(conf, Config), registry['make'] is Config)")
    late = {i.name for i in bundle.manifest.items if i.late}
    assert {"conf", "registry"} <= late  # unpickled after `class Config` is defined
    assert bundle.script.index("class Config") < bundle.script.index('conf = _payload["conf"]')
    assert run_script(bundle, tmp_path) == ["5 True True"]


def test_values_that_share_objects_stay_shared_in_the_worker(shell, tmp_path):
    """A model and an optimizer built in the notebook over its parameters: the optimizer must
    step the shipped model, not a copy of its parameters."""
    run_cells(
        shell,
        "import torch",
        "class Net(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n        self.fc = torch.nn.Linear(2, 1)",
        "net = Net()\nopt = torch.optim.SGD(net.parameters(), lr=1.0)\nlog = []\nalias = log\nsteps = [1, 2]",
    )
    bundle = build(
        shell,
        "before = net.fc.weight.detach().clone()\n"
        "net.fc(torch.ones(1, 2)).sum().backward()\nopt.step()\nlog.append(1)\n"
        "print(bool((net.fc.weight != before).all()), alias, len(steps))",
    )
    notes = {i.name: i.note for i in bundle.manifest.items}
    assert "shipped with `opt` (they share objects)" in notes["net"]
    assert "shipped with `net`" in notes["opt"] and "`log`" in notes["alias"]
    assert "shared" not in notes["steps"]  # alone as before
    assert run_script(bundle, tmp_path) == ["True [1] 2"]


def test_a_class_only_used_through_a_value_is_shipped_too(shell, tmp_path):
    run_cells(shell, "class Box:\n    def __init__(self, v):\n        self.v = v", "b = Box(9)")
    bundle = build(shell, "print(b.v, type(b).__name__)")
    assert kinds(bundle)["Box"] == "class"
    assert run_script(bundle, tmp_path) == ["9 Box"]


def test_multiline_strings_in_the_cell_are_kept_exactly(shell, tmp_path):
    bundle = build(shell, 'text = """line one\n  line two\nline three"""\nprint(repr(text))')
    assert run_script(bundle, tmp_path) == [repr("line one\n  line two\nline three")]


def test_local_module_beside_the_notebook_works(shell, tmp_path, monkeypatch):
    (tmp_path / "mylib.py").write_text("def answer():\n    return 42\n")
    monkeypatch.syspath_prepend(str(tmp_path))  # a kernel has its folder on sys.path
    run_cells(shell, "import mylib")
    bundle = build(shell, "print(mylib.answer())")
    out = run_script(bundle, tmp_path, env={"PYTHONPATH": str(tmp_path)})
    assert out == ["42"]


def test_module_off_the_workers_path_is_refused(shell, tmp_path):
    hidden = tmp_path / "elsewhere"
    hidden.mkdir()
    (hidden / "secretlib.py").write_text("VALUE = 1\n")
    run_cells(shell, f"import sys\nsys.path.append({str(hidden)!r})", "import secretlib")
    with pytest.raises(
        PackagingError,
        match=r"module `secretlib` \(imported as `secretlib` in cell \[2\]\) cannot be imported by a fresh Python",
    ):
        build(shell, "print(secretlib.VALUE)")


def test_undefined_name_is_refused_with_its_line(shell):
    with pytest.raises(PackagingError, match=r"name `train_stpe` is used by the cell \(line 2\) but is not defined"):
        build(shell, "x = 1\ntrain_stpe(x)")


def test_undefined_name_inside_a_helper_names_the_helper(shell):
    run_cells(shell, "def helper():\n    return missing_thing + 1")
    with pytest.raises(PackagingError, match=r"name `missing_thing` is used by function `helper`"):
        build(shell, "helper()")


@pytest.mark.parametrize(
    "setup, name, why",
    [
        ("f = open(__file__ if '__file__' in dir() else '/etc/hostname')", "f", "an open file"),
        ("import socket\nsock = socket.socket()", "sock", "a network socket"),
        ("import threading\nlock = threading.Lock()", "lock", "a lock: .*; make it inside the training cell instead"),
        ("gen = (i for i in range(3))", "gen", "a generator"),
        ("import threading\nstate = {'lock': threading.RLock()}", "state", "RLock"),
    ],
)
def test_unpicklable_values_are_refused_naming_variable_cell_and_reason(shell, setup, name, why):
    run_cells(shell, "x = 0", setup)
    with pytest.raises(PackagingError) as info:
        build(shell, f"print({name})")
    message = str(info.value)
    assert f"`{name}`" in message and "cell [2]" in message and re.search(why, message) and "\n" not in message


def test_cuda_tensors_are_refused(shell):
    import torch

    class LooksLikeCuda(torch.Tensor):  # there is no GPU here; the check reads .is_cuda
        @property
        def is_cuda(self):
            return True

    shell.user_ns["weights"] = torch.zeros(2).as_subclass(LooksLikeCuda)
    shell.user_ns["nested"] = {"w": shell.user_ns["weights"]}
    with pytest.raises(PackagingError, match=r"`weights` .*a CUDA tensor.*\.cpu\(\)"):
        build(shell, "print(weights)")
    with pytest.raises(PackagingError, match=r"`nested` .*CUDA tensor"):
        build(shell, "print(nested)")


def test_payload_over_the_limit_names_the_biggest_values(shell):
    run_cells(shell, "import torch\nbig = torch.zeros(300_000)\nsmall = torch.zeros(10)\nmid = torch.zeros(50_000)")
    with pytest.raises(
        PackagingError,
        match=r"payload is 1\.3 MiB, over the 1\.0 MiB limit; the biggest values are `big` \(1\.1 MiB, cell \[1\]\), `mid`",
    ):
        build(shell, "print(big.sum(), small.sum(), mid.sum())", max_payload_bytes=1024 * 1024)


def test_credentials_are_withheld_and_read_from_the_environment(shell, tmp_path):
    run_cells(shell, "HF_TOKEN = 'hf_secret_value'\nmax_tokens = 128\ntokenizer = {'a': 1}")
    bundle = build(shell, "print(HF_TOKEN[:3], max_tokens, tokenizer['a'])")
    assert bundle.withheld == ["HF_TOKEN"]
    assert b"hf_secret_value" not in bundle.payload and "hf_secret_value" not in bundle.script
    assert "withheld" in bundle.manifest.format() and "HF_TOKEN" in bundle.manifest.format()
    assert run_script(bundle, tmp_path, env={"HF_TOKEN": "hf_from_env"}) == ["hf_ 128 1"]
    shipped = build(shell, "print(HF_TOKEN[:3])", ship=["HF_TOKEN"])
    assert shipped.withheld == [] and b"hf_secret_value" in shipped.payload


def test_a_lambda_that_captures_a_credential_is_refused(shell):
    run_cells(shell, "API_KEY = 'k-123'", "auth = lambda: API_KEY")
    with pytest.raises(PackagingError, match=r"`auth` is shipped by value .* refers to `API_KEY`"):
        build(shell, "auth()")


def test_environment_variables_are_never_shipped(shell, tmp_path, monkeypatch):
    monkeypatch.setenv("MY_DB_URL", "postgres://user:pw@host/db")
    run_cells(shell, "import os")
    bundle = build(shell, "print(os.environ.get('MY_DB_URL', 'unset'))")
    assert "postgres://" not in bundle.script and b"postgres://" not in bundle.payload
    assert run_script(bundle, tmp_path, env={"MY_DB_URL": ""}) == [""]
    assert "environment variables: never shipped" in bundle.manifest.format()


def test_ipython_only_names_are_refused(shell):
    with pytest.raises(PackagingError, match=r"`display` .* provided by IPython .* use print\(\)"):
        build(shell, "display(1)")
    run_cells(shell, "1 + 1")
    with pytest.raises(PackagingError, match=r"`Out` .* provided by IPython .*output history"):
        build(shell, "print(Out)")
    with pytest.raises(PackagingError, match=r"`get_ipython` .* no IPython shell in a worker"):
        build(shell, "get_ipython()")


def test_the_shells_own_open_and_exit_resolve_to_the_workers_builtins(shell, tmp_path):
    # IPython puts its own `open` (and `exit`, `quit`) in the namespace; a helper that appends to
    # a log file, as PyTorch's tutorials do, must ship as written and open a real file.
    assert shell.user_ns["open"] is not open and "open" in shell.user_ns_hidden
    run_cells(
        shell,
        "def log_line(path, text):\n    with open(path, 'a') as f:\n        print(text, file=f)\n    return text",
    )
    log = tmp_path / "train_log.csv"
    bundle = build(shell, f"log_line({str(log)!r}, 'step,loss')\nprint(open({str(log)!r}).read().strip())")
    assert "open" not in {i.name for i in bundle.manifest.items}
    assert run_script(bundle, tmp_path) == ["step,loss"]
    assert log.read_text() == "step,loss\n"


def test_empty_and_unparsable_cells_are_refused(shell):
    with pytest.raises(PackagingError, match="the cell is empty"):
        build(shell, "   \n\n")
    with pytest.raises(PackagingError, match=r"the cell does not parse: line 2"):
        build(shell, "x = 1\nfor i in range(3)\n    pass")


def test_manifest_lists_sources_and_sizes(shell):
    run_cells(shell, "import torch", "w = torch.zeros(1000)", "def f():\n    return w.sum()")
    bundle = build(shell, "print(f())")
    table = bundle.manifest.format()
    rows = {r[0]: r for r in (re.split(r"\s{2,}", line.strip()) for line in table.splitlines()[2:])}
    w = next(i for i in bundle.manifest.items if i.name == "w")
    assert 4000 <= w.size < 5000  # 1000 float32s, pickled
    assert rows["w"] == ["w", "value", "cell [2]", human_bytes(w.size), "Tensor[float32, 1000]"], table
    assert rows["f"] == ["f", "function", "cell [3]", "def f()"], table
    data = bundle.manifest.to_json()
    assert json.loads(json.dumps(data))["payload_bytes"] == bundle.manifest.payload_bytes


@pytest.mark.slow
def test_ddp_cell_runs_under_plain_torchrun(shell, tmp_path):
    run_cells(
        shell,
        "import torch\nimport torch.distributed as dist\nfrom torch.nn.parallel import DistributedDataParallel as DDP",
        "data = torch.arange(16.).reshape(8, 2)",
        "def make_model():\n    torch.manual_seed(0)\n    return torch.nn.Linear(2, 1)",
    )
    cell = (
        "model = DDP(make_model())\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.01)\n"
        "for step in range(3):\n"
        "    shard = data[dist.get_rank()::dist.get_world_size()]\n"
        "    loss = model(shard).pow(2).mean()\n"
        "    opt.zero_grad(); loss.backward(); opt.step()\n"
        "w = model.module.weight.detach().clone()\n"
        "dist.all_reduce(w)\n"
        "print(f'rank {dist.get_rank()} of {dist.get_world_size()} same={torch.allclose(w / 2, model.module.weight)}')\n"
    )
    bundle = build(shell, cell)
    folder = tmp_path / "ddp"
    folder.mkdir()
    script, _ = bundle.write(folder / "train.py")
    done = torchrun("--standalone", "--nproc-per-node", "2", str(script), cwd=folder)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = sorted(line for line in done.stdout.splitlines() if line.startswith("rank"))
    assert lines == ["rank 0 of 2 same=True", "rank 1 of 2 same=True"]
    started = [json.loads(line.split(" ", 1)[1]) for line in done.stdout.splitlines() if line.startswith("@@elastic ")]
    assert sorted(e["rank"] for e in started if e["kind"] == "worker_started") == [0, 1]


def test_the_runtime_imports_nothing_from_the_notebook_side():
    done = python(
        "-c",
        "import sys, notebook_elastic.runtime, notebook_elastic.agent.run;"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('IPython', 'ipywidgets', 'kubernetes', 'ipykernel')];"
        "print(bad)",
        cwd=__import__("pathlib").Path("/"),
    )
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stdout + done.stderr


def test_a_notebook_main_of_its_own_is_not_hidden_by_the_cells_wrapper(shell, tmp_path):
    """Tutorials define `def main(rank, world_size, ...)` and call it from the last cell."""
    run_cells(shell, "def main(rank, world_size, epochs=1):\n    return rank + world_size + epochs")
    bundle = build(shell, "print(main(0, 2, epochs=3))")
    assert "def training_cell():" in bundle.script and "_elastic.run(training_cell)" in bundle.script
    assert run_script(bundle, tmp_path) == ["5"]
    cell_main = build(shell, "def main():\n    return 7\nprint(main())")
    assert "def training_cell():" in cell_main.script
    assert run_script(cell_main, tmp_path) == ["7"]
    assert "def main():" in build(shell, "print(1)").script  # the readable default otherwise


# -- the name analysis, pure (no shell, no process): what decides what is shipped ---------
# Named test_analysis_* so mutmut can run them alone against packaging/analysis.py.


def free(source: str) -> dict[str, int]:
    return analysis.cell_names(source).free


def test_analysis_a_name_read_before_the_cell_binds_it_comes_from_the_notebook():
    assert free("lr = lr * 2") == {"lr": 1}
    assert free("model = Net()\nmodel.train()") == {"Net": 2 - 1}
    assert free("x += step\nprint(x)") == {"x": 1, "step": 1, "print": 2}
    assert free("obj.count += 1") == {"obj": 1}
    assert free("a: Tensor = b\nc: Model\nprint(a, c)") == {"Tensor": 1, "b": 1, "Model": 2, "print": 3, "c": 3}
    assert free("if (n := len(data)) > 2:\n    print(n)") == {"len": 1, "data": 1, "print": 2}
    names = analysis.cell_names("import os.path, numpy as np\nfrom math import sqrt as root, pi\nfrom torch import *")
    assert names.free == {} and names.assigned == {"os", "np", "root", "pi"} and names.star_import_lines == [3]


def test_analysis_loops_withs_handlers_and_patterns_bind_their_names():
    loop = "for i in range(n):\n    total = total + i\nelse:\n    done = i\nprint(done)"
    assert free(loop) == {"range": 1, "n": 1, "total": 2, "print": 5}
    assert free("with open(path) as f, lock:\n    text = f.read()") == {"open": 1, "path": 1, "lock": 1}
    handler = "try:\n    run()\nexcept (ValueError, KeyError) as err:\n    log(err)\nfinally:\n    close()"
    assert free(handler) == {"run": 2, "ValueError": 3, "KeyError": 3, "log": 4, "close": 6}
    assert free("try:\n    run()\nexcept:\n    pass") == {"run": 2}
    match = (
        "match command:\n"
        "    case [first, *rest]:\n        use(first, rest)\n"
        "    case {'k': value, **others}:\n        use(value, others)\n"
        "    case Point(x=0) as p:\n        use(p)\n"
        "    case [*_]:\n        pass\n"
        "    case (1 | 2) as small:\n        use(small)\n"
    )
    assert free(match) == {"command": 1, "use": 3, "Point": 6}
    assert free("def f():\n    global g\n    g = 1\nf()") == {}
    assert analysis.cell_names("global g\ng = 1").assigned == {"g"}


def test_analysis_a_function_needs_its_decorators_defaults_and_annotations_now_and_its_body_later():
    cell = (
        "@register(REGISTRY)\n"
        "def step(batch: Batch, lr=LR, *args: Extra, scale: Scale = SCALE, **kw: Kw) -> Out:\n"
        "    return helper(batch) * later\n"
        "later = 3\n"
    )
    assert free(cell) == {
        "register": 1,
        "REGISTRY": 1,
        "LR": 2,
        "SCALE": 2,
        "Batch": 2,
        "Extra": 2,
        "Scale": 2,
        "Kw": 2,
        "Out": 2,
        "helper": 2,
    }
    assert free("async def go():\n    await fetch()\ngo()") == {"fetch": 1}
    assert free("f = lambda v, k=DEFAULT, *, j=J: v * scale + k\nf(1)") == {"DEFAULT": 1, "J": 1, "scale": 1}
    # A name the cell binds after the definition is the cell's own; one read first is not.
    assert free("print(later)\ndef f():\n    return later\nlater = 1") == {"print": 1, "later": 1}
    assert free("def fib(n):\n    return fib(n - 1) if n else 0\nfib(3)") == {}
    # A function with a function inside needs what both read.
    nested = "def outer():\n    x = OUTER\n    def inner():\n        return INNER\n    return inner, x\nouter()"
    assert free(nested) == {"OUTER": 1, "INNER": 1}


def test_analysis_a_class_body_runs_at_once_its_methods_later():
    cell = (
        "class Net(Base, metaclass=Meta, flag=FLAG):\n"
        "    size = SIZE\n"
        "    def forward(self, x):\n"
        "        return act(x) + later\n"
        "later = 1\n"
    )
    assert free(cell) == {"Base": 1, "Meta": 1, "FLAG": 1, "SIZE": 1, "act": 1}
    assert analysis.cell_names(cell).assigned == {"Net", "later"}
    assert free("@dataclass\nclass P:\n    x: int = 0") == {"dataclass": 1, "int": 2}
    nested = "class Outer:\n    class Inner:\n        def m(self):\n            return deep()\n"
    assert free(nested) == {"deep": 1}


def test_analysis_comprehension_variables_do_not_leak():
    assert free("ys = [i * k for i in xs if i > lim]\nprint(i)") == {"xs": 1, "k": 1, "lim": 1, "print": 2, "i": 2}
    assert free("d = {k: v * w for k, v in items}\ns = {a for a in b}\ng = (c for c in e)") == {
        "items": 1,
        "w": 1,
        "b": 2,
        "e": 3,
    }
    assert free("n = 1\nys = [n for _ in range(2)]") == {"range": 2}


def test_analysis_definition_names_are_what_a_shipped_def_needs():
    source = "@twice\ndef base(x, y=OFFSET):\n    return helper(x) + K + base(y)\n"
    assert analysis.definition_names(source) == {"twice": 1, "OFFSET": 2, "helper": 2, "K": 2}
    cls = "class Model(Base):\n    n = N\n    def f(self):\n        return g()\n"
    assert analysis.definition_names(cls) == {"Base": 1, "N": 1, "g": 1}
    assert analysis.assigned_at_top("a = 1\nfor b in c: pass\nimport d.e\nf += 1") == {"a", "b", "d", "f"}
    assert analysis.assigned_at_top("def (:") == set()
    with pytest.raises(SyntaxError):
        analysis.cell_names("x = (")


def test_analysis_every_import_binding_among_other_code_but_not_inside_functions():
    source = (
        "import torch.nn.functional\n"
        "import numpy as np, os\n"
        "if FAST:\n"
        "    from math import sqrt as root, pi as pi\n"
        "else:\n"
        "    from . import sibling\n"
        "try:\n"
        "    from .pkg.mod import *\n"
        "except ImportError:\n"
        "    import json as js\n"
        "finally:\n"
        "    import re\n"
        "with ctx:\n"
        "    for _ in x:\n"
        "        import csv\n"
        "def f():\n"
        "    import hidden\n"
        "class C:\n"
        "    import hidden_too\n"
        "try:\n"
        "    pass\n"
        "except KeyError:\n"
        "    import first_handler\n"
        "except ValueError:\n"
        "    import second_handler\n"
    )
    # By line: a try's handlers are walked after its finally (which of two imports of one name wins).
    bindings = sorted(analysis.import_bindings(source), key=lambda b: b.lineno)
    assert [(b.name, b.statement, b.module, b.lineno, b.star) for b in bindings] == [
        ("torch", "import torch.nn.functional", "torch.nn.functional", 1, False),
        ("np", "import numpy as np", "numpy", 2, False),
        ("os", "import os", "os", 2, False),
        ("root", "from math import sqrt as root", "math", 4, False),
        ("pi", "from math import pi", "math", 4, False),
        ("sibling", "from . import sibling", ".", 6, False),
        ("*", "from .pkg.mod import *", ".pkg.mod", 8, True),
        ("js", "import json as js", "json", 10, False),
        ("re", "import re", "re", 12, False),
        ("csv", "import csv", "csv", 15, False),
        ("first_handler", "import first_handler", "first_handler", 23, False),
        ("second_handler", "import second_handler", "second_handler", 25, False),
    ]
    assert analysis.import_bindings("import (") == []


def test_analysis_imported_modules_names_submodules_and_imports_inside_functions():
    source = "import a.b\nfrom c import d\nfrom c import *\nfrom . import e\nfrom .f import g\ndef h():\n    import i\n"
    assert analysis.imported_modules(source) == {"a.b", "c", "c.d", "i"}
    assert analysis.imported_modules("import (") == set()


def test_analysis_a_definition_is_found_by_its_line_or_its_decorators_and_told_if_nested():
    source = (
        "@outer_deco\n"  # 1
        "@another\n"  # 2
        "def top():\n"  # 3
        "    def inner():\n"  # 4
        "        pass\n"  # 5
        "class Box:\n"  # 6
        "    @staticmethod\n"  # 7
        "    def method():\n"  # 8
        "        pass\n"  # 9
        "if True:\n"  # 10
        "    def in_if():\n"  # 11
        "        pass\n"  # 12
        "else:\n"  # 13
        "    def in_else():\n"  # 14
        "        pass\n"  # 15
        "try:\n"  # 16
        "    pass\n"  # 17
        "except Exception:\n"  # 18
        "    def in_handler():\n"  # 19
        "        pass\n"  # 20
        "finally:\n"  # 21
        "    def in_finally():\n"  # 22
        "        pass\n"  # 23
    )

    def found(line, name):
        result = analysis.find_definition(source, line, name)
        return None if result is None else (result[0].name, result[0].lineno, result[1])

    assert found(3, "top") == found(1, "top") == ("top", 3, True)
    assert found(2, "top") is None and found(3, "other") is None
    assert found(4, "inner") == ("inner", 4, False)
    assert found(8, "method") == found(7, "method") == ("method", 8, True)
    assert found(11, "in_if") == ("in_if", 11, True) and found(14, "in_else") == ("in_else", 14, True)
    assert found(19, "in_handler") == ("in_handler", 19, True)
    assert found(22, "in_finally") == ("in_finally", 22, True)
    assert analysis.find_definition("def (:", 1, "x") is None


def test_analysis_the_class_containing_a_line_and_the_last_one_otherwise():
    source = "class A:\n    x = 1\n\nclass A:\n    y = 2\n    z = 3\n"
    assert analysis.find_class(source, "A").lineno == 4
    assert analysis.find_class(source, "A", containing_line=2).lineno == 1
    assert analysis.find_class(source, "A", containing_line=6).lineno == 4
    assert analysis.find_class(source, "A", containing_line=4).lineno == 4  # its own first line
    assert analysis.find_class(source, "A", containing_line=3) is None
    assert analysis.find_class(source, "B") is None and analysis.find_class("class (:", "A") is None


def test_analysis_a_definitions_source_keeps_its_decorators_and_is_dedented():
    source = 'class Box:\n    @staticmethod\n    @cache\n    def m():\n        text = """\nat column 0\n"""\n        return text\n\nx = 1\n'
    node = analysis.find_definition(source, 2, "m")[0]
    assert analysis.node_source(source, node) == (
        '@staticmethod\n@cache\ndef m():\n    text = """\nat column 0\n"""\n    return text'
    )
    top = "def f():\n    return 1\n"
    assert analysis.node_source(top, analysis.find_definition(top, 1, "f")[0]) == "def f():\n    return 1"


def test_analysis_ipython_syntax_lines_are_found_with_their_text():
    cell = "x = 1\n%time y = 2\n!ls -l\nfiles = !ls\nx?\nprint(x)"
    assert analysis.magic_lines(cell) == [(2, "%time y = 2"), (3, "!ls -l"), (4, "files = !ls"), (5, "x?")]
    assert analysis.magic_lines("x = 1\nprint(get_ipython)\nip.run_line_magic('time', '')") == []
    assert analysis.magic_lines("def (:") == []
