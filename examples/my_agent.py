"""Your agent, as an MLflow models-from-code file: copy it, then edit the model, tools and instructions.

Run it:

    tt-agent chat --agent examples/my_agent.py          # talk to it in a terminal
    tt-agent serve --agent examples/my_agent.py         # the HTTP server (/responses, /invocations, ...)
    python scripts/log_model.py --agent examples/my_agent.py   # log it as an MLflow model

`mlflow models serve -m <the logged model's URI>` then serves this same file. Where the
conversations are kept and which chat model answers come from the environment of the process
that loads it (`AGENT_DATABASE_URL`, `AGENT_MODEL`, `OPENAI_API_KEY`, ...), so the same file
runs on a laptop (the embedded SQLite file, the offline model) and behind a serving endpoint.

`connect=False`: MLflow also runs this file when it *logs* the model, on a machine that may
not reach your database; the connection is made on the first request (or by `tt-agent serve`
before it listens).
"""

import mlflow

from agent import create_agent


def get_weather(city: str) -> str:
    """The weather forecast for a city, in one sentence."""
    return f"It is sunny and 21 °C in {city}."


def convert_currency(amount: float, from_currency: str, to_currency: str) -> str:
    """Convert an amount of money between two currencies (ISO codes such as USD or EUR)."""
    rates = {"USD": 1.0, "EUR": 0.92, "GBP": 0.79, "JPY": 151.0}
    if from_currency not in rates or to_currency not in rates:
        return f"error: I know only {', '.join(sorted(rates))}"
    return f"{amount * rates[to_currency] / rates[from_currency]:.2f} {to_currency}"


agent = create_agent(
    tools=[get_weather, convert_currency],
    instructions="You are a travel assistant. Answer briefly, and use your tools for weather and money.",
    connect=False,
)
mlflow.models.set_model(agent)
