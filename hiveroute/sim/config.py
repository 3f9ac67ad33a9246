"""The simulator's configuration: one dataclass, every field also a `hiveroute sim` flag."""

from __future__ import annotations

from dataclasses import dataclass, field

from hiveroute.errors import ConfigError
from hiveroute.sim.faults import FaultKnobs
from hiveroute.sim.presets import DEFAULT_PRESET, Preset, get_preset


@dataclass
class SimConfig:
    """A fleet of simulated engines. None means "take it from the preset"."""

    engines: int = 1
    host: str = "127.0.0.1"
    base_port: int = 8100  # engine i listens on base_port + i; 0: each picks a free port
    events_base_port: int = 5557  # KV-event PUB of engine i; 0: free ports
    replay_base_port: int | None = None  # replay ROUTER; None: events_base_port + 100
    block_size: int = 16
    preset: str = DEFAULT_PRESET
    model: str | None = None
    tokenizer: str | None = None  # a directory with tokenizer.json; None: the built-in one
    num_blocks: int | None = None
    kv_memory_bytes: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    max_model_len: int | None = None
    scheduling_policy: str = "fcfs"  # or "priority"
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = True
    enable_prompt_tokens_details: bool = True
    kv_events: bool = True
    event_topic: str = "kv-events"
    legacy_event_encoding: bool = False  # events as arrays, as vLLM before 0.9 sent them
    replay_buffer_steps: int = 10_000
    default_max_tokens: int = 256  # when a request gives no max_tokens (the "EOS" point)
    time_scale: float = 1.0  # modelled seconds x time_scale = wall seconds
    seed: int = 0
    faults: FaultKnobs = field(default_factory=FaultKnobs)

    def resolved_preset(self) -> Preset:
        return get_preset(self.preset)

    def validate(self) -> SimConfig:
        preset = self.resolved_preset()
        if self.engines < 1:
            raise ConfigError("--engines must be at least 1")
        if self.block_size < 1 or self.block_size > 4096:
            raise ConfigError("--block-size must be 1..4096")
        for name in ("base_port", "events_base_port"):
            value = getattr(self, name)
            if not 0 <= value <= 65535 - self.engines:
                raise ConfigError(f"--{name.replace('_', '-')} must leave room for the engines")
        if self.scheduling_policy not in ("fcfs", "priority"):
            raise ConfigError("--scheduling-policy must be fcfs or priority")
        for name in ("num_blocks", "kv_memory_bytes", "max_num_seqs", "max_num_batched_tokens"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be positive")
        if self.time_scale <= 0:
            raise ConfigError("--time-scale must be positive")
        if self.num_blocks is not None and self.num_blocks < 2:
            raise ConfigError("--num-blocks must be at least 2 (block 0 is vLLM's null block)")
        if not self.enable_chunked_prefill and self.batched_tokens() < self.model_len():
            raise ConfigError(
                "without chunked prefill --max-num-batched-tokens must be at least "
                "--max-model-len, as vLLM requires"
            )
        self.faults.validate()
        del preset
        return self

    def blocks(self) -> int:
        """Blocks in each engine's pool, including vLLM's null block 0."""
        if self.num_blocks is not None:
            return self.num_blocks
        return self.resolved_preset().num_blocks(self.block_size, self.kv_memory_bytes)

    def seqs(self) -> int:
        return self.max_num_seqs or self.resolved_preset().max_num_seqs

    def batched_tokens(self) -> int:
        return self.max_num_batched_tokens or self.resolved_preset().max_num_batched_tokens

    def model_len(self) -> int:
        return self.max_model_len or self.resolved_preset().max_model_len

    def model_name(self) -> str:
        return self.model or self.resolved_preset().model

    def replay_port(self, index: int) -> int:
        if self.events_base_port == 0:
            return 0
        base = self.replay_base_port or self.events_base_port + 100
        return base + index
