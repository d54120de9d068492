"""`python -m tests.rollout.v1_worker`: version 1, today's workflow code, as a versioned worker."""

from tests.rollout.serving import serve
from waystation.workflows.agent import AgentWorkflow

if __name__ == "__main__":
    serve(AgentWorkflow)
