from django.urls import path

from accounts.api import token_exchange

urlpatterns = [
    path(".well-known/openid-configuration", token_exchange.openid_configuration, name="openid-configuration"),
    path(".well-known/jwks.json", token_exchange.jwks, name="jwks"),
]
