"""Report stage: the run report (HTML + Markdown, plots) and multi-run overlays."""
