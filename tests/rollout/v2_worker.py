"""`python -m tests.rollout.v2_worker`: version 2, incompatible with version 1's histories."""

from tests.rollout.code import AgentWorkflowV2
from tests.rollout.serving import serve

if __name__ == "__main__":
    serve(AgentWorkflowV2)
