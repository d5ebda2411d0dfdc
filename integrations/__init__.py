"""Reference integrations of resilience: real services that use every policy together.

Nothing here is part of the library's public API; see :mod:`integrations.summarizer`.
"""
