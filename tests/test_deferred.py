"""Before MLflow is imported, `create_agent` returns an agent that imports MLflow only when MLflow's side of it
is used (`agent.deferred`); with MLflow imported, the `LangGraphResponsesAgent` itself."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from agent import Agent
from agent.deferred import DeferredResponsesAgent
from agent.factory import build_agent


def run_python(code: str, cwd) -> list[str]:
    """Run `code` in a new interpreter with no AGENT_*/MLFLOW_* settings; its stdout lines."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENT_", "MLFLOW_", "OPENAI_"))}
    result = subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout.splitlines()


@pytest.fixture
def deferred_agent():
    """The agent `create_agent` returns in a process that has not imported MLflow (this one has)."""
    with build_agent(DeferredResponsesAgent, "memory://", model="offline", tracing=False) as agent:
        yield agent


def test_an_agent_used_through_its_python_methods_never_imports_mlflow(tmp_path):
    lines = run_python(
        "import sys\n"
        "from agent import create_agent\n"
        f"with create_agent('sqlite:///{tmp_path / 'a.sqlite'}', model='offline') as agent:\n"
        "    print(type(agent).__name__)\n"
        "    print(agent.list_threads(), agent.list_memories(user_id='u'), repr(agent)[:1] == '<')\n"
        "    print(getattr(agent, '_repr_html_', None), getattr(agent, '__wrapped__', None))\n"
        "    print(isinstance(agent, (dict, str)), type(agent).__name__)\n"
        "print('mlflow' in sys.modules)\n",
        tmp_path,
    )
    assert lines == ["DeferredResponsesAgent", "[] [] True", "None None", "False DeferredResponsesAgent", "False"]


def test_isinstance_and_set_model_take_it_for_a_responses_agent_from_the_first_check(tmp_path):
    lines = run_python(
        "import sys\n"
        "from agent import create_agent\n"
        "agent = create_agent('memory://', model='offline', tracing=False)\n"
        "print('mlflow' in sys.modules)\n"
        "import mlflow\n"
        "from mlflow.pyfunc import PythonModel, ResponsesAgent\n"
        "from agent import LangGraphResponsesAgent\n"
        # PythonModel is a plain class, ResponsesAgent an ABC: CPython checks them differently.
        "print(isinstance(agent, PythonModel), isinstance(agent, ResponsesAgent), isinstance(agent, LangGraphResponsesAgent))\n"
        "mlflow.models.set_model(agent)\n"  # refuses anything that is not a PythonModel nor callable
        "print(mlflow.models.model.__mlflow_model__ is agent, type(agent).__name__)\n"
        "agent.predict({'input': [{'role': 'user', 'content': 'hi'}]})\n"
        "print(type(agent).__name__, issubclass(type(agent), PythonModel))\n"
        "agent.close()\n",
        tmp_path,
    )
    assert lines == ["False", "True True True", "True DeferredResponsesAgent", "LangGraphResponsesAgent True"]


@pytest.mark.parametrize("tracing", ["off", "default"])
def test_tracing_off_holds_for_a_turn_that_imports_mlflow_after_create_agent(tmp_path, tracing):
    # MLflow starts with tracing on when imported; create_agent switched it off before there was an MLflow.
    lines = run_python(
        "import sys\n"
        "from agent import create_agent\n"
        f"with create_agent('memory://', model='offline'{', tracing=False' if tracing == 'off' else ''}) as agent:\n"
        "    print('mlflow' in sys.modules)\n"
        "    agent.predict({'input': [{'role': 'user', 'content': 'hi'}]})\n"
        "    from mlflow.tracing.provider import is_tracing_enabled\n"
        "    print(is_tracing_enabled())\n",
        tmp_path,
    )
    assert lines == ["False", "False"]
    assert sorted(p.name for p in tmp_path.rglob("*")) == []  # no mlflow.db, mlruns/ nor .agent/


def test_tracing_off_holds_when_several_threads_make_the_first_turns_at_once(tmp_path):
    # Found by a new user: a thread that became the ResponsesAgent while another was switching MLflow's tracing
    # off could start a span first, and tracing then stayed on for the process.
    lines = run_python(
        "import threading\n"
        "from agent import create_agent\n"
        "agent = create_agent('memory://', model='offline', tracing=False)\n"
        "start = threading.Barrier(6)\n"
        "def turn(i):\n"
        "    start.wait()\n"
        "    agent.predict({'input': [{'role': 'user', 'content': f'hi {i}'}]})\n"
        "threads = [threading.Thread(target=turn, args=(i,)) for i in range(6)]\n"
        "[t.start() for t in threads]; [t.join() for t in threads]\n"
        "agent.predict({'input': [{'role': 'user', 'content': 'later'}]})\n"
        "from mlflow.tracing.provider import is_tracing_enabled\n"
        "print(is_tracing_enabled())\n"
        "agent.close()\n",
        tmp_path,
    )
    assert lines == ["False"]
    assert sorted(p.name for p in tmp_path.rglob("*")) == []


def test_with_mlflow_imported_create_agent_builds_the_responses_agent_at_once():
    import mlflow  # noqa: F401  # what a models-from-code file imports first

    from agent import LangGraphResponsesAgent, create_agent

    with create_agent("memory://", model="offline", tracing=False) as agent:
        assert type(agent) is LangGraphResponsesAgent


def test_predict_on_a_deferred_agent_answers_and_keeps_the_instance_state(deferred_agent):
    agent = deferred_agent
    assert agent.list_threads() == []  # a plain Agent method, before MLflow
    context = agent.operation_context
    out = agent.predict({"input": [{"role": "user", "content": "I'm headed to SF!"}]})
    from agent.responses import LangGraphResponsesAgent

    assert type(agent) is LangGraphResponsesAgent
    assert agent.operation_context is context
    assert "SF" in out.output[0].content[0]["text"]
    assert [t["thread_id"] for t in agent.list_threads()] == [out.custom_outputs["thread_id"]]


@pytest.mark.parametrize("name", ["apredict", "apredict_stream", "predict_stream", "load_context"])
def test_each_responses_agent_member_is_reachable_on_a_deferred_agent(deferred_agent, name):
    assert callable(getattr(deferred_agent, name))
    assert isinstance(deferred_agent, Agent)


def test_a_name_neither_class_has_is_still_an_attribute_error(deferred_agent):
    with pytest.raises(AttributeError, match="get_checkpoint_histroy"):
        deferred_agent.get_checkpoint_histroy  # noqa: B018
