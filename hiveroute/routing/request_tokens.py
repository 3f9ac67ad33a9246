"""A request's prompt token ids and block keys, computed once per request.

Plugins share them through `request.derived`: the first plugin that needs the token ids
tokenizes, later ones (and other policies' plugins, e.g. `workflow`) read them back, as they
read the per-engine prefix matches the cache-aware scorers store under PREFIX_MATCH_KEY.

Before a request is sent, routing needs its tokens only as far as an engine could hold them: an
engine holds a block only with every block before it, so once no engine holds all of a prompt's
first blocks, the rest changes no match. `prompt_head` tokenizes that far (what the prefix cache
knows of the text, plus `HEAD_CHARS` characters; the whole prompt where some engine holds all
of that); the count of the rest is estimated from the head's characters per token, and the whole
prompt is tokenized once the request is on its way (`prompt_tokens_of`), for the bookkeeping
that serves later decisions. A new 20k-token context costs the model's tokenizer tens of
milliseconds: its first request no longer waits for them.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from hiveroute.errors import HiverouteError
from hiveroute.kvindex.blocks import BlockKey
from hiveroute.kvindex.index import PrefixMatch
from hiveroute.kvindex.prefix_cache import prefix_block_keys
from hiveroute.kvindex.tokenizer import Prompt, PromptText, Tokenizer, encode_prompt, prompt_of
from hiveroute.routing.base import CycleState, RoutingRequest, StateKey

log = logging.getLogger("hiveroute.routing")

TOKEN_IDS_KEY: StateKey[list[int] | None] = StateKey("token_ids")
# engine name -> PrefixMatch (the kv index's view)
PREFIX_MATCH_KEY: StateKey[dict[str, PrefixMatch]] = StateKey("prefix_match")

# characters tokenized past what the prefix cache knows of a prompt, at first: a few blocks of
# new text, so the head reaches past the first block no engine holds
HEAD_CHARS = 1024
# what reading or tokenizing a prompt raises when this router cannot tokenize it
_CANNOT_TOKENIZE = (HiverouteError, ValueError, TypeError)


@dataclass(frozen=True)
class PromptHead:
    """A prompt's first token ids: all of them (`complete`), or those of its first
    `covered_chars` characters of `total_chars`."""

    ids: list[int]
    complete: bool
    covered_chars: int = 0
    total_chars: int = 0

    @property
    def estimated_tokens(self) -> int:
        """The prompt's length in tokens: exact when complete, else the head's and the rest's
        characters at the head's characters per token."""
        if self.complete or self.covered_chars <= 0:
            return len(self.ids)
        rest = self.total_chars - self.covered_chars
        return len(self.ids) + round(rest * len(self.ids) / self.covered_chars)


def request_token_ids(
    request: RoutingRequest, state: CycleState, tokenizer: Tokenizer
) -> list[int] | None:
    """The whole prompt's token ids (kept in `state` for the plugins that read them there);
    None when the prompt cannot be tokenized here, in which case cache-aware plugins route on
    load alone and the engine has its say."""
    if TOKEN_IDS_KEY not in state:
        state[TOKEN_IDS_KEY] = prompt_tokens_of(request, tokenizer)
    tokens: list[int] | None = state[TOKEN_IDS_KEY]
    return tokens


def prompt_tokens_of(request: RoutingRequest, tokenizer: Tokenizer) -> list[int] | None:
    """The whole prompt's token ids, tokenized once per request and tokenizer
    (`request.derived`); None when the prompt cannot be tokenized here."""
    known = request.derived.token_ids
    if tokenizer.name in known:
        return known[tokenizer.name]
    tokens: list[int] | None
    try:
        tokens = encode_prompt(tokenizer, _prompt(request, tokenizer))
    except _CANNOT_TOKENIZE as exc:
        _cannot_tokenize(request, tokenizer, exc)
        tokens = None
    known[tokenizer.name] = tokens
    request.derived.heads.pop(tokenizer.name, None)
    return tokens


def prompt_head(
    request: RoutingRequest, tokenizer: Tokenizer, *, tokens: int = 0
) -> PromptHead | None:
    """The prompt's first token ids, tokenized no further than routing needs (module doc):
    its head, or the whole prompt when the head holds fewer than `tokens` ids. None when the
    prompt cannot be tokenized here."""
    head = _head(request, tokenizer)
    if head is not None and not head.complete and len(head.ids) < max(tokens, 1):
        return whole_prompt(request, tokenizer)
    return head


def whole_prompt(request: RoutingRequest, tokenizer: Tokenizer) -> PromptHead | None:
    """The whole prompt as a head: where an engine holds all of a head, it likely holds a
    long shared context, whose tokens the prefix cache and the sibling workers' chunks
    mostly have already."""
    ids = prompt_tokens_of(request, tokenizer)
    return None if ids is None else PromptHead(ids, True)


def _head(request: RoutingRequest, tokenizer: Tokenizer) -> PromptHead | None:
    """The head tokenized so far, or a first one."""
    name = tokenizer.name
    if name in request.derived.token_ids:
        return whole_prompt(request, tokenizer)
    head = request.derived.heads.get(name)
    if head is not None:
        return head
    try:
        prompt = _prompt(request, tokenizer)
        if isinstance(prompt, PromptText):
            found = tokenizer.encode_head(
                prompt.text, add_special_tokens=prompt.add_special_tokens, beyond=HEAD_CHARS
            )
            if found is not None:
                head = PromptHead(found[0], False, found[1], len(prompt.text))
                request.derived.heads[name] = head
                return head
    except _CANNOT_TOKENIZE as exc:
        _cannot_tokenize(request, tokenizer, exc)
        request.derived.token_ids[name] = None
        return None
    return whole_prompt(request, tokenizer)


def _cannot_tokenize(request: RoutingRequest, tokenizer: Tokenizer, exc: Exception) -> None:
    """A prompt this router cannot tokenize (logged): cache-aware plugins route it on load."""
    log.debug("cannot tokenize request %s with %s: %s", request.request_id, tokenizer.name, exc)


def _prompt(request: RoutingRequest, tokenizer: Tokenizer) -> Prompt:
    """What the engine tokenizes for this request, read once per tokenizer."""
    prompts = request.derived.prompts
    prompt = prompts.get(tokenizer.name)
    if prompt is None:
        if request.prompt is not None:  # another API: its adapter knows its prompt
            prompt = request.prompt(tokenizer, request.body)
        else:
            prompt = prompt_of(tokenizer, request.path, request.body)
        prompts[tokenizer.name] = prompt
    return prompt


def cache_salt(request: RoutingRequest) -> str | None:
    salt = request.body.get("cache_salt")
    return salt if isinstance(salt, str) and salt else None


def request_block_keys(
    request: RoutingRequest, tokens: list[int], block_size: int
) -> list[BlockKey]:
    """The chained block keys of `tokens` (the prompt's, or its head's) for one block size,
    computed once per request (`request.derived`)."""
    known = request.derived.block_keys
    keys = known.get((block_size, len(tokens)))
    if keys is None:
        keys = prefix_block_keys(tokens, block_size, salt=cache_salt(request))
        known[block_size, len(tokens)] = keys
    return keys


def prompt_block_keys(
    request: RoutingRequest, tokenizer: Tokenizer, block_size: int
) -> list[BlockKey] | None:
    """The prompt's block keys, computed once per request and block size
    (`request.derived`), so workflow accounting after the response reuses the keys routing
    computed; None when the prompt cannot be tokenized here."""
    tokens = prompt_tokens_of(request, tokenizer)
    return None if tokens is None else request_block_keys(request, tokens, block_size)
