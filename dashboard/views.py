"""Server-rendered dashboard pages. Each view is thin: look up the context, call a service, render."""

from __future__ import annotations

from datetime import timedelta

from django import forms
from django.contrib import messages
from django.contrib.auth import authenticate, login, logout
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_http_methods, require_POST

from accounts import selectors, services
from accounts.models import Membership
from common.auth import InvalidToken, principal_from_raw_token
from dashboard.context import SESSION_ORG_KEY, current_context, render_page, require_context


class LoginForm(forms.Form):
    email = forms.EmailField(required=False)
    password = forms.CharField(widget=forms.PasswordInput, required=False)
    token = forms.CharField(required=False, widget=forms.PasswordInput, help_text="Or paste an access token.")


class TokenForm(forms.Form):
    name = forms.CharField(max_length=200, required=False)
    expires_in_days = forms.IntegerField(min_value=1, max_value=3650, required=False)


@require_http_methods(["GET", "POST"])
def login_view(request: HttpRequest) -> HttpResponse:
    form = LoginForm(request.POST or None)
    error = ""
    if request.method == "POST" and form.is_valid():
        token = form.cleaned_data["token"].strip()
        if token:
            # Signing in with a token opens the organization that token belongs to.
            try:
                principal = principal_from_raw_token(token)
            except InvalidToken:
                error = "That token is not valid."
            else:
                if principal.read_only:
                    error = "Read-only tokens cannot sign in to the dashboard."
                else:
                    login(request, principal.user, backend="django.contrib.auth.backends.ModelBackend")
                    request.session[SESSION_ORG_KEY] = principal.organization.pk
                    return redirect(request.GET.get("next") or "/")
        else:
            user = authenticate(
                request, email=(form.cleaned_data["email"] or "").lower(), password=form.cleaned_data["password"]
            )
            if user is None:
                error = "E-mail or password is wrong."
            else:
                login(request, user)
                return redirect(request.GET.get("next") or "/")
    return render(request, "registration/login.html", {"form": form, "error": error})


@require_POST
def logout_view(request: HttpRequest) -> HttpResponse:
    logout(request)
    return redirect("/login/")


@login_required
def home(request: HttpRequest) -> HttpResponse:
    ctx = require_context(request)
    if isinstance(ctx, HttpResponse):
        return ctx
    return render_page(request, "dashboard/home.html", ctx)


@login_required
@require_POST
def switch_organization(request: HttpRequest) -> HttpResponse:
    org_id = request.POST.get("organization", "")
    if Membership.objects.filter(user=request.user.pk, organization_id=org_id).exists():
        request.session[SESSION_ORG_KEY] = org_id
    return redirect("/")


@login_required
@require_http_methods(["GET", "POST"])
def tokens(request: HttpRequest) -> HttpResponse:
    ctx = require_context(request)
    if isinstance(ctx, HttpResponse):
        return ctx
    form = TokenForm(request.POST or None)
    new_token = None
    if request.method == "POST" and form.is_valid():
        days = form.cleaned_data.get("expires_in_days")
        issued = services.create_token(
            user=ctx.user,
            organization=ctx.organization,
            name=form.cleaned_data.get("name") or "",
            expires_at=timezone.now() + timedelta(days=days) if days else None,
        )
        new_token = issued.raw
        form = TokenForm()
    token_list = selectors.user_tokens(user=ctx.user, organization=ctx.organization)
    return render_page(request, "dashboard/tokens.html", ctx, form=form, tokens=token_list, new_token=new_token)


@login_required
@require_POST
def revoke_token(request: HttpRequest, token_id: str) -> HttpResponseRedirect:
    ctx = current_context(request)
    if ctx is not None:
        token = selectors.user_tokens(user=ctx.user, organization=ctx.organization).filter(pk=token_id).first()
        if token is not None:
            services.revoke_token(token=token)
            messages.success(request, f"Token {token.prefix}… revoked.")
    return redirect("/tokens/")
