from django.urls import path

from dashboard import views

urlpatterns = [
    path("", views.home, name="home"),
    path("login/", views.login_view, name="login"),
    path("logout/", views.logout_view, name="logout"),
    path("organization/switch/", views.switch_organization, name="switch-organization"),
    path("tokens/", views.tokens, name="tokens"),
    path("tokens/<str:token_id>/revoke/", views.revoke_token, name="revoke-token"),
]
