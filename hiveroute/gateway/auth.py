"""Client API keys, tenants and the admin key.

With no keys configured the router is open (a trusted network). With `api_keys` set, every
OpenAI endpoint needs `Authorization: Bearer KEY` (or, as the Anthropic SDK sends it,
`x-api-key: KEY`); each key belongs to a tenant. The admin key
opens the control API and the dashboard for every tenant. The client's key is never forwarded
to an engine (`engine_api_key` is sent instead, when set).

Tenants must not share KV blocks, or one could learn another's prompts from cache timing: the
router sets vLLM's `cache_salt` to a per-tenant secret derived with HMAC from `salt_secret`, so
agents within a tenant still share their cache and no tenant can guess another's salt.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Mapping
from dataclasses import dataclass

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from hiveroute.errors import Forbidden, Unauthorized

OPEN_PATHS = frozenset({"/health", "/metrics", "/openapi.json"})
ADMIN_PREFIXES = ("/dashboard", "/admin")


@dataclass(frozen=True)
class Principal:
    tenant: str | None  # None: the router runs open, or the admin
    is_admin: bool


PRINCIPAL_KEY = web.RequestKey("principal", Principal)
OPEN_ROUTER = Principal(tenant=None, is_admin=True)


def principal_of(request: web.Request) -> Principal:
    """Who sent the request; on a router without keys everyone is trusted (tenant None)."""
    return request.get(PRINCIPAL_KEY, OPEN_ROUTER)


class Authenticator:
    def __init__(
        self,
        api_keys: Mapping[str, str],
        admin_key: str | None,
        salt_secret: str | None = None,
    ) -> None:
        self._keys = {key: str(tenant) for key, tenant in api_keys.items()}
        self._admin_key = admin_key or None
        self._salt_secret = (salt_secret or secrets.token_hex(32)).encode()

    @property
    def enabled(self) -> bool:
        return bool(self._keys) or self._admin_key is not None

    def identify(self, authorization: str | None) -> Principal | None:
        """Who the bearer key belongs to; None for no key or an unknown one."""
        if not authorization:
            return None
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token:
            return None
        # compared as bytes: compare_digest refuses str that is not ASCII, and a key sent in
        # any other characters is simply unknown (a 401), not a failure of the router
        sent = token.strip().encode("utf-8", "surrogateescape")
        admin = self._admin_key
        if admin is not None and hmac.compare_digest(sent, admin.encode("utf-8")):
            return Principal(tenant=None, is_admin=True)
        for key, tenant in self._keys.items():
            if hmac.compare_digest(sent, key.encode("utf-8")):
                return Principal(tenant=tenant, is_admin=False)
        return None

    def cache_salt(self, tenant: str) -> str:
        return hmac.new(self._salt_secret, tenant.encode(), hashlib.sha256).hexdigest()[:32]

    def middleware(self) -> Middleware:
        @web.middleware
        async def authenticate(request: web.Request, handler: Handler) -> web.StreamResponse:
            if not self.enabled or request.path in OPEN_PATHS:
                return await handler(request)
            principal = self.identify(request.headers.get("Authorization"))
            if principal is None and "x-api-key" in request.headers:  # the Anthropic SDK's
                principal = self.identify(f"Bearer {request.headers['x-api-key']}")
            if principal is None and request.path.startswith(ADMIN_PREFIXES):
                principal = self.identify(_bearer_from_query(request))
            if principal is None:
                raise Unauthorized(
                    "missing or unknown API key: send 'Authorization: Bearer <key>' "
                    "(or 'x-api-key: <key>')",
                    code="invalid_api_key",
                )
            if request.path.startswith(ADMIN_PREFIXES) and not principal.is_admin:
                raise Forbidden("this endpoint needs the admin key")
            request[PRINCIPAL_KEY] = principal
            return await handler(request)

        return authenticate


def _bearer_from_query(request: web.Request) -> str | None:
    token = request.query.get("key")
    return f"Bearer {token}" if token else None
