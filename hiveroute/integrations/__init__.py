"""Integrations that let agent frameworks tell hiveroute who is calling: the OpenAI-client
helper (`hiveroute.client`), the MCP server (`hiveroute mcp`) and the BeeAI hook
(`hiveroute.integrations.beeai`)."""
