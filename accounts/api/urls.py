from django.urls import path

from accounts.api import token_exchange, views

urlpatterns = [
    path("auth/token-exchange", token_exchange.token_exchange, name="token-exchange"),
    path("me", views.MeView.as_view(), name="me"),
    path("teams", views.TeamListView.as_view(), name="teams"),
    path("organization", views.OrganizationView.as_view(), name="organization"),
    path("tokens", views.TokenListView.as_view(), name="tokens"),
    path("tokens/<str:token_id>", views.TokenDetailView.as_view(), name="token-detail"),
]
