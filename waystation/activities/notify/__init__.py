"""Webhook notifications: the endpoints (WAYSTATION_WEBHOOKS), what a notice looks like on
the wire (JSON or a Slack message), how it is signed, and the activities that send it.

`config` is plain pydantic, so settings may import it; `delivery` is the Temporal side.
"""
