"""The Textual UI around the headless core: the App (composition root), its long jobs and the state screens
render."""
