from django.test import Client


def test_dashboard_and_swagger_assets_are_served() -> None:
    client = Client()
    css = client.get("/static/css/app.css")
    assert css.status_code == 200
    assert b"--accent" in b"".join(css.streaming_content)  # type: ignore[attr-defined]
    bundle = client.get("/static/drf_spectacular_sidecar/swagger-ui-dist/swagger-ui-bundle.js")
    assert bundle.status_code == 200
