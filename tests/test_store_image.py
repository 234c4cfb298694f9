"""The rendezvous store's image (#17): the store needs Python and a torch whose TCPStore speaks
the agents' protocol, not the workers' compilers. No official CPU-only image carries torch
(pytorch/pytorch publishes CUDA tags only), so by default the store runs the workers' image,
as its ``-runtime`` twin when that is an official ``-devel`` image: the same torch build,
without the CUDA compilers and headers; ``--rdzv-image`` names any other. Checked on the
manifests we build, against the strict Kubernetes schema."""

from __future__ import annotations

import pytest
import test_kubernetes_manifests as tm
from kubernetes_validate import validate

from notebook_elastic.backends.kubernetes.options import (
    DEFAULT_IMAGE,
    STORE_IMAGE,
    image_torch,
    untested_torch_warning,
)


def _images(**options) -> tuple[str, str]:
    """(the store's image, the workers' image) in the objects a job would create."""
    spec, bundle, k8s = tm.make(**options)
    objects = tm.m.build(spec, bundle, k8s, run_id="x")
    store = next(o for o in objects if o["kind"] == "Deployment")
    workers = next(o for o in objects if o["kind"] == "Job")
    validate(store, tm.VERSIONS[0], strict=True)
    image = store["spec"]["template"]["spec"]["containers"][0]["image"]
    return image, workers["spec"]["template"]["spec"]["containers"][0]["image"]


@pytest.mark.parametrize(
    "workers",
    [
        DEFAULT_IMAGE,
        "pytorch/pytorch:2.13.0-cuda12.8-cudnn9-devel",
        "docker.io/pytorch/pytorch:2.13.0-cuda12.8-cudnn9-runtime",
        "pytorch/pytorch:latest",
        "pytorch/pytorch@sha256:" + "0" * 64,
    ],
)
def test_beside_docker_hubs_pytorch_images_the_store_runs_a_small_python_image(workers):
    store, workers_image = _images(image=workers)
    assert workers_image == workers  # the workers keep what they asked for
    assert store == STORE_IMAGE == "python:3.12-slim"


def test_an_official_devel_image_elsewhere_gives_the_store_its_runtime_twin():
    devel = "ghcr.io/pytorch/pytorch:2.13.0-cuda12.8-cudnn9-devel"
    store, workers = _images(image=devel)
    assert workers == devel
    assert store == "ghcr.io/pytorch/pytorch:2.13.0-cuda12.8-cudnn9-runtime"  # the registry they pull from
    assert image_torch(store) == image_torch(workers) and untested_torch_warning(store) is None


@pytest.mark.parametrize(
    "image",
    [
        "registry.example/train:1",
        "registry.example/pytorch-devel",
        "myorg/pytorch:2.13",
        "ghcr.io/pytorch/pytorch:latest",
    ],
)
def test_other_images_are_the_stores_as_they_are(image):
    """A private registry's image (an air-gapped cluster pulls only from there), or one whose
    variant we cannot know from its name: the workers' own, which has Python."""
    from notebook_elastic.backends.kubernetes.options import runtime_twin

    assert _images(image=image) == (image, image)
    assert runtime_twin(image) == image


def test_rdzv_image_wins():
    devel = "pytorch/pytorch:2.13.0-cuda12.8-cudnn9-devel"
    assert _images(image=devel, rdzv_image="registry.example/torch-cpu:2.13") == (
        "registry.example/torch-cpu:2.13",
        devel,
    )
