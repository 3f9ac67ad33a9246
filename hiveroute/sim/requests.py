"""Reading an OpenAI request into the engine's sampling parameters, with vLLM's checks."""

from __future__ import annotations

from typing import Any

from hiveroute.errors import BadRequest
from hiveroute.sim.engine import SamplingParams


def _int_field(body: dict[str, Any], name: str, *, minimum: int | None = None) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(f"'{name}' must be an integer", param=name)
    if minimum is not None and value < minimum:
        raise BadRequest(f"'{name}' must be at least {minimum}, got {value}", param=name)
    return value


def _bool_field(body: dict[str, Any], name: str, default: bool = False) -> bool:
    value = body.get(name, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise BadRequest(f"'{name}' must be true or false", param=name)
    return value


def sampling_params(
    body: dict[str, Any],
    *,
    chat: bool,
    num_prompt_tokens: int,
    max_model_len: int,
    default_max_tokens: int,
    priority_enabled: bool,
) -> SamplingParams:
    """The sampling parameters of a completions or chat request, refusing what vLLM refuses."""
    n = _int_field(body, "n", minimum=1)
    if n is not None and n != 1:
        raise BadRequest("the simulator serves n=1 only", param="n")
    if num_prompt_tokens >= max_model_len:
        raise BadRequest(
            f"This model's maximum context length is {max_model_len} tokens. However, your "
            f"request has {num_prompt_tokens} input tokens. Please reduce the length of the "
            "input messages.",
            param="messages" if chat else "prompt",
        )
    if num_prompt_tokens == 0:
        raise BadRequest("the prompt is empty; send at least one token", param="prompt")
    name = (
        "max_completion_tokens"
        if chat and body.get("max_completion_tokens") is not None
        else "max_tokens"
    )
    max_tokens = _int_field(body, name, minimum=1)
    room = max_model_len - num_prompt_tokens
    eos_at: int | None = None
    if max_tokens is None:
        max_tokens = room
        eos_at = default_max_tokens  # the "model" ends its answer here unless ignore_eos
    elif max_tokens > room:
        raise BadRequest(
            f"'{name}' is too large: {max_tokens}. This model's maximum context length is "
            f"{max_model_len} tokens and your request has {num_prompt_tokens} input tokens "
            f"({max_tokens} > {max_model_len} - {num_prompt_tokens}).",
            param=name,
        )
    min_tokens = _int_field(body, "min_tokens", minimum=0) or 0
    if min_tokens > max_tokens:
        raise BadRequest(
            f"min_tokens must be less than or equal to max_tokens={max_tokens}, got {min_tokens}.",
            param="min_tokens",
        )
    if eos_at is not None:
        eos_at = min(max(eos_at, min_tokens + 1), max_tokens)
    stop = body.get("stop")
    if stop is None:
        stops: tuple[str, ...] = ()
    elif isinstance(stop, str):
        stops = (stop,) if stop else ()
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        stops = tuple(s for s in stop if s)
    else:
        raise BadRequest("'stop' must be a string or a list of strings", param="stop")
    stop_ids = body.get("stop_token_ids") or []
    if not isinstance(stop_ids, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) for t in stop_ids
    ):
        raise BadRequest("'stop_token_ids' must be a list of integers", param="stop_token_ids")
    priority = _int_field(body, "priority") or 0
    if priority != 0 and not priority_enabled:
        raise BadRequest(
            f"Got priority {priority} but Priority scheduling is not enabled "
            "(start the simulator with --scheduling-policy priority).",
            param="priority",
        )
    salt = body.get("cache_salt")
    if salt is not None and (not isinstance(salt, str) or not salt):
        raise BadRequest(
            "Parameter 'cache_salt' must be a non-empty string if provided.", param="cache_salt"
        )
    return SamplingParams(
        max_tokens=max_tokens,
        min_tokens=min_tokens,
        ignore_eos=_bool_field(body, "ignore_eos"),
        eos_at=eos_at,
        stop=stops,
        stop_token_ids=frozenset(stop_ids),
        include_stop_str_in_output=_bool_field(body, "include_stop_str_in_output"),
        priority=priority,
        cache_salt=salt,
    )


def stream_options(body: dict[str, Any]) -> tuple[bool, bool]:
    """(stream, include_usage) with vLLM's rule that stream_options needs stream=true."""
    stream = _bool_field(body, "stream")
    options = body.get("stream_options")
    if options is None:
        return stream, False
    if not isinstance(options, dict):
        raise BadRequest("'stream_options' must be an object", param="stream_options")
    if not stream:
        raise BadRequest(
            "Stream options can only be defined when `stream=True`.", param="stream_options"
        )
    return stream, _bool_field(options, "include_usage")
