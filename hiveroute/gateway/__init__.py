"""The gateway: an OpenAI-compatible HTTP front that relays requests to the chosen engine."""
