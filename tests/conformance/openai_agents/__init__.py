"""The OpenAI Agents SDK's runtime tests, with its in-memory session replaced by ours."""
