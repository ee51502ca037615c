"""The `gptlab` command: one module per verb. Parses, builds what is asked, dispatches; holds no logic."""
