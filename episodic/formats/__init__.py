"""Every conversion between episodic's models and a provider's wire format, one module each.

- :mod:`episodic.formats.openai_chat`: OpenAI chat-completions message dicts, both ways.
- :mod:`episodic.formats.responses`: OpenAI Responses-API input items, both ways.
- :mod:`episodic.formats.anthropic`: the Anthropic Messages API's ``messages`` list.
- :mod:`episodic.formats.cliver`: cliver-core's ``CLIverMessage`` objects.
- :mod:`episodic.formats.adk`: Google ADK events (their JSON), to the log's messages and back.
- :mod:`episodic.formats.langchain`: LangChain messages (their dicts), to the log's messages
  and back.
- :mod:`episodic.formats.pydantic_ai`: Pydantic AI's model messages (their JSON), to the
  log's messages and back.
- :mod:`episodic.formats.claude_code`: Claude Code's transcript lines as the log keeps them,
  and its own compactions among them.

The modules build plain dicts and import no provider SDK: a caller validates against its own
SDK if it wants to. They depend on :mod:`episodic.models` only; the models' ``to_*`` and
``from_*`` methods and ``Context``'s are the public way in, and delegate here.
"""
