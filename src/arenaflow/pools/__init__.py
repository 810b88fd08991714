"""Prompt pools: synthetic or imported prompts with gold answers or constraints."""
