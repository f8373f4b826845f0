"""Dashboard pages for skills and collections: the same selectors (permission rule) and services as the API."""

from __future__ import annotations

from typing import Any

import markdown as markdown_lib
import nh3
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.utils.safestring import SafeString, mark_safe
from django.views.decorators.http import require_http_methods, require_POST

from common.errors import ApiError
from dashboard.context import render_page, require_context
from skills import selectors, services
from skills.forms import API_TO_FORM, ROOT, CollectionForm, FilterForm, SkillForm
from skills.models import Skill, SkillCollection

PAGE_SIZE = 50


def render_markdown(text: str) -> SafeString:
    """Markdown to HTML, then sanitized: skills are written by other people, so no script, no handlers."""
    html = markdown_lib.markdown(text, extensions=["fenced_code", "tables", "sane_lists"], output_format="html")
    return mark_safe(nh3.clean(html))  # noqa: S308 - nh3 has just removed everything unsafe


def _lookup(fetch: Any, *args: Any) -> Any:
    try:
        return fetch(*args)
    except ApiError as exc:
        if exc.status_code == 404:
            raise Http404(exc.message) from None
        raise


def _show_errors(form: Any, exc: ApiError) -> None:
    fields = exc.details.get("fields") if isinstance(exc.details, dict) else None
    if not fields:
        form.add_error(None, exc.message)
        return
    for api_name, problems in fields.items():
        name = API_TO_FORM.get(api_name)
        for problem in problems if isinstance(problems, list) else [str(problems)]:
            form.add_error(name if name in form.fields else None, problem)


def _sharing(data: dict[str, Any]) -> services.Sharing:
    return services.Sharing(
        shared_with_user_ids=list(data.get("shared_with_users") or []),
        shared_with_team_ids=list(data.get("shared_with_teams") or []),
        maintainer_user_ids=list(data.get("maintainer_users") or []),
        maintainer_team_ids=list(data.get("maintainer_teams") or []),
    )


def _skill_input(form: SkillForm) -> services.SkillInput:
    data = form.cleaned_data
    return services.SkillInput(
        markdown=data.get("markdown") if form.raw else None,
        name=None if form.raw else data["name"],
        description=None if form.raw else data["description"],
        content=None if form.raw else data["content"],
        visibility=data["visibility"],
        set_collection=True,
        collection_id=data.get("collection") or None,
        sharing=_sharing(data),
    )


def _sharing_initial(obj: Skill | SkillCollection) -> dict[str, Any]:
    return {
        "visibility": obj.visibility,
        "shared_with_users": [u.pk for u in obj.shared_with_users.all()],
        "shared_with_teams": [t.pk for t in obj.shared_with_teams.all()],
        "maintainer_users": [u.pk for u in obj.maintainer_users.all()],
        "maintainer_teams": [t.pk for t in obj.maintainer_teams.all()],
    }


# --- skills ----------------------------------------------------------------------------------------


@login_required
def skill_list(request: HttpRequest) -> HttpResponse:
    ctx = require_context(request)
    if isinstance(ctx, HttpResponse):
        return ctx
    principal = ctx.principal
    filters = FilterForm(request.GET or None, principal=principal)
    queryset = selectors.readable_skills(principal).order_by("-created_at", "-pk")
    if filters.is_valid():
        queryset = selectors.filter_skills(
            queryset,
            collection_id=filters.cleaned_data.get("collection") or None,
            visibility=filters.cleaned_data.get("visibility") or None,
            text=(filters.cleaned_data.get("q") or "").strip(),
        )
    page = Paginator(queryset, PAGE_SIZE).get_page(request.GET.get("page"))
    return render_page(request, "skills/skill_list.html", ctx, page=page, filters=filters)


@login_required
@require_http_methods(["GET", "POST"])
def skill_create(request: HttpRequest) -> HttpResponse:
    ctx = require_context(request)
    if isinstance(ctx, HttpResponse):
        return ctx
    principal = ctx.principal
    raw = request.GET.get("mode") == "raw" or request.POST.get("mode") == "raw"
    initial = {"collection": request.GET.get("collection", ROOT)}
    form = SkillForm(request.POST or None, principal=principal, raw=raw, initial=initial)
    if request.method == "POST" and form.is_valid():
        try:
            skill = services.create_skill(actor=principal, data=_skill_input(form))
        except ApiError as exc:
            _show_errors(form, exc)
        else:
            messages.success(request, f"Skill {skill.name} created.")
            return redirect("dashboard-skill", skill_id=skill.pk)
    return render_page(request, "skills/skill_form.html", ctx, form=form, raw=raw, skill=None)


@login_required
def skill_detail(request: HttpRequest, skill_id: str) -> HttpResponse:
    ctx = require_context(request)
    if isinstance(ctx, HttpResponse):
        return ctx
    skill = _lookup(selectors.get_readable_skill, ctx.principal, skill_id)
    return render_page(request, "skills/skill_detail.html", ctx, skill=skill, rendered=render_markdown(skill.content))


@login_required
@require_http_methods(["GET", "POST"])
def skill_edit(request: HttpRequest, skill_id: str) -> HttpResponse:
    ctx = require_context(request)
    if isinstance(ctx, HttpResponse):
        return ctx
    principal = ctx.principal
    skill = _lookup(selectors.get_readable_skill, principal, skill_id)
    if not skill.can_edit:
        messages.error(request, "You may read this skill but not change it.")
        return redirect("dashboard-skill", skill_id=skill.pk)
    raw = request.GET.get("mode") == "raw" or request.POST.get("mode") == "raw"
    initial = {
        **_sharing_initial(skill),
        "name": skill.name,
        "description": skill.description,
        "content": skill.content,
        "markdown": skill.markdown(),
        "collection": skill.collection_id or ROOT,
    }
    form = SkillForm(request.POST or None, principal=principal, raw=raw, initial=initial)
    if request.method == "POST" and form.is_valid():
        try:
            services.update_skill(actor=principal, skill=skill, data=_skill_input(form))
        except ApiError as exc:
            _show_errors(form, exc)
        else:
            messages.success(request, "Skill saved.")
            return redirect("dashboard-skill", skill_id=skill.pk)
    return render_page(request, "skills/skill_form.html", ctx, form=form, raw=raw, skill=skill)


@login_required
@require_POST
def skill_delete(request: HttpRequest, skill_id: str) -> HttpResponse:
    ctx = require_context(request)
    if isinstance(ctx, HttpResponse):
        return ctx
    principal = ctx.principal
    try:
        skill = selectors.get_editable_skill(principal, skill_id)
    except ApiError as exc:
        if exc.status_code == 404:
            raise Http404(exc.message) from None
        messages.error(request, exc.message)
        return redirect("dashboard-skill", skill_id=skill_id)
    services.delete_skill(actor=principal, skill=skill)
    messages.success(request, f"Skill {skill.name} deleted.")
    return redirect("dashboard-skills")


# --- collections -----------------------------------------------------------------------------------


@login_required
def collection_list(request: HttpRequest) -> HttpResponse:
    ctx = require_context(request)
    if isinstance(ctx, HttpResponse):
        return ctx
    principal = ctx.principal
    filters = FilterForm(request.GET or None, principal=principal)
    del filters.fields["collection"]
    queryset = selectors.readable_collections(principal).order_by("name")
    if filters.is_valid():
        queryset = selectors.filter_collections(
            queryset,
            visibility=filters.cleaned_data.get("visibility") or None,
            text=(filters.cleaned_data.get("q") or "").strip(),
        )
    page = Paginator(queryset, PAGE_SIZE).get_page(request.GET.get("page"))
    return render_page(request, "skills/collection_list.html", ctx, page=page, filters=filters)


@login_required
@require_http_methods(["GET", "POST"])
def collection_create(request: HttpRequest) -> HttpResponse:
    ctx = require_context(request)
    if isinstance(ctx, HttpResponse):
        return ctx
    principal = ctx.principal
    form = CollectionForm(request.POST or None, principal=principal)
    if request.method == "POST" and form.is_valid():
        try:
            collection = services.create_collection(actor=principal, data=_collection_input(form))
        except ApiError as exc:
            _show_errors(form, exc)
        else:
            messages.success(request, f"Collection {collection.name} created.")
            return redirect("dashboard-collection", collection_id=collection.pk)
    return render_page(request, "skills/collection_form.html", ctx, form=form, collection=None)


def _collection_input(form: CollectionForm) -> services.CollectionInput:
    data = form.cleaned_data
    return services.CollectionInput(
        name=data["name"], description=data["description"], visibility=data["visibility"], sharing=_sharing(data)
    )


@login_required
def collection_detail(request: HttpRequest, collection_id: str) -> HttpResponse:
    ctx = require_context(request)
    if isinstance(ctx, HttpResponse):
        return ctx
    principal = ctx.principal
    collection = _lookup(selectors.get_readable_collection, principal, collection_id)
    skills = selectors.collection_skills(principal, collection)
    return render_page(request, "skills/collection_detail.html", ctx, collection=collection, skills=skills)


@login_required
@require_http_methods(["GET", "POST"])
def collection_edit(request: HttpRequest, collection_id: str) -> HttpResponse:
    ctx = require_context(request)
    if isinstance(ctx, HttpResponse):
        return ctx
    principal = ctx.principal
    collection = _lookup(selectors.get_readable_collection, principal, collection_id)
    if not collection.can_edit:
        messages.error(request, "You may read this collection but not change it.")
        return redirect("dashboard-collection", collection_id=collection.pk)
    initial = {**_sharing_initial(collection), "name": collection.name, "description": collection.description}
    form = CollectionForm(request.POST or None, principal=principal, initial=initial)
    if request.method == "POST" and form.is_valid():
        try:
            services.update_collection(actor=principal, collection=collection, data=_collection_input(form))
        except ApiError as exc:
            _show_errors(form, exc)
        else:
            messages.success(request, "Collection saved.")
            return redirect("dashboard-collection", collection_id=collection.pk)
    return render_page(request, "skills/collection_form.html", ctx, form=form, collection=collection)


@login_required
@require_POST
def collection_delete(request: HttpRequest, collection_id: str) -> HttpResponse:
    ctx = require_context(request)
    if isinstance(ctx, HttpResponse):
        return ctx
    principal = ctx.principal
    try:
        collection = selectors.get_editable_collection(principal, collection_id)
        services.delete_collection(actor=principal, collection=collection)
    except ApiError as exc:
        if exc.status_code == 404:
            raise Http404(exc.message) from None
        messages.error(request, exc.message)
        return redirect("dashboard-collection", collection_id=collection_id)
    messages.success(request, f"Collection {collection.name} deleted.")
    return redirect("dashboard-collections")
