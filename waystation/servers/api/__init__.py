"""The HTTP API's routers, one concern each; `waystation.servers.http_api.create_app`
assembles them."""
