"""Real vLLM engines on this machine: a tiny model made on the spot, and server processes.

No model can be downloaded here, so `make_tiny_model` builds one: a byte-level BPE tokenizer
trained on generated text and a Llama config with random weights, saved the way HuggingFace
does. vLLM loads it like any model (HF_HUB_OFFLINE=1). Wider and deeper models make prefill
cost real time, for benchmarks that need it.

vLLM runs in its own virtual environment (scripts/ensure-vllm); its python is found through
HIVEROUTE_VLLM_PYTHON or the default location.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from hiveroute.engines.engine import EngineSpec
from hiveroute.runtime import free_port

DEFAULT_VLLM_PYTHON = Path.home() / ".cache/hiveroute/vllm-venv/bin/python"
MODEL_CACHE = Path.home() / ".cache/hiveroute/models"
CPU_BLOCK_SIZE = 128  # vLLM's block size on the CPU backend

# A chat template in the style of small instruct models; BOS is added by the template.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{{ '<|' + m['role'] + '|>\\n' + m['content'] + "
    "eos_token + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)

_WORDS = (
    "the agent plan task tool result context model cache router engine token block prefix "
    "workflow step review execute answer question search file code test report summary data "
    "user system assistant call value list error check write read share memory budget"
).split()

_MAKE_WEIGHTS = """
import json, sys, torch
from transformers import LlamaConfig, LlamaForCausalLM
d, vocab, layers, hidden, heads = sys.argv[1], *map(int, sys.argv[2:6])
torch.manual_seed(0)
cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden * 2,
                  num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads,
                  max_position_embeddings=32768, bos_token_id=0, eos_token_id=1,
                  tie_word_embeddings=False)
LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(d, safe_serialization=True)
"""


def vllm_python() -> Path:
    """The python of the environment that has vLLM installed."""
    return Path(os.environ.get("HIVEROUTE_VLLM_PYTHON", str(DEFAULT_VLLM_PYTHON)))


def vllm_available() -> bool:
    return vllm_python().exists()


@dataclass(frozen=True)
class TinyModelSpec:
    layers: int = 2
    hidden: int = 256
    heads: int = 4
    vocab_target: int = 2000

    @property
    def key(self) -> str:
        text = json.dumps(self.__dict__, sort_keys=True) + CHAT_TEMPLATE
        return hashlib.sha256(text.encode()).hexdigest()[:12]


def _train_tokenizer(directory: Path, vocab_target: int) -> int:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    rng = random.Random(0)
    corpus = [
        " ".join(rng.choice(_WORDS) + rng.choice(("", "s", "ed", "ing", "er")) for _ in range(40))
        + rng.choice((".", "!", "?", ",", ":", ";"))
        + f" {rng.randint(0, 9999)}"
        for _ in range(3000)
    ]
    tokenizer = Tokenizer(models.BPE(unk_token=None))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_target,
        special_tokens=["<s>", "</s>", "<unk>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(corpus, trainer)
    bos = tokenizer.token_to_id("<s>")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)]
    )
    tokenizer.save(str(directory / "tokenizer.json"))
    config = {
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "model_max_length": 32768,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": CHAT_TEMPLATE,
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=1))
    special = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
    (directory / "special_tokens_map.json").write_text(json.dumps(special))
    return int(tokenizer.get_vocab_size())


def make_tiny_model(
    spec: TinyModelSpec = TinyModelSpec(), *, cache_dir: Path = MODEL_CACHE
) -> Path:
    """Build (once, cached by spec) a random-weight Llama with a trained BPE tokenizer."""
    target = cache_dir / f"tiny-llama-{spec.key}"
    if (target / "model.safetensors").exists():
        return target
    building = cache_dir / f".building-{spec.key}-{os.getpid()}"
    shutil.rmtree(building, ignore_errors=True)
    building.mkdir(parents=True)
    vocab = _train_tokenizer(building, spec.vocab_target)
    args = [str(building), str(vocab), str(spec.layers), str(spec.hidden), str(spec.heads)]
    done = subprocess.run(
        [str(vllm_python()), "-c", _MAKE_WEIGHTS, *args], capture_output=True, text=True
    )
    if done.returncode != 0:
        raise RuntimeError(f"making the tiny model failed:\n{done.stderr[-3000:]}")
    try:
        building.rename(target)
    except OSError:  # another process built it first
        shutil.rmtree(building, ignore_errors=True)
    return target


@dataclass
class VllmServer:
    """One real vLLM OpenAI server process with prefix caching and KV events on ZMQ."""

    model_dir: Path
    port: int = 0
    events_port: int = 0
    replay_port: int = 0
    served_model_name: str = "tiny"
    max_model_len: int = 8192
    kv_cache_gib: int = 1  # VLLM_CPU_KVCACHE_SPACE takes whole GiB
    extra_args: list[str] = field(default_factory=list)
    log_path: Path | None = None
    hash_seed: str = "0"
    process: subprocess.Popen[bytes] | None = None

    def __post_init__(self) -> None:
        self.port = self.port or free_port()
        self.events_port = self.events_port or free_port()
        self.replay_port = self.replay_port or free_port()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def events_endpoint(self) -> str:
        return f"tcp://127.0.0.1:{self.events_port}"

    @property
    def replay_endpoint(self) -> str:
        return f"tcp://127.0.0.1:{self.replay_port}"

    @property
    def spec(self) -> EngineSpec:
        return EngineSpec(url=self.url, events=self.events_endpoint, replay=self.replay_endpoint)

    def command(self) -> list[str]:
        events = {
            "enable_kv_cache_events": True,
            "publisher": "zmq",
            "endpoint": f"tcp://*:{self.events_port}",
            "replay_endpoint": f"tcp://*:{self.replay_port}",
            "topic": "kv-events",
        }
        return [
            str(vllm_python()), "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(self.model_dir),
            "--served-model-name", self.served_model_name,
            "--host", "127.0.0.1", "--port", str(self.port),
            "--max-model-len", str(self.max_model_len),
            "--enable-prefix-caching", "--enable-prompt-tokens-details",
            "--gpu-memory-utilization", "0.1", "--enforce-eager",
            "--kv-events-config", json.dumps(events),
            *self.extra_args,
        ]  # fmt: skip

    def start(self) -> None:
        """Start the process (returns at once; `wait_ready` waits for /health)."""
        env = {
            **os.environ,
            "HF_HUB_OFFLINE": "1",
            "VLLM_CPU_KVCACHE_SPACE": str(self.kv_cache_gib),
            "PYTHONHASHSEED": self.hash_seed,
            "VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "WARNING"),
        }
        out = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL  # noqa: SIM115
        self.process = subprocess.Popen(
            self.command(), env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )

    async def wait_ready(self, timeout_s: float = 480.0) -> None:
        """Wait for /health. vLLM on a CPU starts in about 30 s, but on a busy 2-core machine
        one start took over 240 s (a CI run at 3838042): the bound is for a hung start."""
        import aiohttp

        deadline = time.monotonic() + timeout_s
        async with aiohttp.ClientSession() as session:
            while time.monotonic() < deadline:
                if self.process is not None and self.process.poll() is not None:
                    raise RuntimeError(
                        f"vLLM exited with {self.process.returncode}; {self._log_tail()}"
                    )
                try:
                    async with session.get(
                        f"{self.url}/health", timeout=aiohttp.ClientTimeout(total=2)
                    ) as r:
                        if r.status == 200:
                            return
                except (TimeoutError, aiohttp.ClientError):
                    pass
                await asyncio.sleep(1.0)
        raise TimeoutError(
            f"vLLM on port {self.port} not ready in {timeout_s:.0f}s; {self._log_tail()}"
        )

    def _log_tail(self) -> str:
        if self.log_path and self.log_path.exists():
            return "log tail:\n" + self.log_path.read_text(errors="replace")[-3000:]
        return "no log kept (set log_path)"

    def stop(self, timeout_s: float = 20.0) -> None:
        """SIGTERM the process group (vLLM forks engine-core workers), then SIGKILL."""
        if self.process is None or self.process.poll() is not None:
            return
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)
        except ProcessLookupError:
            pass


async def start_vllm_servers(
    count: int, model_dir: Path, *, log_dir: Path | None = None, **options: object
) -> list[VllmServer]:
    """Start `count` servers one after another (they compete for the CPU while loading)."""
    servers: list[VllmServer] = []
    try:
        for i in range(count):
            log_path = (log_dir / f"vllm-{i}.log") if log_dir else None
            server = VllmServer(model_dir=model_dir, log_path=log_path, **options)  # type: ignore[arg-type]
            server.start()
            servers.append(server)
            await server.wait_ready()
    except BaseException:
        for server in servers:
            server.stop()
        raise
    return servers


if (
    __name__ == "__main__"
):  # python -m hiveroute.engines.vllm_local: build the model, print its path
    print(make_tiny_model())
    sys.exit(0)
