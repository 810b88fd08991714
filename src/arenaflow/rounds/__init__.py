"""Rounds: the pre-registered bar, nomination, continual rounds and the round's report page."""
