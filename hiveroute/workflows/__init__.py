"""Workflows as first-class: registry, shared contexts, placement, keep-warm, priorities."""
