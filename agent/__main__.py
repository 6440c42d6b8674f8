"""`python -m agent`: the same command line as `tt-agent`."""

from agent.cli import main

if __name__ == "__main__":
    main()
