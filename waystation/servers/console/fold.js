// The events of a task folded into what its page shows: status, step, turn, usage, limits,
// pending approvals and questions, sub-agents, and the outcome (what `fold` in
// workflows/events.py keeps of them).

const AGENT_TOOL_PREFIX = "agent__"; // a sub-agent's tool name (workflows/models.py)

/** Whom a running task waits for: an approver first, then whoever answers questions
 * (workflows/events.py `waiting_status`). */
function waitingStatus(approvals, questions) {
  if (approvals.size) return "waiting_approval";
  return questions.size ? "waiting_input" : "running";
}

/** The client-side fold of the events: what the header and controls show. */
export class TaskFold {
  constructor() {
    this.status = "pending";
    this.step = 0;
    this.turn = 0; // 0 is the task's own, then one per follow-up
    this.turnFirstStep = 0; // the step count when the turn began (max_steps is per turn)
    // cost: US dollars of the priced calls (null: none priced, never a made-up $0).
    this.usage = { input: 0, output: 0, cacheRead: 0, cacheWrite: 0, reasoning: 0, cost: null, unpriced: 0 };
    this.model = null; // the model the current turn calls (a fallback may have switched it)
    this.task = null;
    this.maxSteps = null;
    this.tokenBudget = null;
    this.costBudget = null;
    this.pending = new Map();
    this.questions = new Map(); // request id -> the pending question, with its event's seq
    this.answers = new Map(); // request id -> its question_answered event
    this.children = new Map(); // call id -> {agent, taskId, instruction, step, order, status}
    this.calls = new Map(); // call id -> {task, order}: a sub-agent call, in the order made
    this.result = null;
    this.output = null; // the latest answer's data, with an output schema
    this.resultSeq = null; // the `done` event of the latest answer
    this.failure = null;
    this.failureKind = null;
    this.missing = []; // with status waiting_worker: what the worker that took it lacked
    this.quotaWait = null; // with status waiting_quota: {quota, limit, expected_seconds, attempt, since}
  }

  apply(e) {
    this.step = Math.max(this.step, e.step);
    if (this.quotaWait && e.type !== "waiting_quota") {
      // Whatever comes after a wait for the quota ends it (the loop says quota_granted first).
      this.quotaWait = null;
      if (this.status === "waiting_quota") this.status = "running";
    }
    switch (e.type) {
      case "task_started":
        this.status = "running";
        this.task = e.task;
        this.maxSteps = e.task.max_steps;
        this.tokenBudget = e.task.token_budget;
        this.costBudget = e.task.cost_budget ?? null;
        this.model = e.task.model.name;
        break;
      case "thought":
      case "context_compacted":
        this.countUsage(e.usage);
        break;
      case "action":
        if (e.tool.startsWith(AGENT_TOOL_PREFIX)) {
          const task = typeof e.arguments?.task === "string" ? e.arguments.task : "";
          this.calls.set(e.call_id, { task, order: this.calls.size });
        }
        break;
      case "agent_started": {
        // Children start in any order (each once Temporal has started it); the tree lists
        // them in the order of their calls.
        const call = this.calls.get(e.call_id);
        this.children.set(e.call_id, {
          agent: e.agent, taskId: e.child_id, instruction: call?.task ?? "",
          step: e.step, order: call?.order ?? this.calls.size, status: "running",
        });
        break;
      }
      case "observation": {
        this.countUsage(e.usage); // a sub-agent's answer: the tokens its tree used
        const child = this.children.get(e.call_id);
        if (child && e.agent_status) child.status = e.agent_status;
        break;
      }
      case "approval_requested":
        this.pending.set(e.request_id, { ...e, requested_at: e.at });
        this.status = waitingStatus(this.pending, this.questions);
        break;
      case "approval_resolved":
        this.pending.delete(e.request_id);
        this.status = waitingStatus(this.pending, this.questions);
        break;
      case "question_asked":
        this.questions.set(e.request_id, { ...e, requested_at: e.at });
        this.status = waitingStatus(this.pending, this.questions);
        break;
      case "question_answered":
        this.questions.delete(e.request_id);
        this.answers.set(e.request_id, e);
        this.status = waitingStatus(this.pending, this.questions);
        break;
      case "resumed":
        this.status = "running";
        this.failure = this.failureKind = this.result = this.resultSeq = this.output = null;
        this.maxSteps = e.max_steps ?? this.maxSteps;
        this.tokenBudget = e.token_budget ?? this.tokenBudget;
        this.costBudget = e.cost_budget ?? this.costBudget;
        this.model = this.task?.model.name ?? this.model; // a resume tries the first model again
        break;
      case "user_message":
        this.status = "running";
        this.result = this.resultSeq = this.output = null;
        if (e.turn > this.turn) {
          this.turn = e.turn;
          this.turnFirstStep = this.step;
          this.model = this.task?.model.name ?? this.model; // a new turn starts at the first model
        }
        this.maxSteps = e.max_steps ?? this.maxSteps;
        break;
      case "done":
        this.status = "done";
        this.result = e.result;
        this.resultSeq = e.seq;
        this.output = e.output ?? null;
        break;
      case "failed":
        this.status = "failed";
        this.failure = e.reason;
        this.failureKind = e.kind;
        break;
      case "waiting_worker":
        this.status = "waiting_worker";
        this.missing = e.missing;
        break;
      case "worker_found":
        this.status = "running";
        this.missing = [];
        break;
      case "waiting_quota": {
        // Told to wait for another limit, the same attempt still waits since it first did.
        const same = this.quotaWait && this.quotaWait.attempt === e.attempt && this.quotaWait.step === e.step;
        this.status = "waiting_quota";
        this.missing = [];
        this.quotaWait = {
          quota: e.quota, limit: e.limit, expected_seconds: e.expected_seconds,
          step: e.step, attempt: e.attempt, since: same ? this.quotaWait.since : e.at,
        };
        break;
      }
      case "model_switched":
        this.model = e.to_model;
        break;
      case "cancelled":
        this.status = "cancelled";
        this.pending.clear();
        this.questions.clear();
        this.failure = e.reason;
        break;
      default:
    }
  }

  countUsage(usage) {
    this.usage.input += usage?.input_tokens ?? 0;
    this.usage.output += usage?.output_tokens ?? 0;
    this.usage.cacheRead += usage?.cache_read_tokens ?? 0;
    this.usage.cacheWrite += usage?.cache_write_tokens ?? 0;
    this.usage.reasoning += usage?.reasoning_tokens ?? 0;
    this.usage.unpriced += usage?.unpriced_tokens ?? 0;
    if (usage?.cost_usd != null) this.usage.cost = (this.usage.cost ?? 0) + usage.cost_usd;
  }

  /** The deadline of a pending question, from the task's question timeout. */
  deadline(question) {
    const seconds = this.task?.questions?.timeout_seconds;
    return seconds ? new Date(Date.parse(question.at) + seconds * 1000).toISOString() : null;
  }
}
