"""Writes for identities. Keyword-only, typed and atomic."""

from __future__ import annotations

import hashlib
import secrets
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from django.utils.text import slugify

from accounts import oidc
from accounts.models import ApiToken, Membership, Organization, Role, Team, User, hash_token


@dataclass(frozen=True)
class IssuedToken:
    token: ApiToken
    raw: str


def _generate_raw_token() -> str:
    return settings.TOKEN_PREFIX + secrets.token_urlsafe(32)


@transaction.atomic
def create_token(
    *,
    user: User,
    organization: Organization,
    name: str = "",
    expires_at: datetime | None = None,
    read_only: bool = False,
    sandbox_id: str = "",
) -> IssuedToken:
    """Create a token and return its raw value, which is never stored and cannot be shown again."""
    raw = _generate_raw_token()
    token = ApiToken.objects.create(
        user=user,
        organization=organization,
        name=name,
        prefix=raw[: len(settings.TOKEN_PREFIX) + 6],
        token_hash=hash_token(raw),
        expires_at=expires_at,
        read_only=read_only,
        sandbox_id=sandbox_id,
    )
    return IssuedToken(token=token, raw=raw)


@transaction.atomic
def issue_sandbox_token(*, user: User, organization: Organization, sandbox_id: str) -> IssuedToken:
    """A read-only token bound to a sandbox, living SANDBOX_API_TOKEN_SECONDS."""
    return create_token(
        user=user,
        organization=organization,
        name=f"sandbox {sandbox_id}",
        expires_at=timezone.now() + timedelta(seconds=settings.SANDBOX_API_TOKEN_SECONDS),
        read_only=True,
        sandbox_id=sandbox_id,
    )


def revoke_sandbox_tokens(*, sandbox_id: str) -> int:
    """Called when a sandbox is destroyed: its credentials die with it."""
    live = ApiToken.objects.filter(sandbox_id=sandbox_id, revoked_at__isnull=True)
    hashes = list(live.values_list("token_hash", flat=True))
    revoked = live.update(revoked_at=timezone.now())
    if revoked:
        _forget_cached_principals(hashes)
    return revoked


# How long an exchange that finds its answer prepared waits for the answer's transaction to commit.
PREPARED_WAIT_SECONDS = 5.0


class PreparedExchange:
    """The answer to the first exchange of an identity token this process just signed and handed out.

    A sandbox's first command waits for its exchange, and on a busy web process verifying the token,
    looking its sandbox and creator up and writing the token row took several milliseconds. The one
    that hands a sandbox its identity token knows all of that already (it is creating the sandbox, in
    a transaction that writes the token row too). So it registers the answer here before the token
    leaves (``prepare_exchange``) and settles it once that transaction has committed; the exchange
    that presents exactly this token takes it (once) instead of doing the work again.

    Nothing is given away that the exchange would not give: the presented token must be the very
    one this process signed (compared by SHA-256) and unexpired, and the answer is the token the
    exchange would have issued for it. Any other token, a second presentation, one whose answer was
    withdrawn, or an exchange served by another process takes the ordinary path.
    """

    def __init__(self, subject_token: str, expires_at: float) -> None:
        self.key = _subject_key(subject_token)
        self.expires_at = expires_at
        self.issued: IssuedToken | None = None
        # Under _prepared_lock: an exchange answered with it; it was withdrawn.
        self.used = self.withdrawn = False
        self._settled = threading.Event()

    def settle(self, issued: IssuedToken | None) -> None:
        """The answer is committed (``issued``), or there is none (None: the exchange does the work)."""
        self.issued = issued
        self._settled.set()

    def withdraw(self) -> IssuedToken | None:
        """Offer it no more; its token unless an exchange answered with it (the caller then uses or
        revokes it: the sandbox got its token some other way, or not at all)."""
        with _prepared_lock:
            if _prepared.get(self.key) is self:
                del _prepared[self.key]
            self.withdrawn = True
            return None if self.used else self.issued


_prepared: dict[bytes, PreparedExchange] = {}
_prepared_lock = threading.Lock()


def _subject_key(subject_token: str) -> bytes:
    # A digest, so the lookup compares no secret byte by byte.
    return hashlib.sha256(subject_token.encode()).digest()


def prepare_exchange(*, subject_token: str, expires_at: float) -> PreparedExchange:
    """Register the answer to ``subject_token``'s first exchange; settle it once it is committed."""
    prepared = PreparedExchange(subject_token, expires_at)
    with _prepared_lock:
        _prepared[prepared.key] = prepared
    return prepared


def _take_prepared(subject_token: str) -> IssuedToken | None:
    # Popped: only the first exchange that presents the token finds it.
    with _prepared_lock:
        prepared = _prepared.pop(_subject_key(subject_token), None)
    if prepared is None:
        return None
    settled = prepared._settled.wait(PREPARED_WAIT_SECONDS)
    with _prepared_lock:
        if settled and prepared.issued is not None and not prepared.withdrawn and time.time() < prepared.expires_at:
            prepared.used = True
            return prepared.issued
    # Not committed in time, withdrawn, or the identity token expired: the ordinary path decides,
    # and the unused token (if any) is left to whoever withdraws the answer.
    return None


def exchange_identity_token(*, subject_token: str) -> IssuedToken:
    """RFC 8693: a verified identity token of a live sandbox buys a short-lived read-only API token."""
    prepared = _take_prepared(subject_token)
    if prepared is not None:
        return prepared
    claims = oidc.verify_identity_token(subject_token)
    # One transaction from the subject's lookup to the token: a resolver may wait in it for a
    # subject still being committed (a sandbox's create), and a token is only issued for what it saw.
    with transaction.atomic():
        subject = oidc.resolve_subject(claims)
        if subject is None:
            raise oidc.IdentityTokenError("the subject is unknown or no longer exists")
        # get(), not first(): user and organization are unique together, and first()'s ordering is
        # work for nothing on every sandbox's start.
        try:
            membership = Membership.objects.select_related("user", "organization").get(
                user_id=subject.user_id, organization_id=subject.organization_id
            )
        except Membership.DoesNotExist:
            membership = None
        if membership is None or not membership.user.is_active:
            raise oidc.IdentityTokenError("the subject's user is no longer a member of the organization")
        return issue_sandbox_token(
            user=membership.user, organization=membership.organization, sandbox_id=subject.sandbox_id
        )


@transaction.atomic
def revoke_token(*, token: ApiToken) -> ApiToken:
    if token.revoked_at is None:
        token.revoked_at = timezone.now()
        token.save(update_fields=["revoked_at"])
        _forget_cached_principals([token.token_hash])
    return token


def _forget_cached_principals(token_hashes: list[str]) -> None:
    # Imported here: common.auth imports this app's models. Dropped now, so this process stops
    # accepting the tokens at once, and again after commit, so a lookup that read one just before
    # the revocation committed cannot keep it cached. Only these tokens: every sandbox destroy
    # revokes its own, and other callers' principals stay cached.
    from common.auth import forget_cached_principals

    forget_cached_principals(token_hashes)
    transaction.on_commit(lambda: forget_cached_principals(token_hashes))


@transaction.atomic
def ensure_member(*, org_slug: str, email: str, role: str | None = None, org_name: str | None = None) -> Membership:
    """Get or create the organization, the user and their membership (used by bootstrap commands)."""
    slug = slugify(org_slug)
    if not slug or slug != org_slug:
        raise ValueError(f"{org_slug!r} is not a valid organization slug (lowercase letters, digits, dashes).")
    if role is not None and role not in Role.values:
        raise ValueError(f"role must be one of {', '.join(Role.values)}")
    organization, _ = Organization.objects.get_or_create(slug=slug, defaults={"name": org_name or slug})
    user = User.objects.filter(email__iexact=email).first()
    if user is None:
        user = User.objects.create_user(email=email)
    membership, created = Membership.objects.get_or_create(
        user=user, organization=organization, defaults={"role": role or Role.MEMBER}
    )
    if not created and role is not None and membership.role != role:
        membership.role = role
        membership.save(update_fields=["role"])
    return membership


@transaction.atomic
def update_organization(
    *, organization: Organization, name: str | None = None, sandboxes_enabled: bool | None = None
) -> Organization:
    fields: list[str] = []
    if name is not None:
        organization.name = name
        fields.append("name")
    if sandboxes_enabled is not None:
        organization.sandboxes_enabled = sandboxes_enabled
        fields.append("sandboxes_enabled")
    if fields:
        organization.save(update_fields=[*fields, "updated_at"])
    return organization


@transaction.atomic
def create_team(*, organization: Organization, name: str, members: list[User] | None = None) -> Team:
    team = Team.objects.create(organization=organization, name=name, slug=slugify(name)[:64] or "team")
    if members:
        team.members.set(members)
    return team
