"""Tag the official `openai` client's calls with workflow, agent, role, session and stage.

    from hiveroute.client import OpenAI, workflow

    client = OpenAI(base_url="http://127.0.0.1:8080/v1", api_key="unused")
    with workflow("trip-42", agent="planner", role="planner"):
        client.chat.completions.create(model="m", messages=[...])

Tags live in a context variable, so asyncio tasks and threads started with a copied context
each keep their own. `tag_client(client)` instruments a client built elsewhere.
"""

from hiveroute.integrations.openai_client import (
    AsyncOpenAI,
    OpenAI,
    apply_tags,
    note_answer,
    tag_client,
    tag_http_client,
)
from hiveroute.integrations.tags import WorkflowTags, current_tags, record_request_id, workflow

__all__ = [
    "AsyncOpenAI",
    "OpenAI",
    "WorkflowTags",
    "apply_tags",
    "current_tags",
    "note_answer",
    "record_request_id",
    "tag_client",
    "tag_http_client",
    "workflow",
]
