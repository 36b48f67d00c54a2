"""Sessions for agent frameworks, one module per framework, each an optional extra."""
