"""The code people actually write in notebooks, run as elastic jobs from a real kernel.

Each idiom is a few notebook cells written the way PyTorch tutorials and plain-DDP notebooks
write them (not the way the packager likes them), executed in a real ipykernel through
nbclient, then a ``%%elastic_train`` cell that packages them and runs the job on 2 ranks to
the end with real torchrun. Every idiom is its own job, and each asserts something only
the idiom working can produce (a value it computed, in the job's metrics or logs). Several
idioms share a kernel session, as cells of one notebook would, to keep the corpus cheap.
"""

from __future__ import annotations

import csv
import importlib.util
import json
import re
import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from notebook_kernel import NotebookKernel

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent


@dataclass
class Idiom:
    """Earlier cells, the training cell, and what the finished job must show."""

    name: str
    cells: list[str]
    train: str
    check: Callable[[dict], None]
    flags: str = "--nproc-per-node 2 --max-restarts 0"  # a broken idiom fails once, at once
    files: dict[str, str] = field(default_factory=dict)  # beside the notebook, before its cells


# The kernel side of a job's outcome, as JSON: what the notebook sees of the job.
RESULT_HELPER = """
import json as _json

def _job_result(job):
    return {
        "status": job.status,
        "reason": job.reason,
        "restarts": job.restarts,
        "metrics": {n: list(zip(job.metrics[n].steps, job.metrics[n].values)) for n in job.metrics.names},
        "rank_values": {str(rank): values for rank, values in job.state.rank_values.items()},
        "logs": job.logs,
        "failure": job.failure.get("traceback") if job.failure is not None else None,
    }
"""


def fail(message: str) -> bool:
    """For checks written as one expression: ``value == 3 or fail("why")``."""
    raise AssertionError(message)


def last(result: dict, metric: str) -> float:
    assert metric in result["metrics"], f"no metric {metric!r} reported: {sorted(result['metrics'])}"
    return result["metrics"][metric][-1][1]


def log_lines(result: dict, pattern: str) -> list[re.Match]:
    """Worker output lines matching ``pattern`` (the ``[node]`` prefix stripped)."""
    found = []
    for line in result["logs"]:
        text = line.split("] ", 1)[-1]
        match = re.search(pattern, text)
        if match:
            found.append(match)
    return found


#: Idiom jobs in flight at once. Each is its own job, launched as a user launches one (the
#: kernel stays free), so the next idiom's cells run while earlier jobs train; a few at a time
#: keep 2 loaded cores and the memory of their torch imports in bounds.
IN_FLIGHT = 3


def run_idioms(kernel: NotebookKernel, idioms: list[Idiom]) -> dict[str, dict]:
    """Run each idiom as its own job to the end; fail once, naming every idiom that broke."""
    kernel.run("%load_ext notebook_elastic\n" + RESULT_HELPER)
    results: dict[str, dict] = {}
    broken: list[str] = []
    flying: list[Idiom] = []

    def finish(idiom: Idiom) -> None:
        job = idiom.name.replace("-", "_")
        try:
            out = kernel.run(f"{job}.wait()\nprint(_json.dumps(_job_result({job})))")
            result = json.loads(out.strip().splitlines()[-1])
            results[idiom.name] = result
            assert result["status"] == "succeeded", (
                f"job {result['status']}: {result['reason']}\n{(result['failure'] or '')[-1500:]}\n"
                + "\n".join(result["logs"][-10:])
            )
            idiom.check(result)
        except AssertionError as exc:
            broken.append(f"--- idiom {idiom.name}: {str(exc)[-4000:]}")

    for idiom in idioms:
        for path, text in idiom.files.items():
            target = kernel.folder / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(textwrap.dedent(text).lstrip())
        kernel.markdown(f"## {idiom.name}")
        try:
            for cell in idiom.cells:
                kernel.run(textwrap.dedent(cell))
            launched = kernel.run(
                f"%%elastic_train {idiom.flags} --name {idiom.name}\n" + textwrap.dedent(idiom.train).strip("\n"),
                may_fail=True,
            )
            if "UsageError" in launched:
                raise AssertionError(f"the training cell did not launch:\n{launched[-3000:]}")
        except AssertionError as exc:
            broken.append(f"--- idiom {idiom.name}: {str(exc)[-4000:]}")
            continue
        flying.append(idiom)
        if len(flying) >= IN_FLIGHT:
            finish(flying.pop(0))
    for idiom in flying:
        finish(idiom)
    assert not broken, f"{len(broken)} of {len(idioms)} idioms broke:\n" + "\n".join(broken)
    return results


@pytest.fixture
def notebook_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "notebooks"
    folder.mkdir()
    return folder


def _kernel_imports_this_worktree(kernel: NotebookKernel) -> None:
    where = kernel.run("import notebook_elastic, os\nprint(os.path.dirname(notebook_elastic.__file__))").strip()
    assert where == str(REPO / "notebook_elastic"), f"the kernel imports notebook_elastic from {where}"


# -- the PyTorch DDP tutorial, through a live scale-up --------------------------------------

TUTORIAL_IMPORTS = """
import os
import time
import torch
import torch.nn.functional as F
import torch.distributed as dist
from torch.utils.data import Dataset, DataLoader
from torch.utils.data.distributed import DistributedSampler
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.distributed import init_process_group, destroy_process_group
"""

TUTORIAL_DATASET = """
class MyTrainDataset(Dataset):
    def __init__(self, size):
        self.size = size
        self.data = [(torch.rand(20), torch.rand(1)) for _ in range(size)]

    def __len__(self):
        return self.size

    def __getitem__(self, index):
        return self.data[index]
"""

TUTORIAL_SETUP = """
def ddp_setup():
    init_process_group(backend="gloo")
"""

TUTORIAL_TRAINER = """
class Trainer:
    def __init__(
        self,
        model: torch.nn.Module,
        train_data: DataLoader,
        optimizer: torch.optim.Optimizer,
        save_every: int,
        snapshot_path: str,
    ) -> None:
        self.local_rank = int(os.environ["LOCAL_RANK"])
        self.global_rank = int(os.environ["RANK"])
        self.model = model
        self.train_data = train_data
        self.optimizer = optimizer
        self.save_every = save_every
        self.epochs_run = 0
        self.snapshot_path = snapshot_path
        if os.path.exists(snapshot_path):
            print("Loading snapshot")
            self._load_snapshot(snapshot_path)
        self.model = DDP(self.model)

    def _load_snapshot(self, snapshot_path):
        snapshot = torch.load(snapshot_path)
        self.model.load_state_dict(snapshot["MODEL_STATE"])
        self.epochs_run = snapshot["EPOCHS_RUN"]
        print(f"Resuming training from snapshot at Epoch {self.epochs_run}")

    def _run_batch(self, source, targets):
        self.optimizer.zero_grad()
        output = self.model(source)
        loss = F.mse_loss(output, targets)
        loss.backward()
        self.optimizer.step()
        time.sleep(0.05)  # stands in for a real model's compute
        return loss.item()

    def _run_epoch(self, epoch):
        b_sz = len(next(iter(self.train_data))[0])
        print(f"[GPU{self.global_rank}] Epoch {epoch} | Batchsize: {b_sz} | Steps: {len(self.train_data)}")
        self.train_data.sampler.set_epoch(epoch)
        for source, targets in self.train_data:
            loss = self._run_batch(source, targets)
        return loss

    def _save_snapshot(self, epoch):
        snapshot = {
            "MODEL_STATE": self.model.module.state_dict(),
            "EPOCHS_RUN": epoch,
        }
        torch.save(snapshot, self.snapshot_path)
        print(f"Epoch {epoch} | Training snapshot saved at {self.snapshot_path}")

    def train(self, max_epochs: int):
        for epoch in range(self.epochs_run, max_epochs):
            loss = self._run_epoch(epoch)
            if self.global_rank == 0:
                with open("train_log.csv", "a") as f:
                    f.write(f"{epoch},{dist.get_world_size()},{loss:.5f}\\n")
            if self.global_rank == 0 and epoch % self.save_every == 0:
                self._save_snapshot(epoch)
"""

TUTORIAL_MAIN = """
def load_train_objs():
    train_set = MyTrainDataset(256)
    model = torch.nn.Linear(20, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    return train_set, model, optimizer


def prepare_dataloader(dataset: Dataset, batch_size: int):
    return DataLoader(
        dataset,
        batch_size=batch_size,
        pin_memory=False,
        shuffle=False,
        sampler=DistributedSampler(dataset),
    )


def main(save_every: int, total_epochs: int, batch_size: int, snapshot_path: str = "snapshot.pt"):
    ddp_setup()
    dataset, model, optimizer = load_train_objs()
    train_data = prepare_dataloader(dataset, batch_size)
    trainer = Trainer(model, train_data, optimizer, save_every, snapshot_path)
    trainer.train(total_epochs)
    destroy_process_group()
"""

TUTORIAL_ARGS = """
if __name__ == "__main__":
    total_epochs = 60
    save_every = 1
    batch_size = 32
"""


def test_the_pytorch_ddp_tutorial_survives_a_live_scale_up(home, notebook_dir):
    """pytorch/examples ddp-tutorial-series (multinode.py) pasted into cells: its own
    init/destroy_process_group, a Trainer saving and reloading its own relative snapshot,
    DistributedSampler.set_epoch, a CSV log appended with open(..., "a"); scaled from one
    node to two while it trains, it resumes from its own snapshot on the bigger world."""
    with NotebookKernel(notebook_dir, "tutorial.ipynb") as nb:
        _kernel_imports_this_worktree(nb)
        nb.run("%load_ext notebook_elastic\n" + RESULT_HELPER)
        for cell in (
            TUTORIAL_IMPORTS,
            TUTORIAL_DATASET,
            TUTORIAL_SETUP,
            TUTORIAL_TRAINER,
            TUTORIAL_MAIN,
            TUTORIAL_ARGS,
        ):
            nb.run(cell)
        nb.run(
            "%%elastic_train --nnodes 1:2 --nproc-per-node 2 --max-restarts 3 --name tutorial\n"
            "main(save_every, total_epochs, batch_size)"
        )
        # As a person would: once a snapshot past epoch 0 is on disk, add a node. The
        # tutorial logs an epoch's row before saving its snapshot, so three rows mean the
        # snapshot of epoch 1 (at least) was written; waiting only for the file raced with
        # the epoch-0 snapshot, and a resume from epoch 0 proves nothing.
        nb.run(
            """
            def _epochs_logged():
                return len(open("train_log.csv").readlines()) if os.path.exists("train_log.csv") else 0
            deadline = time.monotonic() + 180
            while not (_epochs_logged() >= 3 and tutorial.status == "running"):
                assert not tutorial.finished and time.monotonic() < deadline, tutorial.summary()
                time.sleep(0.1)
            tutorial.scale(2)
            """.replace("\n            ", "\n")
        )
        nb.run("tutorial.wait(600)")
        result = json.loads(nb.run("print(_json.dumps(_job_result(tutorial)))").strip().splitlines()[-1])
    assert result["status"] == "succeeded", (result["reason"], result["failure"], result["logs"][-30:])
    # Relative paths are the notebook's folder: the snapshot and the log are where the user looks.
    assert (notebook_dir / "snapshot.pt").exists()
    rows = [(int(e), int(w), float(loss)) for e, w, loss in csv.reader((notebook_dir / "train_log.csv").open())]
    assert {w for _e, w, _l in rows} >= {2, 4}, f"never trained on both worlds: {rows}"
    resumed = [int(m.group(1)) for m in log_lines(result, r"Resuming training from snapshot at Epoch (\d+)")]
    assert resumed and max(resumed) >= 1, "the restart on 2 nodes did not reload the user's own snapshot"
    # The bigger world picked up where the snapshot left off, and the last epoch was trained.
    first_on_four = min(e for e, w, _l in rows if w == 4)
    assert first_on_four in resumed, (first_on_four, resumed)
    assert max(e for e, _w, _l in rows) == 59
    assert log_lines(result, r"\[GPU3\] Epoch \d+"), "rank 3 (the new node's second worker) never trained"


# -- data, models, configuration ------------------------------------------------------------

DATA_AND_MODEL = [
    Idiom(
        "tensor-dataset-lambda-collate",
        [
            "import torch\nfrom torch.utils.data import TensorDataset, DataLoader",
            "X = torch.arange(32.).reshape(16, 2)\ny = X.sum(dim=1, keepdim=True)\nds = TensorDataset(X, y)",
            "collate = lambda batch: (torch.stack([b[0] for b in batch]), torch.stack([b[1] for b in batch]))",
        ],
        """
        loader = DataLoader(ds, batch_size=4, collate_fn=collate)
        total = sum(xb.sum().item() + yb.sum().item() for xb, yb in loader)
        inline = DataLoader(ds, batch_size=8, collate_fn=lambda b: len(b))
        elastic.report(step=0, total=total, sizes=sum(inline))
        """,
        lambda r: (
            (last(r, "total") == 2 * 496 or fail(f"total {last(r, 'total')}"))
            and (last(r, "sizes") == 16 or fail("inline lambda collate"))
        ),
    ),
    Idiom(
        "dataset-class-distributed-sampler",
        [
            """
            import torch.distributed as dist
            from torch.utils.data import Dataset
            from torch.utils.data.distributed import DistributedSampler

            class SquaresDataset(Dataset):
                \"\"\"i -> i*i\"\"\"
                def __init__(self, n):
                    self.n = n

                def __len__(self):
                    return self.n

                def __getitem__(self, i):
                    return torch.tensor(float(i * i))
            """,
        ],
        """
        dataset = SquaresDataset(20)
        sampler = DistributedSampler(dataset, shuffle=True, seed=0)
        seen = torch.zeros(1)
        for epoch in range(2):
            sampler.set_epoch(epoch)
            for batch in DataLoader(dataset, batch_size=5, sampler=sampler):
                seen += batch.sum()
        dist.all_reduce(seen)
        elastic.report(step=0, seen=seen.item(), per_rank=len(sampler))
        """,
        lambda r: (
            (last(r, "seen") == 2 * sum(i * i for i in range(20)) or fail(str(r["metrics"])))
            and (last(r, "per_rank") == 10 or fail("per rank"))
        ),
    ),
    Idiom(
        "model-subclass-from-another-cell",
        [
            """
            import torch.nn as nn

            class Backbone(nn.Module):
                def __init__(self, width):
                    super().__init__()
                    self.body = nn.Linear(width, width)

                def forward(self, x):
                    return torch.relu(self.body(x))
            """,
            """
            class Regressor(Backbone):
                def __init__(self):
                    super().__init__(4)
                    self.head = nn.Linear(4, 1)

                def forward(self, x):
                    return self.head(super().forward(x))
            """,
        ],
        """
        from torch.nn.parallel import DistributedDataParallel as DDP
        model = DDP(Regressor())
        loss = model(torch.ones(3, 4)).pow(2).mean()
        loss.backward()
        elastic.report(step=0, params=sum(p.numel() for p in model.parameters()),
                       is_backbone=isinstance(model.module, Backbone))
        """,
        lambda r: (last(r, "params") == 25 or fail("params")) and last(r, "is_backbone") == 1,
    ),
    Idiom(
        "dataclass-config",
        [
            """
            from dataclasses import dataclass, field

            @dataclass
            class TrainConfig:
                lr: float = 0.1
                steps: int = 3
                hidden: list[int] = field(default_factory=lambda: [8, 4])

                @property
                def width(self) -> int:
                    return sum(self.hidden)
            """,
            "cfg = TrainConfig(lr=0.5, steps=4)",
        ],
        """
        model = torch.nn.Linear(2, 1)
        opt = torch.optim.SGD(model.parameters(), lr=cfg.lr)
        for step in range(cfg.steps):
            opt.zero_grad(); model(torch.ones(1, 2)).sum().backward(); opt.step()
        fresh = TrainConfig()
        elastic.report(step=step, lr=opt.param_groups[0]["lr"], width=cfg.width, default_lr=fresh.lr,
                       same_class=isinstance(cfg, TrainConfig))
        """,
        lambda r: (
            (r["metrics"]["lr"][-1] == [3, 0.5] or fail(str(r["metrics"])))
            and last(r, "width") == 12
            and last(r, "default_lr") == 0.1
            and (last(r, "same_class") == 1 or fail("cfg lost its class"))
        ),
    ),
    Idiom(
        "namedtuples",
        [
            """
            from collections import namedtuple
            from typing import NamedTuple

            Batch = namedtuple("Batch", ["x", "y"])

            class Sample(NamedTuple):
                x: float
                y: float = 0.0

            def make_batch(n):
                return Batch(torch.ones(n, 2), torch.zeros(n, 1))
            """,
            "origin = Sample(1.5)\nfirst = make_batch(2)",
        ],
        """
        b = make_batch(3)
        elastic.report(step=0, rows=b.x.shape[0], fields=len(Batch._fields), ox=origin.x + origin.y,
                       first=first.x.sum(), kind=isinstance(first, Batch) + isinstance(origin, Sample))
        """,
        lambda r: (
            (last(r, "rows") == 3 or fail("rows"))
            and last(r, "fields") == 2
            and last(r, "ox") == 1.5
            and last(r, "first") == 4
            and (last(r, "kind") == 2 or fail("namedtuple values lost their class"))
        ),
    ),
    Idiom(
        "enum",
        [
            """
            from enum import Enum, auto

            class Phase(Enum):
                TRAIN = auto()
                EVAL = auto()
            """,
            "current = Phase.EVAL",
        ],
        """
        elastic.report(step=0, is_eval=current is Phase.EVAL, members=len(Phase), value=current.value)
        """,
        lambda r: (
            (last(r, "is_eval") == 1 or fail("enum member identity lost"))
            and last(r, "members") == 2
            and last(r, "value") == 2
        ),
    ),
    Idiom(
        "property-staticmethod-classmethod",
        [
            """
            class Scaler:
                def __init__(self, factor):
                    self._factor = factor

                @property
                def doubled(self):
                    return 2 * self._factor

                @staticmethod
                def clip(v, hi=5):
                    return min(v, hi)

                @classmethod
                def from_config(cls, config):
                    return cls(config["factor"])

                def apply(self, v):
                    return self.clip(v * self._factor)
            """,
        ],
        """
        s = Scaler.from_config({"factor": 3})
        elastic.report(step=0, applied=s.apply(1), doubled=s.doubled, clipped=Scaler.clip(7))
        """,
        lambda r: (last(r, "applied") == 3 or fail("apply")) and last(r, "doubled") == 6 and last(r, "clipped") == 5,
    ),
    Idiom(
        "constant-dict-and-typing",
        [
            """
            from typing import Dict, List, Optional, Tuple

            CONFIG: Dict[str, float] = {"lr": 0.05, "momentum": 0.9}
            LAYERS: List[int] = [3, 5, 1]
            """,
            """
            def make_model(layers: List[int] = LAYERS) -> torch.nn.Module:
                pairs: List[Tuple[int, int]] = list(zip(layers, layers[1:]))
                return torch.nn.Sequential(*[torch.nn.Linear(a, b) for a, b in pairs])

            def make_opt(model: torch.nn.Module, cfg: Optional[Dict[str, float]] = None) -> torch.optim.Optimizer:
                cfg = cfg or CONFIG
                return torch.optim.SGD(model.parameters(), lr=cfg["lr"], momentum=cfg["momentum"])
            """,
        ],
        """
        model: torch.nn.Module = make_model()
        opt = make_opt(model)
        group = opt.param_groups[0]
        elastic.report(step=0, lr=group["lr"], momentum=group["momentum"],
                       params=sum(p.numel() for p in model.parameters()))
        """,
        lambda r: (
            (last(r, "lr") == 0.05 or fail("lr"))
            and last(r, "momentum") == 0.9
            and last(r, "params") == 3 * 5 + 5 + 5 + 1
        ),
    ),
    Idiom(
        "lr-scheduler",
        ["from torch.optim.lr_scheduler import StepLR"],
        """
        model = torch.nn.Linear(2, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        scheduler = StepLR(optimizer, step_size=2, gamma=0.5)
        for epoch in range(4):
            optimizer.zero_grad(); model(torch.ones(1, 2)).sum().backward(); optimizer.step()
            scheduler.step()
            elastic.report(step=epoch, lr=scheduler.get_last_lr()[0])
        """,
        lambda r: (
            [v for _s, v in r["metrics"]["lr"]] == pytest.approx([0.1, 0.05, 0.05, 0.025])
            or fail(str(r["metrics"]["lr"]))
        ),
    ),
    Idiom(
        "gradient-clipping",
        ["from torch.nn.utils import clip_grad_norm_\nMAX_NORM = 0.01"],
        """
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
        loss = model(100 * torch.ones(8, 4)).sum()
        loss.backward()
        before = clip_grad_norm_(model.parameters(), max_norm=MAX_NORM)
        after = torch.norm(torch.stack([p.grad.norm() for p in model.parameters()]))
        elastic.report(step=0, before=before, after=after)
        """,
        lambda r: (
            (last(r, "before") > 1 or fail("before"))
            and (last(r, "after") <= 0.01 + 1e-6 or fail(f"after {last(r, 'after')}"))
        ),
    ),
    Idiom(
        "model-and-optimizer-built-in-the-notebook",
        [
            """
            torch.manual_seed(0)
            net = torch.nn.Linear(3, 1)
            optimizer = torch.optim.SGD(net.parameters(), lr=0.5)
            start = net.weight.detach().clone()
            """,
        ],
        """
        loss = net(torch.ones(2, 3)).sum()
        optimizer.zero_grad(); loss.backward(); optimizer.step()
        moved = (net.weight.detach() - start).abs().sum()
        elastic.report(step=0, moved=moved)
        """,
        lambda r: last(r, "moved") > 0 or fail("optimizer.step() did not move the shipped model's weights"),
    ),
]


def test_data_and_model_idioms(home, notebook_dir):
    with NotebookKernel(notebook_dir, "data_and_model.ipynb") as nb:
        _kernel_imports_this_worktree(nb)
        run_idioms(nb, DATA_AND_MODEL)


# -- functions, scope, imports, output -----------------------------------------------------


def _seed_draws(r: dict) -> None:
    expected = {rank: f"{_draw(1234 + rank):.6f}" for rank in (0, 1)}
    got = {int(m.group(1)): m.group(2) for m in log_lines(r, r"^rank (\d) draws (\S+)$")}
    assert got == expected, (got, expected)


def _draw(seed: int) -> float:
    import torch

    torch.manual_seed(seed)
    return torch.rand(1).item()


def _check_every_rank_printed(r: dict) -> None:
    lines = sorted(m.group(0) for m in log_lines(r, r"^hello from rank \d of \d$"))
    assert lines == ["hello from rank 0 of 2", "hello from rank 1 of 2"], r["logs"]


def _check_tqdm(r: dict) -> None:
    assert last(r, "total") == 45
    assert log_lines(r, r"train: 100%"), "tqdm's bar is not in the job's logs"


FUNCTIONS = [
    Idiom(
        "star-import",
        ["from math import *"],
        """
        elastic.report(step=0, v=sqrt(16) + floor(pi))
        """,
        lambda r: last(r, "v") == 7 or fail(str(r["metrics"])),
    ),
    Idiom(
        "functools-partial",
        [
            "import torch\nfrom functools import partial",
            "def scale(x, factor):\n    return x * factor",
            "triple = partial(scale, factor=3)\nmake_sgd = partial(torch.optim.SGD, lr=0.25)",
        ],
        """
        opt = make_sgd(torch.nn.Linear(2, 1).parameters())
        elastic.report(step=0, v=triple(5), lr=opt.param_groups[0]["lr"])
        """,
        lambda r: (last(r, "v") == 15 or fail("partial")) and last(r, "lr") == 0.25,
    ),
    Idiom(
        "closures-and-nested-functions",
        [
            """
            def make_counter(start):
                count = start
                def increment():
                    nonlocal count
                    count += 1
                    return count
                return increment

            def add_two(x):
                def inner(y):
                    return x + y
                return inner(2)

            counter = make_counter(10)
            """,
        ],
        """
        counter()
        elastic.report(step=0, count=counter(), nested=add_two(5))
        """,
        lambda r: (last(r, "count") == 12 or fail("closure")) and last(r, "nested") == 7,
    ),
    Idiom(
        "global-counter-mutated-by-a-helper",
        ["STEPS_SEEN = 0\n\ndef bump(n=1):\n    global STEPS_SEEN\n    STEPS_SEEN += n"],
        """
        for _ in range(5):
            bump()
        bump(10)
        elastic.report(step=0, seen=STEPS_SEEN)
        """,
        lambda r: last(r, "seen") == 15 or fail(str(r["metrics"])),
    ),
    Idiom(
        "decorator-defined-in-the-notebook",
        [
            """
            import functools

            def count_calls(fn):
                @functools.wraps(fn)
                def wrapper(*args, **kwargs):
                    wrapper.calls += 1
                    return fn(*args, **kwargs)
                wrapper.calls = 0
                return wrapper

            @count_calls
            def train_step(model, x):
                return model(x).sum()
            """,
        ],
        """
        model = torch.nn.Linear(2, 1)
        for _ in range(3):
            train_step(model, torch.ones(1, 2)).backward()
        elastic.report(step=0, calls=train_step.calls, named=train_step.__name__ == "train_step")
        """,
        lambda r: (last(r, "calls") == 3 or fail("calls")) and last(r, "named") == 1,
    ),
    Idiom(
        "imports-inside-functions",
        [
            """
            def build_model():
                import torch.nn as nn
                from collections import OrderedDict
                return nn.Sequential(OrderedDict(fc=nn.Linear(3, 2)))
            """,
        ],
        """
        import math
        model = build_model()
        elastic.report(step=0, params=sum(p.numel() for p in model.parameters()), sq=math.sqrt(16))
        """,
        lambda r: (last(r, "params") == 8 or fail("params")) and last(r, "sq") == 4,
    ),
    Idiom(
        "users-own-main-with-arguments",
        [
            """
            import torch.distributed as dist

            def main(rank: int, world_size: int, epochs: int) -> float:
                total = torch.tensor(float(rank + 1))
                for _ in range(epochs):
                    dist.all_reduce(total)
                return total.item()
            """,
        ],
        """
        result = main(dist.get_rank(), dist.get_world_size(), epochs=2)
        elastic.report(step=0, result=result)
        """,
        lambda r: last(r, "result") == 6 or fail(str(r["metrics"])),
    ),
    Idiom(
        "name-main-guard-in-the-cells",
        [
            """
            def train_loop(epochs):
                return sum(range(epochs))

            if __name__ == "__main__":
                EPOCHS = 4
                print("configured in the notebook")
            """,
        ],
        """
        def run():
            elastic.report(step=0, out=train_loop(EPOCHS), epochs=EPOCHS)

        if __name__ == "__main__":
            run()
        """,
        lambda r: (last(r, "out") == 6 or fail("out")) and last(r, "epochs") == 4,
    ),
    Idiom(
        "tqdm-loop",
        ["!pip install --quiet tqdm", "from tqdm.auto import tqdm"],
        """
        import torch.distributed as dist
        total = 0
        for i in tqdm(range(10), desc="train", disable=dist.get_rank() != 0):
            total += i
        elastic.report(step=0, total=total)
        """,
        _check_tqdm,
    ),
    Idiom(
        "seeds-per-rank",
        [
            """
            import random
            SEED = 1234

            def seed_everything(seed: int) -> None:
                random.seed(seed)
                torch.manual_seed(seed)
            """,
        ],
        """
        rank = dist.get_rank()
        seed_everything(SEED + rank)
        print(f"rank {rank} draws {torch.rand(1).item():.6f}")
        """,
        _seed_draws,
    ),
    Idiom(
        "print-from-every-rank",
        [],
        """
        print(f"hello from rank {dist.get_rank()} of {dist.get_world_size()}")
        """,
        _check_every_rank_printed,
    ),
    Idiom(
        "shell-and-magic-lines-in-other-cells",
        [
            "!pip list 2>/dev/null | grep -ci torch\n%load_ext autoreload\n%autoreload 2",
            # `%matplotlib inline` needs matplotlib, which the test environment may lack.
            ("%matplotlib inline\n" if importlib.util.find_spec("matplotlib") else "")
            + "%config InlineBackend.figure_format = 'retina'\n%time z = 1\n\n"
            + "def normalize(t):\n    return (t - t.mean()) / t.std()",
        ],
        """
        v = normalize(torch.tensor([1., 2., 3.]))
        elastic.report(step=0, top=v[2], mean=v.mean())
        """,
        lambda r: (last(r, "top") == 1 or fail("top")) and abs(last(r, "mean")) < 1e-6,
    ),
    Idiom(
        "generator-helper",
        [
            """
            def batches(n, size):
                for start in range(0, n, size):
                    yield torch.arange(start, min(start + size, n))
            """,
        ],
        """
        sizes = [len(b) for b in batches(10, 4)]
        elastic.report(step=0, count=len(sizes), last=sizes[-1])
        """,
        lambda r: (last(r, "count") == 3 or fail("count")) and last(r, "last") == 2,
    ),
    Idiom(
        "argparse-namespace-as-config",
        [
            """
            import argparse
            parser = argparse.ArgumentParser()
            parser.add_argument("--lr", type=float, default=0.1)
            parser.add_argument("--epochs", type=int, default=2)
            args = parser.parse_args(["--lr", "0.3"])  # a script's parse_args(), made to work in a notebook
            """,
        ],
        """
        elastic.report(step=0, lr=args.lr, epochs=args.epochs)
        """,
        lambda r: (last(r, "lr") == 0.3 or fail("lr")) and last(r, "epochs") == 2,
    ),
    Idiom(
        "logging-logger",
        [
            """
            import logging
            logger = logging.getLogger("trainer")
            """,
        ],
        """
        logger.warning("rank %d reached the end", dist.get_rank())
        """,
        lambda r: (
            sorted(m.group(1) for m in log_lines(r, r"rank (\d) reached the end")) == ["0", "1"] or fail(str(r["logs"]))
        ),
    ),
    Idiom(
        "own-init-process-group-in-the-cell",
        ["import torch.distributed as dist"],
        """
        dist.init_process_group(backend="gloo")
        t = torch.ones(1)
        dist.all_reduce(t)
        elastic.report(step=0, world=t)
        dist.destroy_process_group()
        """,
        lambda r: last(r, "world") == 2 or fail(str(r["metrics"])),
    ),
    Idiom(
        "init-process-group-in-a-lambda",
        ["setup = lambda: dist.init_process_group(backend='gloo')"],
        """
        setup()
        t = torch.ones(1)
        dist.all_reduce(t)
        elastic.report(step=0, world=t)
        dist.destroy_process_group()
        """,
        lambda r: last(r, "world") == 2 or fail(str(r["metrics"])),
    ),
]


def test_function_and_scope_idioms(home, notebook_dir):
    with NotebookKernel(notebook_dir, "functions.ipynb") as nb:
        _kernel_imports_this_worktree(nb)
        run_idioms(nb, FUNCTIONS)


# -- files beside the notebook ---------------------------------------------------------------

FILES = [
    Idiom(
        "local-module-beside-the-notebook",
        ["import torch\nimport utils\nfrom helpers.metrics import accuracy"],
        """
        pred = torch.tensor([1, 0, 1, 1])
        elastic.report(step=0, acc=accuracy(pred, torch.tensor([1, 0, 0, 1])), scale=utils.SCALE)
        """,
        lambda r: (last(r, "acc") == 0.75 or fail("acc")) and last(r, "scale") == 7,
        files={
            "utils.py": "SCALE = 7\n",
            "helpers/__init__.py": "",
            "helpers/metrics.py": "def accuracy(pred, target):\n    return (pred == target).float().mean().item()\n",
        },
    ),
    Idiom(
        "star-import-from-a-local-module",
        ["from layers import *"],
        """
        model = TinyNet()
        elastic.report(step=0, out=model(torch.ones(1, 2)).item())
        """,
        lambda r: last(r, "out") == 3 or fail(str(r["metrics"])),
        files={
            "layers.py": """
            import torch

            class TinyNet(torch.nn.Module):
                def forward(self, x):
                    return x.sum() + 1
            """,
        },
    ),
    Idiom(
        "relative-torch-save-and-load",
        [],
        """
        rank = dist.get_rank()
        if rank == 0:
            torch.save({"w": torch.full((2,), 3.0)}, "weights.pt")
        dist.barrier()
        elastic.report(step=0, w=torch.load("weights.pt")["w"].sum(), all_ranks=True)
        """,
        # rank 0's value charted, rank 1's kept apart: both read the file rank 0 wrote
        lambda r: (
            ([v for _s, v in r["metrics"]["w"]], r["rank_values"]) == ([6.0], {"1": {"w": 6.0}})
            or fail(f"{r['metrics']} {r['rank_values']}")
        ),
    ),
]


def test_file_idioms_use_the_notebooks_folder(home, notebook_dir):
    with NotebookKernel(notebook_dir, "files.ipynb") as nb:
        _kernel_imports_this_worktree(nb)
        nb.run("import torch.distributed as dist")
        run_idioms(nb, FILES)
    assert (notebook_dir / "weights.pt").exists()
