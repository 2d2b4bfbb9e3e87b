"""The six screens of the tuner UI (keys 1-6) and its dialogs."""
