from hiveroute.gateway.usage import TAIL_BYTES, StreamTail, usage_from_json_bytes


def test_stream_tail_finds_the_usage_chunk_after_a_long_stream() -> None:
    tail = StreamTail()
    for i in range(5000):
        tail.feed(f'data: {{"choices": [{{"text": "t{i}"}}]}}\n\n'.encode())
    usage = b'data: {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 5000, "prompt_tokens_details": {"cached_tokens": 3}}}\n\n'
    tail.feed(usage[:20])  # split across chunks, as TCP may deliver it
    tail.feed(usage[20:] + b"data: [DONE]\n\n")
    found = tail.usage()
    assert found is not None
    assert (found.prompt_tokens, found.completion_tokens, found.cached_tokens) == (7, 5000, 3)
    assert tail._size < TAIL_BYTES + 200  # bounded


def test_no_usage_and_bad_json() -> None:
    tail = StreamTail()
    tail.feed(b'data: {"usage": broken\n\n')
    assert tail.usage() is None
    assert usage_from_json_bytes(b"[1]") is None
    assert usage_from_json_bytes(b'{"usage": {"prompt_tokens": true}}').prompt_tokens is None  # type: ignore[union-attr]
