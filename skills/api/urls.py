from django.urls import path

from skills.api import views

urlpatterns = [
    path("skills", views.SkillListView.as_view(), name="skills"),
    path("skills/by-name/<str:name>", views.SkillByNameView.as_view(), name="skill-by-name"),
    path("skills/<str:skill_id>", views.SkillDetailView.as_view(), name="skill-detail"),
    path("skills/<str:skill_id>/skill.md", views.SkillMarkdownView.as_view(), name="skill-markdown"),
    path("skill-collections", views.CollectionListView.as_view(), name="skill-collections"),
    path("skill-collections/by-name/<str:name>", views.CollectionByNameView.as_view(), name="skill-collection-by-name"),
    path("skill-collections/<str:collection_id>", views.CollectionDetailView.as_view(), name="skill-collection-detail"),
    path(
        "skill-collections/<str:collection_id>/skills",
        views.CollectionSkillsView.as_view(),
        name="skill-collection-skills",
    ),
]
