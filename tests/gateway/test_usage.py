from hiveroute.gateway.usage import (
    TAIL_BYTES,
    StreamTail,
    Usage,
    messages_usage,
    responses_usage,
    usage_from_json_bytes,
)


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


def test_a_responses_completed_event_larger_than_the_tail_still_gives_its_usage() -> None:
    tail = StreamTail()
    tail.feed(b'event: response.created\ndata: {"response": {"id": "r", "usage": null}}\n\n')
    text = 'word \\"usage\\": ' * 5000  # the output repeats it, escaped, inside a string
    completed = (
        b'event: response.completed\ndata: {"type": "response.completed", "response": '
        b'{"output": [{"content": [{"text": "' + text.encode() + b'"}]}], "usage": '
        b'{"input_tokens": 40, "input_tokens_details": {"cached_tokens": 32}, '
        b'"output_tokens": 5000}}}\n\n'
    )
    for i in range(0, len(completed), 1000):
        tail.feed(completed[i : i + 1000])
    found = tail.usage(responses_usage)
    assert found == Usage(prompt_tokens=40, completion_tokens=5000, cached_tokens=32)


def test_messages_usage_counts_the_cached_part_of_the_prompt() -> None:
    tail = StreamTail()
    tail.feed(b'event: message_start\ndata: {"message": {"usage": {"input_tokens": 50}}}\n\n')
    tail.feed(
        b'event: message_delta\ndata: {"type": "message_delta", "usage": {"input_tokens": 18, '
        b'"cache_read_input_tokens": 32, "output_tokens": 7}}\n\nevent: message_stop\n'
        b'data: {"type": "message_stop"}\n\n'
    )
    assert tail.usage(messages_usage) == Usage(
        prompt_tokens=50, completion_tokens=7, cached_tokens=32
    )
