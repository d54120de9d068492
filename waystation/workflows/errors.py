"""ApplicationError types, in one place so raise sites and handling sites cannot drift."""

# The model endpoint refused the request (400/401/403/404/422): retrying cannot help.
LLM_REQUEST_REJECTED = "LlmRequestRejected"
# The conversation is longer than the model's context: the workflow compacts and retries.
LLM_CONTEXT_TOO_LONG = "LlmContextTooLong"
# Worth retrying: 408/409/429/5xx, timeouts, dropped connections.
LLM_UNAVAILABLE = "LlmUnavailable"
# The endpoint answered with something that is not a chat completion.
LLM_MALFORMED_RESPONSE = "LlmMalformedResponse"
# The task names a real model but the worker has no endpoint configured.
LLM_NOT_CONFIGURED = "LlmNotConfigured"
# The worker that took a model call lacks a tool, sub-agent or model endpoint the task
# needs (AgentTask.requires): the workflow waits for a worker that has them.
WORKER_LACKS = "WorkerLacks"
# Messages of the conversation are neither in the task's runs nor in the store.
CONVERSATION_LOST = "ConversationLost"
# A run's events could not be read whole to archive them (the log then reads by query).
ARCHIVE_INCOMPLETE = "ArchiveIncomplete"

# The workflow ends as failed with one of these: max_steps, token_budget, llm_error, ...
AGENT_FAILED = "AgentFailed"

# Approval decisions that are refused before they enter history.
UNKNOWN_REQUEST = "UnknownApprovalRequest"
DECISION_CONFLICT = "DecisionConflict"
TASK_NOT_WAITING = "TaskNotWaiting"
# A decision that names a call other than the one its request is for (Decision.shown).
DECISION_MISMATCH = "DecisionMismatch"
# An answer that is not one of the question's choices.
INVALID_CHOICE = "InvalidChoice"

# Messages that are refused before they enter history.
TASK_NOT_TAKING_MESSAGES = "TaskNotTakingMessages"
TOO_MANY_MESSAGES = "TooManyMessages"
MESSAGE_TOO_LARGE = "MessageTooLarge"
# A follow-up run found no earlier run to continue (a Temporal CLI start for an unknown id).
NOTHING_TO_FOLLOW = "NothingToFollow"

NON_RETRYABLE_LLM_ERRORS = [
    LLM_REQUEST_REJECTED,
    LLM_NOT_CONFIGURED,
    LLM_CONTEXT_TOO_LONG,
    CONVERSATION_LOST,
]

# A model that keeps failing with one of these (or timing out) is down or overloaded: a step
# moves on to the task's next fallback model. A refusal (LLM_REQUEST_REJECTED) never does.
OUTAGE_LLM_ERRORS = [LLM_UNAVAILABLE]

# Webhook deliveries (activities/notify/): the endpoint refused the notice (a 4xx other than
# 408/429, a redirect): retrying cannot help.
WEBHOOK_REJECTED = "WebhookRejected"
# Worth retrying: 408/429/5xx, timeouts, connections refused or dropped.
WEBHOOK_UNAVAILABLE = "WebhookUnavailable"
# The worker that took the delivery has no endpoint of that name.
WEBHOOK_NOT_CONFIGURED = "WebhookNotConfigured"

# A conversation schedule's firing whose task takes no message (it failed or was cancelled:
# resume or fork it): the firing fails, and the next one tries again.
SCHEDULED_TURN_REFUSED = "ScheduledTurnRefused"
