"""`burnout serve`: a run's model behind the OpenAI API, for the tools people already point at one."""
