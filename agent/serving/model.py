"""Models-from-code entry point: MLflow runs this file to build the model it logs, loads and serves.

    mlflow.pyfunc.log_model(name="agent", python_model="agent/serving/model.py", ...)

(`agent.serving.log_model()` and `scripts/log_model.py` do that.)

The agent is configured by the environment of the process that loads it:
`AGENT_DATABASE_URL` (unset: the embedded `sqlite:///.agent/checkpoints.sqlite`),
`AGENT_MODEL`, `OPENAI_API_KEY` / `OPENAI_BASE_URL`, and the other `AGENT_*`
settings. It is built with `connect=False`: MLflow also runs this file when it
*logs* the model, on a machine that may not reach the production database, so
the connection and table setup wait for the first request.
"""

import mlflow

from agent import create_agent

AGENT = create_agent(connect=False)
mlflow.models.set_model(AGENT)
