"""Cost-model presets: how long one engine step takes on a real setup.

A step's modelled time (see `CostModel.step_time`) is

    overhead                                  weights streamed from HBM once per step
  + prefill_token_s   x new prefill tokens    the linear layers' FLOPs
  + attention_pair_s  x (query, key) pairs    prefill attention over the context so far
  + decode_seq_s      x decoding sequences    per-sequence sampling and bookkeeping
  + decode_kv_token_s x context tokens read   decode attention streams each sequence's KV

Tokens served from the prefix cache are never scheduled, so they cost nothing to prefill; they
only make later tokens' attention longer (as on a GPU).

Each figure below is derived from a published measurement, written next to it. Sources:
- [H100] NVIDIA H100 Tensor Core GPU datasheet (SXM5): 989 TFLOPS dense BF16, 3.35 TB/s HBM3,
  80 GB; NVLink 900 GB/s.
- [L8B] Llama 3.1 8B model card / config.json: 8.03e9 parameters, 32 layers, hidden 4096,
  8 KV heads x 128 head dim.
- [L70B] Llama 3.1 70B model card / config.json: 70.6e9 parameters, 80 layers, hidden 8192,
  8 KV heads x 128 head dim.
- [MFU] Achieved efficiencies used with the peaks: ~50 % model-FLOPs utilisation for prefill
  (8B, one GPU) and ~45 % (70B, TP=4), ~80 % of peak HBM bandwidth for decode; these are the
  ranges reported by vLLM's v0.6.0 performance blog (2024-09) and the Lambda / Ori vLLM H100
  benchmark write-ups, where measured 8B decode at batch 1 is about 6-7 ms per token.
- [VLLM] vLLM's EngineArgs defaults for GPUs with >= 70 GiB (not A100) serving the OpenAI API:
  max_num_batched_tokens 8192, max_num_seqs 1024; gpu_memory_utilization 0.9.
"""

from __future__ import annotations

from dataclasses import dataclass

from hiveroute.errors import ConfigError


@dataclass(frozen=True)
class CostModel:
    """Seconds per step as a function of what the step computes."""

    overhead_s: float
    prefill_token_s: float
    attention_pair_s: float
    decode_seq_s: float
    decode_kv_token_s: float

    def step_time(
        self, prefill_tokens: int, attention_pairs: int, decode_seqs: int, decode_context: int
    ) -> float:
        return (
            self.overhead_s
            + self.prefill_token_s * prefill_tokens
            + self.attention_pair_s * attention_pairs
            + self.decode_seq_s * decode_seqs
            + self.decode_kv_token_s * decode_context
        )


@dataclass(frozen=True)
class Preset:
    """A real setup: its cost model, KV capacity and vLLM's scheduler defaults for it."""

    name: str
    description: str
    cost: CostModel
    kv_bytes_per_token: int
    kv_memory_bytes: int
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    model: str

    def num_blocks(self, block_size: int, kv_memory_bytes: int | None = None) -> int:
        memory = self.kv_memory_bytes if kv_memory_bytes is None else kv_memory_bytes
        return max(2, memory // (self.kv_bytes_per_token * block_size))


# Llama 3.1 8B, BF16, one H100 SXM.
_L8B_KV_BYTES = 2 * 32 * 8 * 128 * 2  # K and V x 32 layers x 8 KV heads x 128 dim x 2 B [L8B]
LLAMA_8B_H100 = Preset(
    name="llama-8b-h100",
    description="Llama 3.1 8B (BF16) on one H100 SXM, vLLM defaults",
    cost=CostModel(
        # 16.06 GB of weights [L8B] read at 0.8 x 3.35 TB/s [H100][MFU] = 6.0 ms; matches the
        # 6-7 ms batch-1 decode step measured with vLLM on H100 [MFU].
        overhead_s=16.06e9 / (0.8 * 3.35e12),
        # 2 x 8.03e9 FLOPs per token [L8B] at 50 % of 989 TFLOPS [H100][MFU] = 32 us/token.
        prefill_token_s=2 * 8.03e9 / (0.5 * 989e12),
        # 4 x 32 layers x 4096 FLOPs per (query, key) pair (QK^T and PV) [L8B] at 50 % MFU.
        attention_pair_s=4 * 32 * 4096 / (0.5 * 989e12),
        # Sampling and detokenising one sequence: ~20 us per sequence per step, the CPU-side
        # cost vLLM's v0.6.0 blog measured before overlapping it with the GPU [MFU].
        decode_seq_s=20e-6,
        # 131072 B of KV per context token [L8B] read at 0.8 x 3.35 TB/s [H100] = 49 ns/token.
        decode_kv_token_s=_L8B_KV_BYTES / (0.8 * 3.35e12),
    ),
    kv_bytes_per_token=_L8B_KV_BYTES,
    # 0.9 x 80 GB [VLLM][H100] - 16.06 GB weights - ~2 GB activations/graphs = ~54 GB of KV.
    kv_memory_bytes=54 * 10**9,
    max_num_seqs=1024,  # [VLLM]
    max_num_batched_tokens=8192,  # [VLLM]
    max_model_len=131072,  # [L8B] context length
    model="meta-llama/Llama-3.1-8B-Instruct",
)

# Llama 3.1 70B, BF16, four H100 SXM with tensor parallelism 4.
_L70B_KV_BYTES = 2 * 80 * 8 * 128 * 2  # all four GPUs together [L70B]
LLAMA_70B_4XH100 = Preset(
    name="llama-70b-4xh100",
    description="Llama 3.1 70B (BF16) on four H100 SXM, tensor parallel 4, vLLM defaults",
    cost=CostModel(
        # 141.2 GB of weights / 4 GPUs [L70B] read at 0.8 x 3.35 TB/s [H100] = 13.2 ms, plus
        # 2 all-reduces x 80 layers at ~10 us each over NVLink [H100] = 1.6 ms.
        overhead_s=141.2e9 / 4 / (0.8 * 3.35e12) + 2 * 80 * 10e-6,
        # 2 x 70.6e9 FLOPs per token [L70B] over 4 x 989 TFLOPS at 45 % MFU [MFU] = 79 us.
        prefill_token_s=2 * 70.6e9 / (0.45 * 4 * 989e12),
        # 4 x 80 layers x 8192 FLOPs per (query, key) pair [L70B] at 45 % MFU over 4 GPUs.
        attention_pair_s=4 * 80 * 8192 / (0.45 * 4 * 989e12),
        decode_seq_s=20e-6,  # as for 8B: CPU-side per-sequence cost [MFU]
        # 327680 B of KV per token [L70B] spread over 4 GPUs read in parallel at 0.8 x 3.35 TB/s.
        decode_kv_token_s=_L70B_KV_BYTES / 4 / (0.8 * 3.35e12),
    ),
    kv_bytes_per_token=_L70B_KV_BYTES,
    # 0.9 x 4 x 80 GB [VLLM][H100] - 141.2 GB weights - ~8 GB activations = ~139 GB of KV.
    kv_memory_bytes=139 * 10**9,
    max_num_seqs=1024,  # [VLLM]
    max_num_batched_tokens=8192,  # [VLLM]
    max_model_len=131072,  # [L70B]
    model="meta-llama/Llama-3.1-70B-Instruct",
)

# Not a real setup: quick steps and a small cache, so tests and demos run fast and evict soon.
FAST = Preset(
    name="fast",
    description="tiny and quick: for tests and demos (not a real setup)",
    cost=CostModel(
        overhead_s=0.002,
        prefill_token_s=2e-6,
        attention_pair_s=0.0,
        decode_seq_s=5e-6,
        decode_kv_token_s=0.0,
    ),
    kv_bytes_per_token=1024,
    kv_memory_bytes=4096 * 16 * 1024,  # 4096 blocks of 16 tokens
    max_num_seqs=256,
    max_num_batched_tokens=2048,
    max_model_len=32768,
    model="sim-model",
)

PRESETS: dict[str, Preset] = {p.name: p for p in (LLAMA_8B_H100, LLAMA_70B_4XH100, FAST)}
DEFAULT_PRESET = "llama-8b-h100"


def get_preset(name: str) -> Preset:
    """The preset called `name`, or a ConfigError listing the known ones."""
    try:
        return PRESETS[name]
    except KeyError:
        known = ", ".join(sorted(PRESETS))
        raise ConfigError(f"unknown simulator preset {name!r}; known presets: {known}") from None
