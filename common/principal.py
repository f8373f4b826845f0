"""Who is calling: the user, the organization the token is bound to, and what the token may do."""

from __future__ import annotations

from dataclasses import dataclass

from accounts.models import ApiToken, Organization, Role, User


@dataclass(frozen=True)
class Principal:
    user: User
    organization: Organization
    role: str
    token: ApiToken | None
    read_only: bool = False
    sandbox_id: str = ""

    @property
    def is_admin(self) -> bool:
        return self.role in (Role.OWNER, Role.ADMIN)

    @property
    def token_prefix(self) -> str:
        return self.token.prefix if self.token is not None else ""
