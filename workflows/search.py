"""Search attributes that make tasks findable in `temporal workflow list` and the Web UI."""

from temporalio.common import SearchAttributeKey

AGENT_STATUS = SearchAttributeKey.for_keyword("AgentStatus")
AGENT_STEP = SearchAttributeKey.for_int("AgentStep")
AGENT_MODEL = SearchAttributeKey.for_keyword("AgentModel")
# Since when the oldest pending approval waits; unset while nobody is asked.
AGENT_WAITING_SINCE = SearchAttributeKey.for_datetime("AgentWaitingSince")

ALL = (AGENT_STATUS, AGENT_STEP, AGENT_MODEL, AGENT_WAITING_SINCE)
