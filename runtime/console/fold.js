// The events of a task folded into what its page shows: status, step, turn, usage, limits,
// pending approvals and the outcome (what `fold` in workflows/events.py keeps of them).

/** The client-side fold of the events: what the header and controls show. */
export class TaskFold {
  constructor() {
    this.status = "pending";
    this.step = 0;
    this.turn = 0; // 0 is the task's own, then one per follow-up
    this.turnFirstStep = 0; // the step count when the turn began (max_steps is per turn)
    this.usage = { input: 0, output: 0 };
    this.task = null;
    this.maxSteps = null;
    this.tokenBudget = null;
    this.pending = new Map();
    this.result = null;
    this.resultSeq = null; // the `done` event of the latest answer
    this.failure = null;
    this.failureKind = null;
  }

  apply(e) {
    this.step = Math.max(this.step, e.step);
    switch (e.type) {
      case "task_started":
        this.status = "running";
        this.task = e.task;
        this.maxSteps = e.task.max_steps;
        this.tokenBudget = e.task.token_budget;
        break;
      case "thought":
      case "context_compacted":
        this.usage.input += e.usage?.input_tokens ?? 0;
        this.usage.output += e.usage?.output_tokens ?? 0;
        break;
      case "approval_requested":
        this.pending.set(e.request_id, { ...e, requested_at: e.at });
        this.status = "waiting_approval";
        break;
      case "approval_resolved":
        this.pending.delete(e.request_id);
        this.status = this.pending.size ? "waiting_approval" : "running";
        break;
      case "resumed":
        this.status = "running";
        this.failure = this.failureKind = this.result = this.resultSeq = null;
        this.maxSteps = e.max_steps ?? this.maxSteps;
        this.tokenBudget = e.token_budget ?? this.tokenBudget;
        break;
      case "user_message":
        this.status = "running";
        this.result = this.resultSeq = null;
        if (e.turn > this.turn) {
          this.turn = e.turn;
          this.turnFirstStep = this.step;
        }
        this.maxSteps = e.max_steps ?? this.maxSteps;
        break;
      case "done":
        this.status = "done";
        this.result = e.result;
        this.resultSeq = e.seq;
        break;
      case "failed":
        this.status = "failed";
        this.failure = e.reason;
        this.failureKind = e.kind;
        break;
      case "cancelled":
        this.status = "cancelled";
        this.pending.clear();
        this.failure = e.reason;
        break;
      default:
    }
  }
}
