"""Contracts that cross a boundary: workflow input, activity inputs and results, decisions.

Everything here is stored in Temporal history, so these shapes are contracts: once a
release promises replay compatibility (docs/architecture.md, "Replay compatibility"),
fields are only added, optional, never renamed or removed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Annotated, Any, Literal

# Imported here, where the workflow's imports are passed through its sandbox: imported at
# the call instead, a sandboxed replay of a task with an output schema imported jsonschema
# inside the sandbox, whose attrs calls platform.python_implementation() there (refused),
# and the task's input could not be decoded.
from jsonschema.exceptions import SchemaError
from jsonschema.validators import validator_for
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator

from waystation.prices import ModelPrice
from waystation.vocabulary import (
    AGENT_TOOL_PREFIX,
    OFFLINE_MODEL,
    ApprovalRule,
    FailureKind,
    QuotaLimitKind,
    TerminalStatus,
)
from waystation.workflows.nesting import MAX_JSON_DEPTH, too_deep

# The built-in tool the model calls to ask the person it works for; the workflow, not a
# worker, handles it: the task waits for the answer, which is the call's observation.
ASK_PERSON_TOOL = "ask_person"
# The tool a task with an output schema answers with (workflows/outputs.py).
FINAL_ANSWER_TOOL = "final_answer"
AGENT_NAME_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,47}$"

DEFAULT_SYSTEM_PROMPT = (
    "You are a careful assistant that completes the user's task step by step. "
    "Use the tools you are given when they help; when you have the answer, reply with it "
    "in plain text and call no tool. When you lack something only the person you work for "
    f"can give (a fact, a choice, a confirmation), ask them with the {ASK_PERSON_TOOL} tool "
    "if you have it, rather than guessing."
)


class Contract(BaseModel):
    """Base for every stored model: unknown fields are refused, not silently dropped."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


def schema_problem(schema: dict[str, Any] | None) -> dict[str, Any] | None:
    """A JSON Schema that is one (Draft 2020-12, or the draft it names), or a ValueError
    saying what is wrong with it."""
    if schema is None:
        return None
    try:
        validator_for(schema).check_schema(schema)
    except SchemaError as err:
        where = "/".join(str(p) for p in err.absolute_path) or "the schema"
        raise ValueError(f"not a valid JSON Schema at {where}: {err.message}") from None
    return schema


def not_blank(value: str) -> str:
    if not value.strip():
        raise ValueError("must contain something other than whitespace")
    return value


def not_too_deep(value: Any) -> Any:
    if too_deep(value):
        raise ValueError(f"must not nest objects and lists more than {MAX_JSON_DEPTH} deep")
    return value


class ModelSettings(Contract):
    """Which model to call and how. Recorded in history; never holds a secret."""

    name: str = Field(
        default=OFFLINE_MODEL,
        min_length=1,
        max_length=200,
        description="`ENDPOINT:MODEL` (openai, openai-responses, anthropic, or an endpoint "
        "of WAYSTATION_MODEL_ENDPOINTS), a bare model name at the OpenAI-compatible "
        "endpoint, or 'offline' for the built-in deterministic offline model.",
    )
    fallback_models: list[Annotated[str, Field(min_length=1, max_length=200)]] = Field(
        default_factory=list,
        max_length=8,
        description="Models a step moves to, in order, when the one before keeps failing "
        "with an outage (5xx, overloaded, no connection, timeouts, a 429 that asks for a "
        "longer wait than fallback_after_seconds); each turn starts again at `name`.",
    )
    fallback_after_seconds: float = Field(
        default=60,
        ge=1,
        le=24 * 3600,
        description="How long a step keeps retrying a model through an outage before it "
        "moves to the next of fallback_models.",
    )
    reasoning_effort: Literal["minimal", "low", "medium", "high"] | None = Field(
        default=None,
        description="A reasoning model's effort (Responses `reasoning.effort`); unset: the "
        "endpoint's default.",
    )
    thinking_budget_tokens: int | None = Field(
        default=None,
        ge=1024,
        le=1_000_000,
        description="Anthropic extended thinking: the tokens a step may think with (unset: "
        "no thinking).",
    )
    temperature: float | None = Field(default=None, ge=0, le=2)
    max_tokens: int | None = Field(default=None, ge=1, le=10_000_000)
    request_timeout_seconds: float = Field(
        default=120,
        ge=0.1,
        le=3600,
        description="Idle timeout: the longest wait for the next streamed chunk once the "
        "first has come, before the attempt is retried.",
    )
    first_chunk_timeout_seconds: float = Field(
        default=300,
        ge=0.1,
        le=3600,
        description="The longest wait from sending the request to the first streamed chunk. "
        "A CPU-served model reads the whole prompt first: ~65 s for 720 tokens of a 1.5B "
        "model on a busy 2-core machine, hence the generous default.",
    )
    max_attempts: int = Field(
        default=8, ge=1, le=100, description="LLM attempts per step, retries included."
    )
    context_window_tokens: int | None = Field(
        default=None,
        ge=1000,
        le=10_000_000,
        description="The model's context window; default from a table of well-known models, "
        "else a safe 16,000.",
    )
    tool_choice: str | None = Field(
        default=None,
        min_length=1,
        max_length=64,
        pattern=r"^[A-Za-z0-9_.-]+$",
        description="'auto', 'none', 'required', or the name of the one tool the model "
        "must call; unset leaves it to the endpoint (auto where tools are offered).",
    )
    recover_text_tool_calls: bool = Field(
        default=True,
        description="Treat a tool call the model wrote as text (a JSON object, a ```json "
        "block, <tool_call> tags) as that tool call when no structured call came.",
    )
    structured_output: Literal["auto", "tool", "native"] = Field(
        default="auto",
        description="How a task with an output_schema asks for it: `tool` (a final_answer "
        "tool whose parameters are the schema: any tool-calling endpoint), `native` (the "
        "endpoint's response_format json_schema), `auto`: native for OpenAI's current "
        "models, else tool.",
    )


Decider = Literal["approve", "reject"]


class ApprovalSettings(Contract):
    """Which tool calls wait for a person, and for how long."""

    policy: dict[str, ApprovalRule] = Field(
        default_factory=dict,
        max_length=200,
        description="Per-tool override of the registry default: always, never, or "
        "outside_scratch (a path argument outside the workspace's scratch/ folder).",
    )
    timeout_seconds: float = Field(
        default=7 * 24 * 3600,
        ge=1,
        le=366 * 24 * 3600,
        description="How long one request may wait for a decision (at most a year).",
    )
    on_timeout: Literal["reject", "fail"] = "reject"


class AgentSpec(Contract):
    """A sub-agent: a name and its own system prompt, tools, model, limits and optional
    output schema. Offered to a task's model as the tool `agent__<name>` (arguments:
    `task`); a call runs it as a child task (workflows/agents.py)."""

    name: str = Field(pattern=AGENT_NAME_PATTERN)
    description: str = Field(
        min_length=1, max_length=2_000, description="What it is good for: the model reads it."
    )
    system_prompt: str = Field(default=DEFAULT_SYSTEM_PROMPT, max_length=200_000)
    tools: list[str] | None = Field(
        default=None, max_length=200, description="Tools it may call; None: every one."
    )
    model: ModelSettings | None = Field(default=None, description="None: its caller's model.")
    max_steps: int = Field(default=20, ge=1, le=100_000)
    token_budget: int | None = Field(default=None, ge=1, le=10**12)
    output_schema: dict[str, Any] | None = None
    mcp_servers: list[str] | None = Field(
        default=None, max_length=50, description="None: its caller's MCP servers."
    )
    shared_memory: bool = Field(
        default=False,
        description="Remember and recall in its caller's memory namespace, not its own "
        "(TENANT:NAME).",
    )

    _schema_checked = field_validator("output_schema")(schema_problem)

    @property
    def tool_name(self) -> str:
        return AGENT_TOOL_PREFIX + self.name


class QuestionSettings(Contract):
    """How long a question to a person (the `ask_person` tool) waits for an answer."""

    timeout_seconds: float = Field(
        default=7 * 24 * 3600,
        ge=1,
        le=366 * 24 * 3600,
        description="How long one question may wait (at most a year); then the model is told "
        "nobody answered.",
    )


# A schedule's name: its Temporal schedule id, and the start of its firings' task ids.
SCHEDULE_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,79}$"
SCHEDULE_NAME_CHARS = 80
# The start of every id a schedule derives (its firings', a conversation schedule's task): no
# client may choose one (task_rights.check_task_id), so a schedule reaches only its own tasks.
SCHEDULED_ID_PREFIX = "schedule:"


class ParentLink(Contract):
    """Where a sub-agent's task sits in its tree: the task that called it, the tree's
    root, the chain of agent names from the root, and the call it answers."""

    task_id: str
    root_id: str
    path: list[str] = Field(description="The agents from the root down to this one.")
    depth: int = Field(ge=1)
    call_id: str


class ScheduleLink(Contract):
    """Set on a task a schedule starts: the schedule's name, and for a `conversation`
    schedule's task, the firing that started it (a retried firing finds its own start)."""

    name: str = Field(min_length=1, max_length=SCHEDULE_NAME_CHARS, pattern=SCHEDULE_NAME_PATTERN)
    firing: str | None = Field(default=None, max_length=300)


# A tenant names who a task is for (an API token's name, or `tenant` on the task); Temporal's
# fairness keys are at most 64 bytes.
TENANT_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$"
# A memory namespace: TENANT:AGENT, or AGENT for tasks without a tenant (workflows/memory.py).
MEMORY_NAMESPACE_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}(:[A-Za-z0-9][A-Za-z0-9_.@-]{0,63})?$"


class QuotaNotice(Contract):
    """Signal `quota_notice`, sent by a model call (activities/quota_notices.py) that waits
    for its turn under a model endpoint's quota, and again when it gets it. The loop records
    each as an event (waiting_quota, quota_granted) while it waits for the call."""

    state: Literal["waiting", "granted"]
    step: int
    attempt: int
    quota: str = Field(max_length=300, description="The quota's key: ENDPOINT or ENDPOINT:MODEL.")
    limit: QuotaLimitKind | None = Field(
        default=None, description="With `waiting`: the limit the call waits for."
    )
    expected_seconds: float | None = Field(
        default=None, ge=0, description="With `waiting`: how long the wait should last."
    )
    waited_seconds: float | None = Field(
        default=None, ge=0, description="With `granted`: how long the call waited."
    )


def named_once(agents: list[AgentSpec] | None) -> list[AgentSpec] | None:
    names = [spec.name for spec in agents or []]
    if twice := sorted({name for name in names if names.count(name) > 1}):
        raise ValueError(f"names the sub-agent(s) {', '.join(twice)} more than once")
    return agents


class AgentTask(Contract):
    """Input of one agent task: everything the loop needs, recorded once in history."""

    task: str = Field(min_length=1, max_length=200_000, description="What the agent should do.")
    system_prompt: str = Field(default=DEFAULT_SYSTEM_PROMPT, max_length=200_000)
    model: ModelSettings = Field(default_factory=ModelSettings)
    tools: list[str] | None = Field(
        default=None,
        max_length=200,
        description="Tool names the model may call; None means every registered tool.",
    )
    requires: list[str] | None = Field(
        default=None,
        max_length=500,
        description="The tools and agent__<name> sub-agents a worker must offer to take the "
        "task's model calls: clients fill in the tools it names, or every tool they offer. A "
        "worker that lacks one leaves the call to another (the task shows `waiting_worker`). "
        "None: any worker.",
    )
    max_steps: int = Field(default=20, ge=1, le=100_000, description="Most LLM calls for the task.")
    token_budget: int | None = Field(
        default=None,
        ge=1,
        le=10**12,
        description="Most tokens (in + out, all steps) the task may use.",
    )
    cost_budget: float | None = Field(
        default=None,
        gt=0,
        le=10**9,
        description="Most US dollars the task's tree of agents may spend on priced models; "
        "shared with sub-agents as token_budget is. Needs a price for the task's models.",
    )
    prices: dict[str, ModelPrice] | None = Field(
        default=None,
        max_length=200,
        description="What each model the task may call costs, by the name the task calls it "
        "(`ENDPOINT:MODEL`), resolved from the endpoints' prices when the task is created: "
        "a price changed later never changes a running task. A model without one shows "
        "tokens only.",
    )
    tenant: str | None = Field(
        default=None,
        pattern=TENANT_PATTERN,
        description="Who the task is for: the quota and the workers are shared fairly between "
        "tenants, and a token bound to a tenant sees only its tasks. Sub-agents inherit it.",
    )
    approval: ApprovalSettings = Field(default_factory=ApprovalSettings)
    questions: QuestionSettings = Field(default_factory=QuestionSettings)
    context_limit_tokens: int | None = Field(
        default=None,
        ge=500,
        le=10_000_000,
        description="Estimated tokens the conversation sent to the model may take; past it, "
        "older turns are replaced by a summary the model writes. Default: the model's "
        "context window less room for the answer.",
    )
    continue_as_new_after_steps: int | None = Field(
        default=None,
        ge=1,
        le=100_000,
        description="Start a fresh run (continue-as-new) after this many steps in one run; "
        "the run's history size and Temporal's own suggestion trigger it too.",
    )
    max_repeated_calls: int = Field(
        default=3,
        ge=1,
        le=1000,
        description="Consecutive steps that repeat an identical tool call before the task "
        "ends failed with kind 'stuck' (resumable with a message).",
    )
    mcp_servers: list[str] | None = Field(
        default=None,
        max_length=50,
        description="MCP servers (by name, as workers declare them) whose tools the task may "
        "use. The runtime, CLI and API fill in every server their settings declare when this "
        "is not given; a task started without it uses none.",
    )
    heartbeat_timeout_seconds: float | None = Field(
        default=None,
        ge=1,
        le=600,
        description="Heartbeat timeout of model and tool calls: how soon a dead worker's call "
        "is retried elsewhere. Default 5 s (see docs/performance.md).",
    )
    output_schema: dict[str, Any] | None = Field(
        default=None,
        description="A JSON Schema the answer must fit: the task then ends with data (the "
        "`done` event's `output`), validated, the model told the errors and asked again.",
    )
    output_retries: int = Field(
        default=3,
        ge=0,
        le=50,
        description="Answers that do not fit output_schema the model may give before the "
        "task fails with kind `invalid_output` (resumable with a message).",
    )
    max_agent_depth: int = Field(
        default=3,
        ge=0,
        le=20,
        description="How deep a tree of sub-agents may grow below the root task.",
    )
    max_agent_calls: int = Field(
        default=8,
        ge=1,
        le=100,
        description="Sub-agents one step may call; the model is told about the calls past it.",
    )
    parent: ParentLink | None = Field(
        default=None, description="Set on a sub-agent's task: the task that called it."
    )
    agents: list[AgentSpec] | None = Field(
        default=None,
        max_length=100,
        description="The sub-agents the task may call (`agent__<name>`), and those they may "
        "call in turn within max_agent_depth, resolved from the deployment's definitions "
        "(WAYSTATION_AGENTS) when the task is created: a worker restarted with other "
        "definitions never changes a running task. Only an approver may give its own. None "
        "(a task created before tasks kept them): the definitions of the worker that makes "
        "each model call.",
    )
    memory_namespace: str | None = Field(
        default=None,
        pattern=MEMORY_NAMESPACE_PATTERN,
        description="Where the memory tools remember and recall: `TENANT:AGENT` (or `AGENT` "
        "without a tenant). Resolved when the task starts (TENANT:main for a root task); a "
        "namespace of another tenant is refused.",
    )
    recall: str | None = Field(
        default=None,
        min_length=1,
        max_length=1_000,
        description="Load the items of the task's memory that best match this query into its "
        "system prompt when it starts (the `memory_recalled` event).",
    )
    schedule: ScheduleLink | None = Field(
        default=None,
        description="Set on a task a schedule starts (docs/schedules.md): the schedule's name; "
        "its notices name it.",
    )

    _task_not_blank = field_validator("task")(not_blank)
    _schema_checked = field_validator("output_schema")(schema_problem)
    _agents_named_once = field_validator("agents")(named_once)


class ToolCallRequest(Contract):
    """A tool call as the model asked for it, as sent back to the model in the conversation."""

    id: str
    name: str
    arguments: str


ReasoningProtocol = Literal["responses", "anthropic"]


class ReasoningItem(Contract):
    """A model's reasoning as its provider gave it, to be sent back unchanged on the next
    call of the loop: a Responses `reasoning` item (its encrypted content, as `store=false`
    returns it) or an Anthropic `thinking`/`redacted_thinking` block with its signature.
    Only an endpoint of the same protocol, for the same model, is sent it back."""

    protocol: ReasoningProtocol
    model: str = Field(
        description="The model that reasoned, as the task names it (`anthropic:claude-...`): "
        "a request to another model leaves the item out."
    )
    data: dict[str, Any] = Field(description="The provider's item or block, as it came.")


class ChatMessage(Contract):
    """One message of the conversation in OpenAI chat format, with the reasoning that came
    with an assistant message (sent back to the provider that gave it)."""

    role: Literal["system", "user", "assistant", "tool"]
    content: str | None = None
    tool_calls: list[ToolCallRequest] = Field(default_factory=list)
    tool_call_id: str | None = None
    reasoning: list[ReasoningItem] = Field(default_factory=list)


class Usage(Contract):
    """Tokens of one call or many. `input_tokens` counts every input token, those read from
    or written to the provider's prompt cache included (`cache_read_tokens` and
    `cache_write_tokens` say how many); `reasoning_tokens` are among `output_tokens`."""

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    reasoning_tokens: int = 0
    cost_usd: float | None = Field(
        default=None,
        description="US dollars of the priced calls among these (None: no priced call), "
        "from the prices the task was created with.",
    )
    unpriced_tokens: int = Field(
        default=0, description="Tokens (in + out) of calls of a model the task has no price for."
    )

    @property
    def total(self) -> int:
        return self.input_tokens + self.output_tokens

    def priced(self, price: ModelPrice | None) -> Usage:
        """One call's usage with its cost: at `price`, or (None) its tokens as unpriced."""
        if price is None:
            return self.model_copy(update={"cost_usd": None, "unpriced_tokens": self.total})
        cost = price.cost(
            self.input_tokens, self.output_tokens, self.cache_read_tokens, self.cache_write_tokens
        )
        return self.model_copy(update={"cost_usd": cost, "unpriced_tokens": 0})

    @property
    def cache_hit_ratio(self) -> float | None:
        """The share of input tokens served from the prompt cache (None: no input yet)."""
        return self.cache_read_tokens / self.input_tokens if self.input_tokens else None

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            cache_read_tokens=self.cache_read_tokens + other.cache_read_tokens,
            cache_write_tokens=self.cache_write_tokens + other.cache_write_tokens,
            reasoning_tokens=self.reasoning_tokens + other.reasoning_tokens,
            cost_usd=_sum_costs(self.cost_usd, other.cost_usd),
            unpriced_tokens=self.unpriced_tokens + other.unpriced_tokens,
        )


def _sum_costs(a: float | None, b: float | None) -> float | None:
    """None only when neither side priced a call: a made-up $0 is never shown."""
    if a is None:
        return b
    return a if b is None else a + b


RecordedFailureKind = Annotated[str, AfterValidator(FailureKind.read)]
"""A FailureKind as a run recorded it, read by its current name (`stuck` from the repeat
guard of earlier runs reads as `repeated_calls`); a kind this version does not know stays."""


class FailureDetail(Contract):
    """What a failed task's ApplicationError (type AgentFailed) carries besides its message:
    why it failed, and the tokens its tree used (a sub-agent's caller counts them)."""

    kind: RecordedFailureKind
    usage: Usage | None = None
    last_seq: int | None = None
    """The failed run's last event (a reader checks a sealed run against it)."""

    def as_details(self) -> tuple[Any, ...]:
        """The ApplicationError's details: `ApplicationError(reason, *d.as_details(), ...)`.
        Positional, as every release wrote them, so a parent or client of the release
        before reads a failure of this one during a rolling deploy; `of` is the one reader."""
        if self.last_seq is None:
            return (str(self.kind), self.usage)
        return (str(self.kind), self.usage, self.last_seq)

    @classmethod
    def of(cls, details: Sequence[Any]) -> FailureDetail | None:
        """The detail of a failure's decoded details (as the converter gives them without a
        type hint), in either shape: this model, or the positional (kind, usage) of runs
        recorded before it (and (kind,) before failures carried usage). None when the
        details are neither (another failure, or something an earlier version put there)."""
        if not details:
            return None
        first = details[0]
        if isinstance(first, FailureDetail):
            return first
        if isinstance(first, dict):
            with contextlib.suppress(ValidationError):
                return cls.model_validate(first)
            return None
        if not isinstance(first, str):
            return None
        usage = None
        if len(details) > 1:
            with contextlib.suppress(ValidationError):
                usage = Usage.model_validate(details[1])
        last_seq = details[2] if len(details) > 2 and isinstance(details[2], int) else None
        return cls(kind=first, usage=usage, last_seq=last_seq)


class ToolCall(Contract):
    """A tool call the model made, checked by the LLM activity against the tool registry.

    `problem` is set when the call cannot run as given (unknown tool, arguments that are
    not JSON or fail validation); the workflow then feeds the problem back to the model
    instead of running anything.
    """

    call_id: str
    tool: str
    raw_arguments: str
    arguments: dict[str, Any] | None = None
    problem: str | None = None
    needs_approval: bool = False
    approval_reason: str | None = None
    retry_safe: bool = Field(
        default=True,
        description="A retry cannot do the call's effect twice (idempotent, or guarded by "
        "the idempotency key); otherwise a lost attempt is reported, never repeated.",
    )
    local: bool = Field(
        default=False,
        description="A fast, pure tool: runs as a local activity inside the workflow task, "
        "saving a round trip through the server.",
    )
    agent: AgentSpec | None = Field(
        default=None,
        description="A call of a sub-agent: its definition, as the task holds it (as the "
        "worker had it, for a task that holds none).",
    )

    @property
    def runnable(self) -> bool:
        return self.problem is None and self.arguments is not None


class LlmRequest(Contract):
    """Input of `call_llm`: a reference to the conversation, never the conversation itself.

    The activity rebuilds the conversation from what its worker saw (its previous call for
    the task and the tool results since) when that matches `conversation_digest`, and
    otherwise reads it through the workflow's `llm_context` query and the conversation
    store. Either way each message enters history once, as the result that made it.
    """

    step: int
    message_count: int
    model: ModelSettings
    conversation_digest: str
    catalog_digest: str | None = Field(
        default=None, description="The MCP tools listed for this run, by digest."
    )
    first_attempt: int = Field(
        default=1,
        ge=1,
        description="The attempt number this call's first attempt streams as: past every "
        "attempt of a call of the same step that a message interrupted, so their void text "
        "is told apart.",
    )
    requires: list[str] | None = Field(
        default=None, description="The task's `requires`: what the worker must offer."
    )
    wait_for_capable_worker: bool = Field(
        default=False,
        description="The task waits for a worker that has what it needs: one that lacks it "
        "fails the attempt to be retried; the one that has it makes the call once (its "
        "failure ends the wait, and the call is made again as usual).",
    )
    tenant: str | None = Field(
        default=None,
        description="The task's tenant: whose turn the call takes under its endpoint's quota.",
    )


class SummaryRequest(Contract):
    """Input of `summarize_context`: summarize messages [start, end) of the conversation."""

    step: int
    message_count: int
    start: int
    end: int
    model: ModelSettings
    conversation_digest: str
    tenant: str | None = Field(
        default=None, description="The task's tenant: whose turn the summary takes."
    )


class SummaryResult(Contract):
    summary: str
    usage: Usage = Field(default_factory=Usage)


class ConversationSnapshot(Contract):
    """Input of `save_conversation`: put the conversation's messages in the store, reading
    them from this run, or from a source run (a fork's origin)."""

    step: int
    message_count: int
    conversation_digest: str
    source_workflow_id: str | None = None
    source_run_id: str | None = None


class LlmResult(Contract):
    """The assistant's message for one step, assembled from the stream."""

    worker: str | None = Field(
        default=None, description="Who made a call that waited for a capable worker."
    )
    content: str = ""
    tool_calls: list[ToolCall] = Field(default_factory=list)
    usage: Usage = Field(default_factory=Usage)
    finish_reason: str | None = None
    model: str = ""
    attempt: int = 1
    calls_from_text: bool = Field(
        default=False, description="The tool calls were recovered from the model's text."
    )
    stale_servers: list[str] = Field(
        default_factory=list,
        description="MCP servers whose tools changed since they were listed: list again.",
    )
    output: Any | None = Field(
        default=None, description="With native structured output: the answer, validated."
    )
    output_problem: str | None = Field(
        default=None,
        description="A final answer that does not fit the task's output schema: why.",
    )
    reasoning: list[ReasoningItem] = Field(
        default_factory=list, description="The reasoning that came with the message."
    )


class ToolRequest(Contract):
    """Input of `run_tool`."""

    call_id: str
    tool: str
    arguments: dict[str, Any]
    idempotency_key: str = Field(description="workflow_id/step/call_id, stable across retries.")
    memory_namespace: str | None = Field(
        default=None, description="The task's memory namespace: set for the memory tools only."
    )


class ToolResult(Contract):
    output: str
    is_error: bool = False
    stale_servers: list[str] = Field(
        default_factory=list,
        description="The MCP server called announced that its tools changed: list it again.",
    )
    usage: Usage | None = Field(
        default=None, description="A sub-agent's: the tokens its whole tree used."
    )
    agent_status: TerminalStatus | None = Field(
        default=None, description="A sub-agent's: how its task ended."
    )


def idempotency_key(task_id: str, step: int, call_id: str) -> str:
    """The key of one tool call, the same on every retry: `workflow_id/step/call_id`."""
    return f"{task_id}/{step}/{call_id}"


class Decision(Contract):
    """A person's answer to one approval request (Update `decide`, Signals `approve`/`reject`)."""

    request_id: str = Field(min_length=1, max_length=200)
    decision: Decider = "approve"
    arguments: dict[str, Any] | None = Field(
        default=None, description="Edited arguments to run instead of the model's."
    )
    message: str | None = Field(
        default=None, max_length=10_000, description="Told to the model with the outcome."
    )
    approver: str | None = Field(default=None, max_length=200)
    decision_id: str | None = Field(
        default=None,
        max_length=100,
        description="Set by a client that waits for the outcome: it tells its own decision "
        "from a concurrent identical one.",
    )
    shown: str | None = Field(
        default=None,
        max_length=64,
        description="The `digest` of the request as the person was shown it: the decision "
        "is refused if the request is for any other call.",
    )

    _arguments_not_too_deep = field_validator("arguments")(not_too_deep)

    def repeats(self, outcome: DecisionOutcome) -> bool:
        """Whether this decision is a repeat of `outcome` (else it conflicts with it)."""
        return self.decision == outcome.decision and (
            self.arguments is None or self.arguments == outcome.arguments
        )


class Resumption(Contract):
    """Signal `resume_after_failure`, sent with a reset: raise limits and say what failed."""

    failure: str | None = None
    failure_kind: RecordedFailureKind | None = None
    max_steps: int | None = Field(default=None, ge=1, le=100_000)
    token_budget: int | None = Field(default=None, ge=1, le=10**12)
    cost_budget: float | None = Field(default=None, gt=0, le=10**9)
    message: str | None = Field(
        default=None,
        min_length=1,
        max_length=100_000,
        description="A user message added to the conversation before going on.",
    )


class RepairNote(Contract):
    """Signal `repaired`, sent right after a repair reset: what was wrong, what was done."""

    problem: str = Field(max_length=10_000)
    reset_to_event: int
    by: str = Field(max_length=200)


class DecisionOutcome(Contract):
    """What `decide` returns: the decision that took effect for the request."""

    request_id: str
    decision: Literal["approve", "reject", "timeout"]
    approver: str | None = None
    message: str | None = None
    arguments: dict[str, Any] | None = None
    decision_id: str | None = None
    duplicate: bool = Field(default=False, description="True when an earlier call decided it.")
    shown: str | None = Field(
        default=None,
        description="The digest of the call the decision is for, as its request showed it.",
    )


TASK_TEXT_CHARS = 200_000
# A message's bytes as Temporal carries it (JSON, where a character takes up to 6 bytes):
# beside the task's text it stays far below the 2 MB of one payload (a run's input). Checked
# by workflows/messages.py, not by the model: recorded messages must always load.
MESSAGE_BYTES = 512_000
MESSAGE_ID_PATTERN = r"^[A-Za-z0-9_.:/-]+$"


class Message(Contract):
    """A person's message to a task (Update `send_message`, Signal `message`): a follow-up
    once it has answered, or a steer while it works. Each reaches the model once, in the
    order the task received them, at its next model call."""

    content: str = Field(min_length=1, max_length=TASK_TEXT_CHARS)
    message_id: str | None = Field(
        default=None,
        min_length=1,
        max_length=100,
        pattern=MESSAGE_ID_PATTERN,
        description="Makes a repeat of the same message (a retried send) count once; clients "
        "set one; a Temporal CLI user may leave it out.",
    )
    interrupt: bool = Field(
        default=False,
        description="Cancel the model call in flight (its streamed text is void) and start the "
        "step again with this message. A tool call in flight is never interrupted.",
    )
    max_steps: int | None = Field(
        default=None, ge=1, le=100_000, description="The max_steps of the turn from now on."
    )
    sender: str | None = Field(default=None, max_length=200)

    _content_not_blank = field_validator("content")(not_blank)


class MessageReceipt(Contract):
    """What `send_message` answers: the message's id, and whether it was already there."""

    message_id: str
    duplicate: bool = Field(default=False, description="An earlier send delivered it.")


ANSWER_CHARS = 10_000


class Answer(Contract):
    """A person's answer to a question the model asked (Update and Signal `answer`)."""

    request_id: str = Field(min_length=1, max_length=200)
    answer: str = Field(
        min_length=1,
        max_length=ANSWER_CHARS,
        description="The text, or one of the question's choices when it offers some.",
    )
    answerer: str | None = Field(default=None, max_length=200)
    answer_id: str | None = Field(
        default=None,
        max_length=100,
        description="Set by a client that waits for the outcome: it tells its own answer from "
        "a concurrent one.",
    )

    _answer_not_blank = field_validator("answer")(not_blank)


class AnswerOutcome(Contract):
    """The answer that took effect for a question (the first one), or its timeout."""

    request_id: str
    answer: str | None = Field(default=None, description="None when nobody answered in time.")
    answerer: str | None = None
    timed_out: bool = False
    answer_id: str | None = None
    duplicate: bool = Field(default=False, description="True when an earlier call answered it.")
