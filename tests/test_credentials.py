"""Credentials inside shipped values: found by shape and by name at any depth, refused before
launch with the path and the two ways out; ordinary data (configs, vocabularies, datasets,
tensors) is not refused. Pure tables first, then one cell through a real shell."""

from __future__ import annotations

import argparse
import dataclasses
import types
from collections import OrderedDict, namedtuple

import pytest
import torch
from conftest import run_cells

from notebook_elastic.errors import PackagingError
from notebook_elastic.packaging import NotebookContext, package_cell
from notebook_elastic.packaging.credentials import MAX_ITEMS_PER_CONTAINER, find_credential

# Made-up credentials of each well-known shape (none is real).
HF = "hf_" + "aB3dE5gH7jK9mN1pQ3sT5vW7yZ9bD1fH3"
OPENAI = "sk-proj-" + "Ab12Cd34Ef56Gh78Ij90Kl12Mn34"
GITHUB = "ghp_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"
GITHUB_PAT = "github_pat_" + "11ABCDEFG0123456789_abcdefghijklmnop"
SLACK = "xoxb-" + "123456789012-abcdefABCDEF"
AWS = "AKIA" + "IOSFODNN7EXAMPLE"
JWT = "eyJhbGciOiJIUzI1NiJ9." + "eyJzdWIiOiIxMjM0NTY3ODkwIn0." + "dBjftJeZ4CVPmB92K27uhbUJU1p1r_wW1gFWFOEjXk"
PEM = "-----BEGIN RSA PRIVATE KEY-----\nMIIEpAIBAAKCAQEA\n-----END RSA PRIVATE KEY-----"


@dataclasses.dataclass
class TrainConfig:
    lr: float
    api_key: str = ""


@dataclasses.dataclass
class Wrapper:
    inner: object


class Plain:
    def __init__(self, **kw):
        self.__dict__.update(kw)


class Slotted:
    __slots__ = ("token",)

    def __init__(self, token):
        self.token = token


Creds = namedtuple("Creds", ["user", "password"])


def deep(value, levels: int):
    for _ in range(levels):
        value = {"level": value}
    return value


FOUND = [
    # (value, the path reported)
    ({"api_key": OPENAI}, "config['api_key']"),
    ({"api_key": "k-1234567"}, "config['api_key']"),  # by name: no known shape
    ({"db": {"password": "hunter22"}}, "config['db']['password']"),
    ({"headers": {"Authorization": f"Bearer {OPENAI[3:]}"}}, "config['headers']['Authorization']"),
    (["plain", HF], "config[1]"),
    (("a", ("b", GITHUB)), "config[1][1]"),
    ({GITHUB_PAT}, "an item of config"),
    ({"slack": SLACK}, "config['slack']"),
    ({"aws": {"id": AWS}}, "config['aws']['id']"),
    ({"session": JWT}, "config['session']"),
    ({"ssh": PEM}, "config['ssh']"),
    (TrainConfig(lr=0.1, api_key="abc-123-def"), "config.api_key"),
    (Wrapper(TrainConfig(lr=0.1, api_key=OPENAI)), "config.inner.api_key"),
    (types.SimpleNamespace(token=HF), "config.token"),
    (argparse.Namespace(hf_token="hf-local-abcdef"), "config.hf_token"),
    (Plain(client=Plain(secret="s3cr3t-value")), "config.client.secret"),
    (Slotted("ghs_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"), "config.token"),
    (Creds("me", "correct horse battery"), "config.password"),
    (OrderedDict(openai_key="sk-" + "x1" * 15), "config['openai_key']"),
    ({"nested": [{"k": {"deeper": HF}}]}, "config['nested'][0]['k']['deeper']"),
    (deep({"token": "abcdef123456"}, 4), "config['level']['level']['level']['level']['token']"),
    ({"password": b"bytes-password"}, "config['password']"),
    (HF, "config"),  # a bare string of a known shape, whatever its variable is called
]

NOT_FOUND = [
    {"key_dim": 64, "num_heads": 8},
    {"vocab": {"hello": 0, "token": 1, "sk-": 2, "hf_": 3}},  # a tokenizer vocabulary
    {"pad_token": "<pad>", "eos_token": "</s>", "unk_token": "[UNK]", "max_tokens": 128},
    {"special_tokens_map": {"pad_token": "<|endoftext|>", "mask_token": "[MASK]"}},
    {"sort_key": "name", "primary_key": "id", "cache_key": "v1-abc-123"},
    {"api_key": ""},  # empty: nothing to leak
    {"password": None, "token": 0},
    {"text": "we use sk-learn-compatible-estimators and the hf_hub"},  # prose, not keys
    {"model": "bert-base-uncased", "lr": 3e-4, "labels": ["a", "b"]},
    ["Bearer of bad news", "AKIA is a prefix"],
    TrainConfig(lr=0.1),
    types.SimpleNamespace(tokenizer_name="gpt2", batch_size=8),
    torch.zeros(4, 4),
    {"weights": torch.ones(3), "layer": torch.nn.Linear(2, 2)},
    list(range(10_000)),
    deep({"token": "abcdef123456"}, 10),  # deeper than the bound: not walked
]


@pytest.mark.parametrize("value, path", FOUND, ids=[p for _, p in FOUND])
def test_a_credential_is_found_with_its_path(value, path):
    found = find_credential("config", value)
    assert found is not None and found.path == path, found


@pytest.mark.parametrize("value", NOT_FOUND, ids=range(len(NOT_FOUND)))
def test_ordinary_data_is_not_a_credential(value):
    assert find_credential("config", value) is None


def test_pydantic_models_are_walked_when_pydantic_is_there():
    pydantic = pytest.importorskip("pydantic")

    class Settings(pydantic.BaseModel):
        name: str = "run"
        token: str = ""

    class Hidden(pydantic.BaseModel):
        key: pydantic.SecretStr

    assert find_credential("cfg", Settings(token="abcdef-123456")).path == "cfg.token"
    assert find_credential("cfg", Settings()) is None
    assert find_credential("cfg", Hidden(key="x")).path == "cfg.key"


def test_a_big_dataset_is_sampled_not_walked():
    """A token past the per-container bound is not found: the bound is what keeps a large
    dataset cheap to check, at the price of not seeing everything in it."""
    rows = [{"text": f"sample {i}"} for i in range(MAX_ITEMS_PER_CONTAINER + 10)]
    rows.append({"text": HF})
    assert find_credential("rows", rows) is None
    rows.insert(0, {"text": HF})
    assert find_credential("rows", rows).path == "rows[0]['text']"


def test_a_cycle_is_walked_once():
    loop: dict = {"name": "x"}
    loop["self"] = loop
    assert find_credential("loop", loop) is None


def build(shell, cell: str, **kwargs):
    ctx = NotebookContext.from_shell(shell)
    return package_cell(cell, ctx, name="t", extra_import_paths=[ctx.cwd], **kwargs)


def test_a_cell_using_a_credential_inside_a_container_is_refused_with_the_ways_out(shell):
    run_cells(shell, f"config = {{'lr': 0.1, 'api_key': {OPENAI!r}}}")
    with pytest.raises(PackagingError) as info:
        build(shell, "print(config['lr'])")
    message = str(info.value)
    assert message.startswith("`config['api_key']` (defined in cell [1]) looks like a credential")
    assert "--ship config" in message and "--env NAME=VALUE" in message
    assert OPENAI not in message  # the value itself is never printed
    shipped = build(shell, "print(config['lr'])", ship=["config"])
    assert OPENAI.encode() in shipped.payload


def test_an_object_attribute_credential_is_refused(shell):
    run_cells(shell, "import types\ncfg = types.SimpleNamespace(lr=0.1, token='abc-123-def-456')")
    with pytest.raises(PackagingError, match=r"`cfg\.token` \(defined in cell \[1\]\) looks like a credential"):
        build(shell, "print(cfg.lr)")


def test_top_level_credentials_by_name_are_still_withheld(shell):
    run_cells(shell, f"HF_TOKEN = {HF!r}\nconfig = {{'key_dim': 64}}")
    bundle = build(shell, "print(HF_TOKEN[:3], config)")
    assert bundle.withheld == ["HF_TOKEN"] and HF.encode() not in bundle.payload
