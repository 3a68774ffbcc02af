import os

import pytest
import torch

pytest_plugins = ["member_calls"]  # which registered members each test calls (tests/test_registry_complete.py)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch.set_num_threads(1)  # deterministic and fast on the 2-core CI machine


@pytest.fixture(scope="session")
def tokenizer():
    from groupwise.models.tiny import build_tokenizer

    return build_tokenizer()


@pytest.fixture()
def tiny_model(tokenizer):
    from groupwise.models.tiny import build_model

    return build_model("lab-tiny", tokenizer, seed=0)


@pytest.fixture(scope="session")
def lab():
    from groupwise.standard.lab import Lab, LabConfig

    return Lab(LabConfig(test_size=32), seed=0)
