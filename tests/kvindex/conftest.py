"""Fixtures shared by the tokenizer tests."""

import json
from pathlib import Path

import pytest

from hiveroute.engines.vllm_local import CHAT_TEMPLATE, _train_tokenizer


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small byte-level BPE tokenizer with a chat template, as a model directory has it."""
    directory = tmp_path_factory.mktemp("tok")
    _train_tokenizer(directory, 600)
    config = json.loads((directory / "tokenizer_config.json").read_text())
    assert config["chat_template"] == CHAT_TEMPLATE
    return directory
