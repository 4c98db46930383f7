"""Shared test settings: slow tests run only with FEDHET_SLOW=1; one torch thread per test run."""

from __future__ import annotations

import os

import pytest
import torch

torch.set_num_threads(1)
# `--workers auto` is 1 in every test whatever the machine's cores (a test that patches client
# code to record into this process would see nothing from worker processes); the tests of
# `auto` set FEDHET_CORES themselves (tests/test_workers.py)
os.environ["FEDHET_CORES"] = "1"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("FEDHET_SLOW") == "1":
        return
    skip = pytest.mark.skip(reason="slow test: set FEDHET_SLOW=1 to run it")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
