"""Dashboard pages for skills and collections (outside /api/v1/)."""

from django.urls import path

from skills import views

urlpatterns = [
    path("skills/", views.skill_list, name="dashboard-skills"),
    path("skills/new/", views.skill_create, name="dashboard-skill-create"),
    path("skills/<str:skill_id>/", views.skill_detail, name="dashboard-skill"),
    path("skills/<str:skill_id>/edit/", views.skill_edit, name="dashboard-skill-edit"),
    path("skills/<str:skill_id>/delete/", views.skill_delete, name="dashboard-skill-delete"),
    path("collections/", views.collection_list, name="dashboard-collections"),
    path("collections/new/", views.collection_create, name="dashboard-collection-create"),
    path("collections/<str:collection_id>/", views.collection_detail, name="dashboard-collection"),
    path("collections/<str:collection_id>/edit/", views.collection_edit, name="dashboard-collection-edit"),
    path("collections/<str:collection_id>/delete/", views.collection_delete, name="dashboard-collection-delete"),
]
