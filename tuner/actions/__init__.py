"""The one headless place that decides what may be done to a card: every front end (CLI, TUI) asks it.

No textual, no torch."""
