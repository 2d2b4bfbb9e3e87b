"""Textual widgets of the tuner UI. They draw what they are given; none of them reaches a backend."""
