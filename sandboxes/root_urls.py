from django.urls import path

from sandboxes import views

urlpatterns = [
    path("sandboxes/", views.sandboxes_page, name="dashboard-sandboxes"),
    path("sandboxes/create/", views.create, name="dashboard-sandbox-create"),
    path("sandboxes/enable/", views.toggle, name="dashboard-sandboxes-enable"),
    path("sandboxes/<str:sandbox_id>/", views.detail, name="dashboard-sandbox"),
    path("sandboxes/<str:sandbox_id>/destroy/", views.destroy, name="dashboard-sandbox-destroy"),
]
