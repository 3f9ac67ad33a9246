"""The APIs agents speak besides chat completions, read the way vLLM reads them.

vLLM serves the OpenAI Responses API and the Anthropic Messages API by turning each request into
chat messages and rendering them with the model's chat template. These modules do the same
conversion, so the simulator tokenizes what vLLM would tokenize and the router can compute the
token ids (and so the KV blocks) an engine will see. docs/protocols.md describes both APIs as
vLLM 0.32 serves them.
"""
