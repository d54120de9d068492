"""Search attributes that make tasks findable in `temporal workflow list` and the Web UI."""

from temporalio.common import SearchAttributeKey

AGENT_STATUS = SearchAttributeKey.for_keyword("AgentStatus")
AGENT_STEP = SearchAttributeKey.for_int("AgentStep")

ALL = (AGENT_STATUS, AGENT_STEP)
