"""Tenant scoping of workflow and context ids.

With client API keys, each tenant has its own namespace: two tenants may both name a workflow
"wf-1" and neither can see, reference or end the other's. Stored keys are ``TENANT<US>ID``
(US, the ASCII unit separator, cannot occur in an id); the API shows the id alone. On an open
router (no keys) and for the admin, the tenant is None and ids are used as given.
"""

from __future__ import annotations

SEP = "\x1f"


def scoped(tenant: str | None, name: str) -> str:
    return name if tenant is None else f"{tenant}{SEP}{name}"


def unscoped(key: str) -> str:
    return key.rsplit(SEP, 1)[-1]


def tenant_of(key: str) -> str | None:
    return key.split(SEP, 1)[0] if SEP in key else None


def visible(key: str, tenant: str | None) -> bool:
    """Whether `tenant` may see `key` (None: the admin or an open router sees everything)."""
    return tenant is None or tenant_of(key) == tenant
