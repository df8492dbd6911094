"""Playground stage: the Gradio "Try it yourself" app over trained runs."""
