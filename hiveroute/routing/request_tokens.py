"""A request's prompt token ids and block keys, computed once per routing cycle.

Plugins share them through the CycleState: the first plugin that needs the token ids tokenizes,
later ones (and other policies' plugins, e.g. `workflow`) read them back, as they read the
per-engine prefix matches the cache-aware scorers store under PREFIX_MATCH_KEY.
"""

from __future__ import annotations

import logging

from hiveroute.errors import HiverouteError
from hiveroute.kvindex.blocks import BlockKey
from hiveroute.kvindex.index import PrefixMatch
from hiveroute.kvindex.prefix_cache import prefix_block_keys
from hiveroute.kvindex.tokenizer import Tokenizer, prompt_token_ids
from hiveroute.routing.base import CycleState, RoutingRequest, StateKey

log = logging.getLogger("hiveroute.routing")

TOKEN_IDS_KEY: StateKey[list[int] | None] = StateKey("token_ids")
BLOCK_KEYS_KEY: StateKey[dict[int, list[BlockKey]]] = StateKey("block_keys")  # by block size
# engine name -> PrefixMatch (the kv index's view)
PREFIX_MATCH_KEY: StateKey[dict[str, PrefixMatch]] = StateKey("prefix_match")


def request_token_ids(
    request: RoutingRequest, state: CycleState, tokenizer: Tokenizer
) -> list[int] | None:
    """The prompt's token ids (cached in `state`); None when the prompt cannot be tokenized
    here, in which case cache-aware plugins route on load alone and the engine has its say."""
    if TOKEN_IDS_KEY not in state:
        state[TOKEN_IDS_KEY] = prompt_tokens_of(request, tokenizer)
    tokens: list[int] | None = state[TOKEN_IDS_KEY]
    return tokens


def prompt_tokens_of(request: RoutingRequest, tokenizer: Tokenizer) -> list[int] | None:
    """The prompt's token ids, tokenized once per request and tokenizer (`request.derived`);
    None when the prompt cannot be tokenized here."""
    known = request.derived.token_ids
    if tokenizer.name in known:
        return known[tokenizer.name]
    tokens: list[int] | None
    try:
        if request.prompt is not None:  # another API: its adapter knows its prompt
            tokens = request.prompt(tokenizer, request.body)
        else:
            tokens = prompt_token_ids(tokenizer, request.path, request.body)
    except (HiverouteError, ValueError, TypeError) as exc:
        log.debug("cannot tokenize request %s: %s", request.request_id, exc)
        tokens = None
    known[tokenizer.name] = tokens
    return tokens


def cache_salt(request: RoutingRequest) -> str | None:
    salt = request.body.get("cache_salt")
    return salt if isinstance(salt, str) and salt else None


def request_block_keys(
    request: RoutingRequest, state: CycleState, tokens: list[int], block_size: int
) -> list[BlockKey]:
    """The request's chained block keys for one block size (cached in `state`)."""
    by_size: dict[int, list[BlockKey]] = state.setdefault(BLOCK_KEYS_KEY, {})
    keys = by_size.get(block_size)
    if keys is None:
        keys = by_size[block_size] = _memo_keys(request, tokens, block_size)
    return keys


def prompt_block_keys(
    request: RoutingRequest, tokenizer: Tokenizer, block_size: int
) -> list[BlockKey] | None:
    """The prompt's block keys, computed once per request and block size
    (`request.derived`), so workflow accounting after the response reuses the keys routing
    computed; None when the prompt cannot be tokenized here."""
    tokens = prompt_tokens_of(request, tokenizer)
    return None if tokens is None else _memo_keys(request, tokens, block_size)


def _memo_keys(request: RoutingRequest, tokens: list[int], block_size: int) -> list[BlockKey]:
    known = request.derived.block_keys
    keys = known.get((block_size, len(tokens)))
    if keys is None:
        keys = prefix_block_keys(tokens, block_size, salt=cache_salt(request))
        known[block_size, len(tokens)] = keys
    return keys
