"""`python -m tests.rollout.v1_1_worker`: version 1.1, version 1 plus a patched change."""

from tests.rollout.code import AgentWorkflowV1_1
from tests.rollout.serving import serve

if __name__ == "__main__":
    serve(AgentWorkflowV1_1)
