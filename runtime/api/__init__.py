"""The HTTP API's routers, one concern each; `runtime.http_api.create_app` assembles them."""
