"""Tokenizing requests exactly as the engine does.

Two implementations behind one interface:

- `BuiltinTokenizer`: fast and deterministic, no files needed; the simulator's default. Words,
  runs of spaces and single punctuation marks are tokens, so appending text never changes the
  tokens of what came before (prefix-stable, as the cache needs).
- `HFTokenizer`: a model's `tokenizer.json` (HuggingFace `tokenizers`) and its chat template,
  rendered in a sandboxed jinja2 environment as vLLM does, so ids equal the engine's.

`load_tokenizer(None)` gives the built-in one; `load_tokenizer(DIR)` the model's.
"""

from __future__ import annotations

import hashlib
import json
import operator
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from hiveroute.errors import BadRequest, ConfigError
from hiveroute.kvindex.blocks import keyable
from hiveroute.kvindex.prefix_cache import (
    PrefixEncodeCache,
    Starts,
    any_token_start,
    byte_level_split,
    tokenizer_splits_from_text,
    tokenizer_supports_prefix_reuse,
)
from hiveroute.kvindex.shared_chunks import SharedChunkStore

Message = dict[str, Any]
_START = operator.itemgetter(0)  # a token's (start, end) offsets -> its start


class Tokenizer(Protocol):
    name: str

    def encode(
        self, text: str, *, add_special_tokens: bool = True, chunked: bool = False
    ) -> list[int]:
        """`chunked`: a rendered chat prompt, whose shared context may follow a prompt of the
        agent's own; its chunks are reused too (prefix_cache.py). The ids are the same."""
        ...

    def encode_head(
        self, text: str, *, add_special_tokens: bool, beyond: int
    ) -> tuple[list[int], int] | None:
        """The first ids of `text` and how many characters they cover, at least `beyond`
        characters past what was tokenized of it before (prefix_cache.py, `encode_head`);
        None when this tokenizer cannot stop early: encode the whole text."""
        ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def apply_chat_template(
        self, messages: list[Message], *, add_generation_prompt: bool = True, **kwargs: Any
    ) -> str: ...


def message_text(content: Any) -> str:
    """The text of a chat message's content: a string, or the text parts of a list of parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if isinstance(part, dict) and part.get("type") == "text":
                texts.append(str(part.get("text", "")))
            elif isinstance(part, str):
                texts.append(part)
        return "\n".join(texts)
    raise BadRequest(
        "message content must be a string or a list of content parts", param="messages"
    )


@dataclass(frozen=True)
class PromptText:
    """A prompt as the text the engine tokenizes (a rendered chat, a completion's string):
    kept apart from its ids so a router can tokenize only as much of it as it needs."""

    text: str
    add_special_tokens: bool
    chunked: bool = False  # a rendered chat (`Tokenizer.encode`)

    def encode(self, tokenizer: Tokenizer) -> list[int]:
        return tokenizer.encode(
            self.text, add_special_tokens=self.add_special_tokens, chunked=self.chunked
        )


# what a request's prompt is: a text to tokenize, or token ids the client sent
Prompt = PromptText | list[int]


def encode_prompt(tokenizer: Tokenizer, prompt: Prompt) -> list[int]:
    return prompt.encode(tokenizer) if isinstance(prompt, PromptText) else prompt


def prompt_of(tokenizer: Tokenizer, path: str, body: dict[str, Any]) -> Prompt:
    """The prompt an engine tokenizes for this request (completions or chat)."""
    if path.endswith("/chat/completions"):
        messages = body.get("messages")
        if not isinstance(messages, list):
            raise BadRequest("'messages' must be a list", param="messages")
        text = tokenizer.apply_chat_template(
            messages,
            add_generation_prompt=bool(body.get("add_generation_prompt", True)),
            tools=body.get("tools"),
        )
        return PromptText(text, add_special_tokens=False, chunked=True)
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return PromptText(prompt, add_special_tokens=True)
    if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
        ids = [int(t) for t in prompt]
        if not keyable(ids):
            raise BadRequest("token ids in 'prompt' must be from 0 to 2**64 - 1", param="prompt")
        return ids
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        return PromptText(prompt[0], add_special_tokens=True)
    raise BadRequest("'prompt' must be a string or a list of token ids", param="prompt")


def prompt_token_ids(tokenizer: Tokenizer, path: str, body: dict[str, Any]) -> list[int]:
    """The prompt token ids an engine computes for this request (completions or chat)."""
    return encode_prompt(tokenizer, prompt_of(tokenizer, path, body))


# --- built-in ------------------------------------------------------------------------------

_PIECE = re.compile(r"\s+|\w+|[^\w\s]", re.UNICODE)
# The same pieces for a text of ASCII characters only, matched a third faster: sre's ASCII mode
# skips the Unicode database. `\s` in Unicode mode also matches \x1c-\x1f, so they are named.
_ASCII_SPACE = " \t\n\r\f\v\x1c-\x1f"
_ASCII_PIECE = re.compile(rf"[{_ASCII_SPACE}]+|\w+|[^\w{_ASCII_SPACE}]", re.ASCII)


def piece_boundary(text: str, pos: int) -> bool:
    """Whether a built-in piece ends at `pos` (a run of spaces, of word characters, or one
    other character), from the two characters around it: then the pieces of `text[:pos]` and
    `text[pos:]` are `text`'s."""
    before, after = text[pos - 1], text[pos]
    if before.isspace():
        return not after.isspace()
    if before.isalnum() or before == "_":
        return not (after.isalnum() or after == "_")
    return True  # a mark is a piece of its own


BUILTIN_VOCAB = 32000
BUILTIN_SPECIAL = {"<s>": 1, "</s>": 2}
_FIRST_ID = 16  # ids below are reserved for special tokens


class BuiltinTokenizer:
    """A deterministic tokenizer that needs no files: each piece hashes to an id.

    Ids remember their piece for decoding text the same tokenizer produced (the simulator's
    output); pieces never seen decode to a placeholder.
    """

    name = "builtin"

    def __init__(
        self, vocab_size: int = BUILTIN_VOCAB, *, shared_chunks: SharedChunkStore | None = None
    ) -> None:
        self.vocab_size = vocab_size
        self._ids: dict[str, int] = {}
        self._pieces: dict[int, str] = {}
        # Pieces end where the next begins, so any piece boundary splits a text safely.
        self.prefix_cache = PrefixEncodeCache(
            self._encode_with_offsets,
            safe_split=any_token_start,
            segment_split=piece_boundary,
            shared=shared_chunks,
        )

    def _piece_id(self, piece: str) -> int:
        found = self._ids.get(piece)
        if found is not None:
            return found
        digest = hashlib.blake2b(piece.encode(), digest_size=4).digest()
        token = _FIRST_ID + int.from_bytes(digest, "big") % (self.vocab_size - _FIRST_ID)
        if len(self._ids) < 1_000_000:  # bounded memo
            self._ids[piece] = token
            self._pieces.setdefault(token, piece)
        return token

    def encode(
        self, text: str, *, add_special_tokens: bool = True, chunked: bool = False
    ) -> list[int]:
        return self.prefix_cache.encode(text, add_special_tokens, chunked=chunked)

    def encode_head(
        self, text: str, *, add_special_tokens: bool, beyond: int
    ) -> tuple[list[int], int] | None:
        return self.prefix_cache.encode_head(text, add_special_tokens, beyond=beyond)

    def encode_uncached(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        """A full encode, bypassing the prefix cache (tests and benchmarks compare with it)."""
        return self._encode_with_offsets(text, add_special_tokens)[0]

    def _encode_with_offsets(self, text: str, add_special_tokens: bool) -> tuple[list[int], Starts]:
        # the pieces tile the text: each starts where the last ended
        pieces = (_ASCII_PIECE if text.isascii() else _PIECE).findall(text)
        found = list(map(self._ids.get, pieces))  # known pieces at C speed
        ids: list[int] = (
            [i if i is not None else self._piece_id(p) for i, p in zip(found, pieces, strict=True)]
            if None in found
            else found  # type: ignore[assignment]  # no None left
        )
        ends = np.fromiter(map(len, pieces), np.int64, len(pieces)).cumsum()
        starts = np.concatenate(([0], ends[:-1])) if pieces else ends
        if add_special_tokens:  # <s> comes first and takes no text
            return [BUILTIN_SPECIAL["<s>"], *ids], np.concatenate(([0], starts))
        return ids, starts

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(self._pieces.get(i, "") for i in ids if i >= _FIRST_ID)

    def apply_chat_template(
        self, messages: list[Message], *, add_generation_prompt: bool = True, **kwargs: Any
    ) -> str:
        parts = ["<s>"]
        for message in messages:
            role = str(message.get("role", "user"))
            parts.append(f"<|{role}|>\n{message_text(message.get('content'))}\n")
        if add_generation_prompt:
            parts.append("<|assistant|>\n")
        return "".join(parts)


# --- a model's tokenizer.json ------------------------------------------------------------


def _load_chat_template(directory: Path, config: dict[str, Any]) -> str | None:
    jinja = directory / "chat_template.jinja"
    if jinja.exists():
        return jinja.read_text()
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: take "default"
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default") or next(iter(named.values()), None)
    return template if isinstance(template, str) else None


def _special_token_text(value: Any) -> str | None:
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


class HFTokenizer:
    """A model's `tokenizer.json` and chat template, as vLLM loads them."""

    def __init__(
        self, directory: str | Path, *, shared_chunks: SharedChunkStore | None = None
    ) -> None:
        from tokenizers import Tokenizer as RustTokenizer

        self.directory = Path(directory)
        path = self.directory / "tokenizer.json"
        if not path.exists():
            raise ConfigError(f"no tokenizer.json in {self.directory}")
        spec_text = path.read_text()
        self._tok = RustTokenizer.from_str(spec_text)
        config_path = self.directory / "tokenizer_config.json"
        config: dict[str, Any] = json.loads(config_path.read_text()) if config_path.exists() else {}
        self.name = str(self.directory)
        self.bos_token = _special_token_text(config.get("bos_token"))
        self.eos_token = _special_token_text(config.get("eos_token"))
        self.chat_template = _load_chat_template(self.directory, config)
        self._compiled: Any = None
        self.prefix_cache: PrefixEncodeCache | None = None
        spec = json.loads(spec_text)  # valid: the Rust tokenizer has just read it
        if tokenizer_supports_prefix_reuse(spec) and self._specials_only_in_front():
            segments = byte_level_split if tokenizer_splits_from_text(spec) else None
            self.prefix_cache = PrefixEncodeCache(
                self._encode_with_offsets, segment_split=segments, shared=shared_chunks
            )

    def _encode_with_offsets(self, text: str, add_special_tokens: bool) -> tuple[list[int], Starts]:
        encoding = self._tok.encode(text, add_special_tokens=add_special_tokens)
        offsets = encoding.offsets  # (start, end) tuples: each token's start, read at C speed
        # (np.array over the tuples cost twice the encoding's own offsets list: 2.6 ms of an
        # 18k-token encode, against 0.4 ms this way)
        starts = np.fromiter(map(_START, offsets), np.int64, len(offsets))
        return list(encoding.ids), starts

    def _specials_only_in_front(self) -> bool:
        """Whether special tokens are only ever added in front (BOS), never at the end (EOS),
        so a text's tokens are its prefix's tokens plus the rest's."""
        with_specials = self._tok.encode("hello world", add_special_tokens=True).ids
        plain = self._tok.encode("hello world", add_special_tokens=False).ids
        return with_specials[len(with_specials) - len(plain) :] == plain

    def encode(
        self, text: str, *, add_special_tokens: bool = True, chunked: bool = False
    ) -> list[int]:
        if self.prefix_cache is not None:
            return self.prefix_cache.encode(text, add_special_tokens, chunked=chunked)
        return list(self._tok.encode(text, add_special_tokens=add_special_tokens).ids)

    def encode_head(
        self, text: str, *, add_special_tokens: bool, beyond: int
    ) -> tuple[list[int], int] | None:
        if self.prefix_cache is None:
            return None
        return self.prefix_cache.encode_head(text, add_special_tokens, beyond=beyond)

    def encode_uncached(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        """A full encode, bypassing the prefix cache (tests and benchmarks compare with it)."""
        return list(self._tok.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: Sequence[int]) -> str:
        return str(self._tok.decode(list(ids), skip_special_tokens=True))

    def _template(self) -> Any:
        if self._compiled is None:
            if self.chat_template is None:
                raise BadRequest(
                    f"the tokenizer in {self.directory} has no chat template; use /v1/completions"
                )
            from jinja2.sandbox import ImmutableSandboxedEnvironment

            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)

            def raise_exception(message: str) -> None:
                raise BadRequest(f"chat template: {message}")

            env.globals["raise_exception"] = raise_exception
            env.filters["tojson"] = lambda v, indent=None: json.dumps(
                v, ensure_ascii=False, indent=indent
            )
            self._compiled = env.from_string(self.chat_template)
        return self._compiled

    def apply_chat_template(
        self, messages: list[Message], *, add_generation_prompt: bool = True, **kwargs: Any
    ) -> str:
        context = {
            "messages": messages,
            "add_generation_prompt": add_generation_prompt,
            "bos_token": self.bos_token or "",
            "eos_token": self.eos_token or "",
            **{k: v for k, v in kwargs.items() if v is not None},
        }
        return str(self._template().render(**context))


def load_tokenizer(
    directory: str | Path | None, *, shared_chunks: SharedChunkStore | None = None
) -> Tokenizer:
    """The built-in tokenizer for None, else the model's tokenizer in `directory`.
    `shared_chunks`: where the sibling workers of one router share tokenized chunks."""
    if directory is None or str(directory) in ("", "builtin"):
        return BuiltinTokenizer(shared_chunks=shared_chunks)
    return HFTokenizer(directory, shared_chunks=shared_chunks)
